//! CLIP's host inputs of one call of a bucket (see [`crate::host`]
//! for what all families share); its tensors in the ANE layout are in
//! [`super::layout`].
//!
//! A CLIP bucket is a square resolution: every image is resized and cropped
//! to it, so a call is one image of exactly `N = (side / P)^2` patches and
//! the sequence `N + 1` tokens (the class token first) has no padding and
//! needs no mask. The inputs:
//! * `patches [1, 3*P*P, 1, N]`: the image's patch rows in raster order, (c, py, px);
//! * `positions [1, D, 1, N + 1]`: the position rows of the class token and
//!   the patches: the checkpoint's table (`pos_table` in `host.safetensors`)
//!   itself at the checkpoint's `image_size`, resampled by the host for
//!   other sides as transformers' `interpolate_pos_encoding` does (bicubic,
//!   no antialiasing), the same for every call of a bucket.

use crate::family::clip::ClipVisionConfig;
use crate::host::FixedEncoder;

/// The host side of a bucket: one image, the position rows of its grid
/// resampled from the checkpoint's table as transformers'
/// `interpolate_pos_encoding` does.
pub fn host(c: &ClipVisionConfig) -> FixedEncoder {
    FixedEncoder {
        family: "CLIP",
        patch: c.patch_size,
        grid: c.grid(),
        hidden: c.hidden_size,
        lead: 1,
        extra: 1,
        tensor: "embeddings.position_embedding.weight",
        stored: vec![c.positions(), c.hidden_size],
        antialias: false,
    }
}
