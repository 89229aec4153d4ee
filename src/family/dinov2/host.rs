//! DINOv2's host inputs of one call of a bucket (see [`crate::host`]
//! for what all families share); its tensors in the ANE layout are in
//! [`super::layout`].
//!
//! A DINOv2 bucket is a square resolution: every image is resized and
//! cropped to it, so a call is one image of exactly `N = (side / P)^2`
//! patches; the sequence is the class token, the `R` register tokens, then
//! the patches, with no padding and no mask. The inputs:
//! * `patches [1, 3*P*P, 1, N]`: the image's patch rows in raster order, (c, py, px);
//! * `positions [1, D, 1, 1 + N]`: the position rows of the class token and
//!   the patches, the checkpoint's table (`pos_table` in `host.safetensors`)
//!   resampled by the host to the bucket's grid as the manifest's
//!   `host.pos_interpolation` says (PyTorch's bicubic, with antialiasing for
//!   the registers variant), the same for every call of a bucket.

use crate::family::dinov2::Dinov2VisionConfig;
use crate::host::FixedEncoder;

/// The host side of a bucket: one image, the position rows of its grid
/// resampled from the checkpoint's table as transformers'
/// `interpolate_pos_encoding` does.
pub fn host(c: &Dinov2VisionConfig) -> FixedEncoder {
    FixedEncoder {
        family: "DINOv2",
        patch: c.patch_size,
        grid: c.grid(),
        hidden: c.hidden_size,
        lead: 1,
        extra: c.tokens(0),
        tensor: "embeddings.position_embeddings",
        stored: vec![1, c.positions(), c.hidden_size],
        antialias: c.interpolate_antialias,
    }
}
