//! Qwen2.5-VL's host inputs of one call of a bucket (see [`crate::host`]
//! for what all families share); its tensors in the ANE layout are in
//! [`super::layout`].
//!
//! Window attention with static shapes: the host lays every window out in
//! `S = (window_size / patch_size)^2` slots (64 for the released configs),
//! its real merge units first (raster order within the window), the rest
//! pad. Windows follow each other in raster order, frame after frame, and
//! every block sees the sequence in this order: a windowed block reshapes it
//! to `[N / S, S]` and attends within each window (a batched matmul of
//! `S x S` scores, never `N x N`), a full-attention block attends over all
//! real slots of its frame through the `N x N` mask. A bucket's capacity is
//! therefore counted in slots: an image needs `S` slots per window, edge
//! windows included, not one per patch.
//!
//! Inputs for a bucket of N slots:
//! * `patches [1, 3*P*P, 1, N]`: one temporal frame of each patch, (c, py, px);
//! * `cos`, `sin [1, hd, 1, N]`: rotary tables `[row freqs, col freqs]` twice;
//! * `mask [1, N, N]`: 0 where query and key are real slots of the same
//!   frame of the same image, -1e4 elsewhere;
//! * `window_mask [N/S, S, S]`: 0 where query and key are real slots of the
//!   window, -1e4 elsewhere.
//!
//! Pad slots hold zero pixels, cos 1 and sin 0, so that they stay finite,
//! and attend to one pad slot alone: the call's first in `mask`, their
//! window's first in `window_mask` ([`crate::host`]). The merged output
//! holds one token per 4 slots; the runtime keeps the real ones, in
//! merge-block order ([`HostInputs::slots`]).

use crate::family::qwen2_5_vl::Qwen25VisionConfig;
use crate::host::{
    HostError, HostInputs, HostRecipe, MASK_VALUE, pack_patches_at, rotary_tables_at,
};
use crate::preprocess::PixelBatch;

/// The inputs of a Qwen2.5-VL bucket of `n` slots, in order: (name, shape).
/// `window_mask` only when some block attends within windows.
pub fn input_shapes(cfg: &Qwen25VisionConfig, n: usize) -> Vec<(String, Vec<usize>)> {
    let (p, s) = (cfg.patch_size, cfg.window_slots());
    let mut v = vec![
        ("patches".into(), vec![1, 3 * p * p, 1, n]),
        ("cos".into(), vec![1, cfg.head_dim(), 1, n]),
        ("sin".into(), vec![1, cfg.head_dim(), 1, n]),
        ("mask".into(), vec![1, n, n]),
    ];
    if (0..cfg.depth).any(|i| !cfg.fullatt_block_indexes.contains(&i)) {
        v.push(("window_mask".into(), vec![n / s, s, s]));
    }
    v
}

/// The recipe of a Qwen2.5-VL vision config: its rotary base.
pub fn host_recipe(cfg: &Qwen25VisionConfig) -> HostRecipe {
    HostRecipe {
        output_scale: None,
        rope_theta: Some(cfg.rope_theta),
        pos_interpolation: None,
    }
}

/// Where a call's rows go: the slot of every row (merge-block order), the
/// real slots of each window, and those of each frame.
pub struct WindowLayout {
    pub slots: Vec<usize>,
    /// Per window, in slot order: how many of its `S` slots are real.
    pub window_real: Vec<usize>,
    /// Per frame: its real slots.
    pub frames: Vec<Vec<usize>>,
}

impl WindowLayout {
    /// Slots the call takes: `S` per window.
    pub fn len(&self, s: usize) -> usize {
        self.window_real.len() * s
    }
}

/// Lay out the rows of images `grid_thw` in windows of `wu x wu` merge units
/// of `m x m` patches: window after window, each in `(wu * m)^2` slots.
pub fn window_layout(grid_thw: &[[usize; 3]], m: usize, wu: usize) -> WindowLayout {
    let (unit, s) = (m * m, wu * wu * m * m);
    let mut out = WindowLayout {
        slots: Vec::new(),
        window_real: Vec::new(),
        frames: Vec::new(),
    };
    for &[t, h, w] in grid_thw {
        let (uh, uw) = (h / m, w / m);
        let (nwh, nww) = (uh.div_ceil(wu), uw.div_ceil(wu));
        for _ in 0..t {
            let first = out.window_real.len();
            for wr in 0..nwh {
                for wc in 0..nww {
                    let rows = wu.min(uh - wr * wu);
                    let cols = wu.min(uw - wc * wu);
                    out.window_real.push(rows * cols * unit);
                }
            }
            let mut frame = Vec::with_capacity(h * w);
            // Rows arrive in merge-block order: unit (r, c) raster over the unit grid.
            for r in 0..uh {
                for c in 0..uw {
                    let (wr, wc) = (r / wu, c / wu);
                    let cols = wu.min(uw - wc * wu);
                    let pos = (r - wr * wu) * cols + (c - wc * wu);
                    let base = (first + wr * nww + wc) * s + pos * unit;
                    for k in 0..unit {
                        out.slots.push(base + k);
                        frame.push(base + k);
                    }
                }
            }
            out.frames.push(frame);
        }
    }
    out
}

/// Slots a call of images `grid_thw` takes.
pub fn slots_needed(cfg: &Qwen25VisionConfig, grid_thw: &[[usize; 3]]) -> usize {
    window_layout(grid_thw, cfg.spatial_merge_size, cfg.window_units()).len(cfg.window_slots())
}

/// Build the inputs of one call.
pub fn host_inputs(
    batch: &PixelBatch,
    cfg: &Qwen25VisionConfig,
    recipe: &HostRecipe,
    bucket: usize,
) -> std::result::Result<HostInputs, HostError> {
    let (m, s) = (cfg.spatial_merge_size, cfg.window_slots());
    if !bucket.is_multiple_of(s) {
        return Err(HostError::Bucket(format!(
            "a bucket of {bucket} slots is not a whole number of {s}-slot windows"
        )));
    }
    let lay = window_layout(&batch.grid_thw, m, cfg.window_units());
    if lay.len(s) > bucket {
        return Err(HostError::DoesNotFit(format!(
            "{} patches in {} windows take {} slots and do not fit a bucket of {bucket}",
            batch.rows(),
            lay.window_real.len(),
            lay.len(s)
        )));
    }
    if lay.slots.len() != batch.rows() {
        return Err(HostError::Batch(format!(
            "grid_thw describes {} patches but the batch has {} rows",
            lay.slots.len(),
            batch.rows()
        )));
    }
    let patches = pack_patches_at(
        batch,
        cfg.patch_size,
        cfg.temporal_patch_size,
        cfg.patch_dim(),
        bucket,
        &lay.slots,
    )?;
    let (cos, sin) = rotary_tables_at(
        batch,
        m,
        cfg.head_dim(),
        crate::host::rope_theta(recipe)?,
        bucket,
        &lay.slots,
    );
    let mut mask = vec![MASK_VALUE; bucket * bucket];
    let mut real = vec![false; bucket];
    for frame in &lay.frames {
        for &q in frame {
            real[q] = true;
            for &k in frame {
                mask[q * bucket + k] = 0.0;
            }
        }
    }
    let mut window_mask = vec![MASK_VALUE; bucket * s];
    // The first pad slot of the call, and of each window (its real slots come first).
    let first_pad = real.iter().position(|r| !r);
    for q in 0..bucket {
        let (w, i) = (q / s, q % s);
        let n = lay.window_real.get(w).copied().unwrap_or(0);
        if real[q] {
            window_mask[(w * s + i) * s..(w * s + i) * s + n].fill(0.0);
        } else {
            mask[q * bucket + first_pad.unwrap_or(q)] = 0.0;
            let window_pad = (w * s..q).find(|&k| !real[k]).unwrap_or(q) - w * s;
            window_mask[(w * s + i) * s + window_pad] = 0.0;
        }
    }
    // (`window_mask` is dropped by the zip when the tower has no windowed block.)
    let tensors = input_shapes(cfg, bucket)
        .into_iter()
        .zip([patches, cos, sin, mask, window_mask])
        .map(|((name, shape), v)| (name, shape, v))
        .collect();
    Ok(HostInputs {
        tensors,
        real: batch.rows(),
        bucket,
        slots: Some(lay.slots),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grid 6 x 10 patches = 3 x 5 units in windows of 2 x 2 units (16
    /// slots): windows [2x2, 2x2, 2x1, 1x2, 1x2, 1x1] units.
    #[test]
    fn windows_take_whole_slots_and_keep_real_units_first() {
        let lay = window_layout(&[[1, 6, 10]], 2, 2);
        assert_eq!(lay.window_real, vec![16, 16, 8, 8, 8, 4]);
        assert_eq!(lay.len(16), 96);
        // Unit (0, 0): slots 0..4; unit (0, 1): 4..8; unit (0, 2): second window.
        assert_eq!(&lay.slots[..12], &[0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19]);
        // Unit (0, 4), the right edge window (1 unit wide): slots 32..36; unit (1, 4): 36..40.
        assert_eq!(&lay.slots[16..20], &[32, 33, 34, 35]);
        assert_eq!(&lay.slots[36..40], &[36, 37, 38, 39]);
        // Every row has its own slot, and each window's real slots come first.
        let mut seen = lay.slots.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 60);
        for (w, &n) in lay.window_real.iter().enumerate() {
            let got = lay.slots.iter().filter(|&&x| x / 16 == w).count();
            assert_eq!(got, n);
            assert!(
                lay.slots
                    .iter()
                    .filter(|&&x| x / 16 == w)
                    .all(|&x| x % 16 < n)
            );
        }
    }

    #[test]
    fn masks_isolate_windows_frames_and_pads() {
        let cfg = Qwen25VisionConfig {
            depth: 2, // block 1 windowed, so the program takes a window mask
            hidden_size: 8,
            hidden_act: crate::checkpoint::Activation::Silu,
            intermediate_size: 8,
            num_heads: 2,
            in_channels: 3,
            patch_size: 2,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            out_hidden_size: 4,
            window_size: 8, // 4 x 4 patches = 2 x 2 units, 16 slots
            fullatt_block_indexes: vec![0],
            rope_theta: 10_000.0,
        };
        // Images of 2x2 units (one full window) and 2x6 patches (1 x 3 units: 2 windows).
        let grid = vec![[1, 4, 4], [1, 2, 6]];
        let rows = 16 + 12;
        let batch = PixelBatch {
            pixel_values: (0..rows * cfg.patch_dim()).map(|i| i as f32).collect(),
            row_len: cfg.patch_dim(),
            grid_thw: grid.clone(),
        };
        assert_eq!(slots_needed(&cfg, &grid), 48);
        let h = host_inputs(&batch, &cfg, &host_recipe(&cfg), 64).unwrap();
        let (mask, wm) = (h.get("mask").unwrap(), h.get("window_mask").unwrap());
        let n = 64;
        // Image 2's units: (0,0),(0,1) in window 1 (slots 16..24), (0,2) in window 2 (32..36).
        assert_eq!(
            &h.slots.as_ref().unwrap()[16..],
            &[16, 17, 18, 19, 20, 21, 22, 23, 32, 33, 34, 35]
        );
        // Full mask: image 2's real slots attend each other across windows, not image 1 or pads.
        assert_eq!(mask[16 * n + 33], 0.0);
        assert_eq!(mask[16 * n + 3], MASK_VALUE);
        assert_eq!(mask[16 * n + 24], MASK_VALUE);
        // Pads attend to the first pad slot (24) alone, in the full mask,
        // and to their window's first pad slot in the window mask.
        for q in [24, 25, 40, 63] {
            assert!((0..n).all(|k| mask[q * n + k] == if k == 24 { 0.0 } else { MASK_VALUE }));
        }
        // Window mask: window 1 has 8 real slots.
        let w = |win: usize, q: usize, k: usize| wm[(win * 16 + q) * 16 + k];
        assert_eq!(w(1, 0, 7), 0.0);
        assert_eq!(w(1, 0, 8), MASK_VALUE);
        assert_eq!(w(1, 9, 0), MASK_VALUE);
        // Pads: their window's first pad slot alone (8 in window 1, 0 in the unused window 3).
        for (win, q, first) in [(1, 8, 8), (1, 9, 8), (1, 15, 8), (3, 0, 0), (3, 5, 0)] {
            assert!((0..16).all(|k| w(win, q, k) == if k == first { 0.0 } else { MASK_VALUE }));
        }
        // Pad slots: zero pixels, cos 1, sin 0.
        let (p, c, s) = (
            h.get("patches").unwrap(),
            h.get("cos").unwrap(),
            h.get("sin").unwrap(),
        );
        assert!((0..12).all(|ch| p[ch * n + 24] == 0.0));
        assert!((0..4).all(|ch| c[ch * n + 24] == 1.0 && s[ch * n + 24] == 0.0));
        // Output tokens: image 1's 4, then image 2's 3 (columns 4, 5, 8).
        assert_eq!(h.token_columns(4), vec![0, 1, 2, 3, 4, 5, 8]);
        let e = host_inputs(&batch, &cfg, &host_recipe(&cfg), 32).unwrap_err();
        assert!(
            matches!(&e, HostError::DoesNotFit(m) if m.contains("48 slots")),
            "{e}"
        );
        let e = host_inputs(&batch, &cfg, &host_recipe(&cfg), 56).unwrap_err();
        assert!(
            matches!(&e, HostError::Bucket(m) if m.contains("16-slot")),
            "{e}"
        );
    }
}
