//! An artifact's `manifest.json` on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = ane_export::artifact::Artifact::parse(std::path::Path::new("art"), data) {
        let _ = a.acceptance();
        let _ = a.digest();
        if let Some(b) = a.buckets.first() {
            let _ = a.package_path(b);
        }
    }
});
