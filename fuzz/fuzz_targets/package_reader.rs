//! The .mlpackage reader's pure parsers on arbitrary bytes: Manifest.json,
//! the model protobuf, and the weight file (header and every blob record a
//! program could point at). None may panic or allocate without bound.
#![no_main]
use ane_export::mlpackage::{blob, parse_manifest, program};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    match sel % 3 {
        0 => {
            let _ = parse_manifest(rest);
        }
        1 => {
            let _ = program::parse_model(rest);
        }
        _ => {
            if blob::parse_header(rest).is_ok() {
                for off in (64..rest.len() as u64).step_by(64).take(64) {
                    if let Ok(b) = blob::blob_at(rest, off) {
                        let _ = b.elements();
                    }
                }
            }
        }
    }
});
