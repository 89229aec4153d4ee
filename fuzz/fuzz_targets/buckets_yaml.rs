//! `buckets.yaml` parsing and validation on arbitrary text.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(f) = ane_export::buckets::BucketsFile::parse(text) {
            let _ = f.select(&["b1024".to_string()]);
        }
    }
});
