//! SigLIP's host inputs of one call of a bucket (see [`crate::host`]
//! for what all families share); its tensors in the ANE layout are in
//! [`super::layout`].
//!
//! A SigLIP bucket is a square resolution: every image is resized to it, so
//! a call is one image of exactly `N = (side / P)^2` patches with no padding
//! and no mask (no class token). The inputs:
//! * `patches [1, 3*P*P, 1, N]`: the image's patch rows in raster order, (c, py, px);
//! * `positions [1, D, 1, N]`: the checkpoint's position table
//!   (`pos_table` in `host.safetensors`) itself at the checkpoint's
//!   `image_size`, resampled by the host for other sides as transformers'
//!   `interpolate_pos_encoding` does (bicubic, no antialiasing).

use crate::family::siglip::SiglipVisionConfig;
use crate::host::FixedEncoder;

/// The host side of a bucket: one image, the position rows of its grid
/// resampled from the checkpoint's table as transformers'
/// `interpolate_pos_encoding` does.
pub fn host(c: &SiglipVisionConfig) -> FixedEncoder {
    FixedEncoder {
        family: "SigLIP",
        patch: c.patch_size,
        grid: c.grid(),
        hidden: c.hidden_size,
        lead: 0,
        extra: 0,
        tensor: "embeddings.position_embedding.weight",
        stored: vec![c.positions(), c.hidden_size],
        antialias: false,
    }
}
