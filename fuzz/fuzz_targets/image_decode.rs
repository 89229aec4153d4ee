//! Image decoding and preprocessing on arbitrary bytes, with a small pixel
//! limit so that the fuzzer explores headers rather than huge allocations.
#![no_main]
use ane_export::preprocess::{DecodeLimits, ImageProcessorConfig, decode_rgb, preprocess_rgb};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits { max_pixels: 1 << 16 };
    if let Ok(img) = decode_rgb(data, std::path::Path::new("fuzz"), limits) {
        let mut cfg = ImageProcessorConfig::qwen2_vl_processor((16, 2, 2), (65_536, 16_777_216), [0.5; 3], [0.5; 3]);
        cfg.min_pixels = 1024;
        cfg.max_pixels = 1 << 16;
        let _ = preprocess_rgb(img, &cfg);
    }
});
