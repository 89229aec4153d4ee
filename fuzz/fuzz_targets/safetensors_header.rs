//! The checkpoint header reader on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ane_export::checkpoint::safetensors::parse_header(data);
});
