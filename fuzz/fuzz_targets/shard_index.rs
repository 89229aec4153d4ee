//! The shard index (`model.safetensors.index.json`) on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = ane_export::checkpoint::shard_names(std::path::Path::new("index.json"), &v);
    }
});
