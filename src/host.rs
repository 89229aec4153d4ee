//! Host-side inputs of an exported bucket: what must not be in the graph
//! (ANE-RULES R8, R10), the parts every family shares. Written independently
//! of the reference towers (which have their own position and rotary code)
//! so that the cosine gate compares two implementations. Each family's
//! module (`family/<family>/layout.rs`) assembles its inputs from these.
//!
//! Pad rows stay finite: zero pixels, cos 1 and sin 0 (TOWERS.md), and each
//! attends to one key alone: the first pad slot (of the call, or of its
//! window). Every pad slot holds the same values, so that key's value is
//! the pad's own, as if it attended to itself; and since every pad row of a
//! mask is then the same row, an executor that computes each distinct query
//! row once (the project's interpreter does) computes the pads once.

pub use crate::error::HostError;
use crate::preprocess::PixelBatch;

/// A table `[rows, cols]` (row major) transposed to the activations'
/// channels-first layout, `[cols, rows]`: a position table `[tokens, d]`
/// becomes the `[1, d, 1, tokens]` the program adds.
pub fn channels_first(table: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; rows * cols];
    for (r, row) in table.chunks_exact(cols).enumerate() {
        for (c, v) in row.iter().enumerate() {
            t[c * rows + r] = *v;
        }
    }
    t
}

/// The rotary base a recipe gives, or the message that it has none.
pub fn rope_theta(recipe: &HostRecipe) -> Result<f64, HostError> {
    recipe.rope_theta.ok_or_else(|| HostError::Recipe {
        field: "host.rope_theta",
        msg: "missing, and this family needs it".into(),
    })
}

/// The additive mask value (ANE-RULES R5: -1e4, never -inf).
pub const MASK_VALUE: f32 = -1e4;

/// How learned position tables are resampled to an image's grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PosInterpolation {
    /// Bilinear with the grid's corners on the table's corners
    /// (`src = i * (S-1) / (size-1)`), as Qwen3-VL's `fast_pos_embed_interpolate`.
    BilinearAlignCorners,
    /// Bilinear with half-pixel centres (`src = (i + 0.5) * S / size - 0.5`,
    /// clamped at the edges): what `align_corners=False` computes. Not
    /// Qwen3-VL's; written only by `build --fault pos-align` for the gates' tests.
    BilinearHalfPixel,
    /// PyTorch's bicubic `interpolate` with `align_corners=False` (Keys'
    /// cubic, a = -0.75, edge samples repeated), as DINOv2's
    /// `interpolate_pos_encoding`.
    Bicubic,
    /// The same with `antialias=True` (a = -0.5, the kernel stretched by
    /// the scale when shrinking, weights normalised), as DINOv2 with
    /// registers.
    BicubicAntialias,
    /// PyTorch's bilinear `interpolate` with `align_corners=False` and
    /// `antialias=True` (the triangle stretched by the scale when
    /// shrinking, weights normalised), as SigLIP2's
    /// `resize_positional_embeddings`.
    BilinearAntialias,
}

impl PosInterpolation {
    /// The resampling `build --fault pos-align` records instead: a
    /// plausible mistake of the same family (half-pixel centres for
    /// bilinear, antialiasing toggled for bicubic).
    pub fn misaligned(self) -> PosInterpolation {
        match self {
            PosInterpolation::BilinearAlignCorners | PosInterpolation::BilinearHalfPixel => {
                PosInterpolation::BilinearHalfPixel
            }
            PosInterpolation::Bicubic => PosInterpolation::BicubicAntialias,
            PosInterpolation::BicubicAntialias => PosInterpolation::Bicubic,
            // Antialiasing forgotten: what shrinking an axis shows.
            PosInterpolation::BilinearAntialias => PosInterpolation::BilinearHalfPixel,
        }
    }
}

/// The host side of a fixed-resolution encoder (CLIP, SigLIP, DINOv2):
/// each call is one image of exactly a bucket's patches, with the
/// position rows of the bucket's grid computed from the checkpoint's table.
pub struct FixedEncoder {
    /// The family, for messages.
    pub family: &'static str,
    pub patch: usize,
    /// Side of the table's grid, and the width of its rows.
    pub grid: usize,
    pub hidden: usize,
    /// Table rows before the grid's, not resampled (the class token's).
    pub lead: usize,
    /// Output tokens besides the patches (class token, registers).
    pub extra: usize,
    /// The checkpoint tensor that holds the table, and its stored shape.
    pub tensor: &'static str,
    pub stored: Vec<usize>,
    /// The resampling: antialiased bicubic or plain bicubic.
    pub antialias: bool,
}

impl FixedEncoder {
    fn rows(&self) -> usize {
        self.lead + self.grid * self.grid
    }

    /// The tables `host.safetensors` holds: `pos_table [lead + g*g, D]`.
    pub fn table_shapes(&self) -> Vec<(String, Vec<usize>)> {
        vec![("pos_table".into(), vec![self.rows(), self.hidden])]
    }

    /// Those tables, read from the checkpoint.
    pub fn tables(
        &self,
        ck: &crate::checkpoint::Checkpoint,
    ) -> crate::error::Result<Vec<HostTable>> {
        let v = ck
            .tensor(self.tensor, &self.stored)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(vec![(
            "pos_table".into(),
            vec![self.rows(), self.hidden],
            v,
        )])
    }

    /// What the host computes: the table resampled bicubically (antialiased
    /// or not) to a bucket's grid; no rotary.
    pub fn recipe(&self) -> HostRecipe {
        HostRecipe {
            output_scale: None,
            rope_theta: None,
            pos_interpolation: Some(if self.antialias {
                PosInterpolation::BicubicAntialias
            } else {
                PosInterpolation::Bicubic
            }),
        }
    }

    /// The inputs of a bucket of `n` patches, in order: `patches`, `positions`.
    pub fn input_shapes(&self, n: usize) -> Vec<(String, Vec<usize>)> {
        let mut v = one_image_input_shapes(self.patch, n);
        v.push(("positions".into(), vec![1, self.hidden, 1, self.lead + n]));
        v
    }

    /// The inputs of one call: one image of exactly `bucket` patches, and
    /// the position rows of the bucket's grid from `table` as `recipe` says.
    pub fn inputs(
        &self,
        recipe: &HostRecipe,
        table: &[f32],
        batch: &PixelBatch,
        bucket: usize,
    ) -> Result<HostInputs, HostError> {
        let mut inputs = one_image_inputs(batch, self.patch, bucket, self.extra, self.family)?;
        inputs.tensors.push(positions_input(
            table,
            self.lead,
            (self.grid, self.hidden),
            bucket,
            recipe,
        )?);
        Ok(inputs)
    }
}

/// The `positions [1, D, 1, lead + n]` input of a fixed-resolution
/// encoder's bucket of `n` patches (a square grid): from the checkpoint's
/// table `[lead + g*g, D]` (`lead` rows not resampled first: the class
/// token's), the table itself when the grid is the table's (as transformers
/// skips the resampling then), else the lead rows and the grid resampled
/// as `recipe.pos_interpolation` says (bicubic, with or without
/// antialiasing); channels first.
pub fn positions_input(
    table: &[f32],
    lead: usize,
    (g, d): (usize, usize),
    n: usize,
    recipe: &HostRecipe,
) -> Result<(String, Vec<usize>, Vec<f32>), HostError> {
    if table.len() != (lead + g * g) * d {
        return Err(HostError::TableSize {
            name: "pos_table",
            got: table.len(),
            rows: lead + g * g,
            cols: d,
        });
    }
    let side = (n as f64).sqrt().round() as usize;
    if side * side != n {
        return Err(HostError::Bucket(format!(
            "{n} patches: a fixed-resolution bucket is a square grid"
        )));
    }
    let rows = if side == g {
        table.to_vec()
    } else {
        let antialias = match recipe.pos_interpolation {
            Some(PosInterpolation::Bicubic) => false,
            Some(PosInterpolation::BicubicAntialias) => true,
            other => {
                return Err(HostError::Recipe {
                    field: "host.pos_interpolation",
                    msg: format!(
                        "{other:?}; a fixed-resolution encoder's table is resampled \
                         bicubically (`bicubic` or `bicubic_antialias`)"
                    ),
                });
            }
        };
        let mut rows = table[..lead * d].to_vec();
        rows.extend(resample_bicubic(
            &table[lead * d..],
            g,
            d,
            (side, side),
            antialias,
        ));
        rows
    };
    Ok((
        "positions".into(),
        vec![1, d, 1, lead + n],
        channels_first(&rows, lead + n, d),
    ))
}

/// Resample a `g x g` grid of rows of `d` channels (`table`, row-major
/// `[g*g, d]`) to `h x w` with PyTorch's bicubic `interpolate`
/// (`align_corners=False`; `antialias` as [`PosInterpolation::BicubicAntialias`]),
/// in f32 as PyTorch computes it on a CPU: along the width, then the height.
pub fn resample_bicubic(
    table: &[f32],
    g: usize,
    d: usize,
    (h, w): (usize, usize),
    antialias: bool,
) -> Vec<f32> {
    let (taps_w, taps_h) = (bicubic_taps(g, w, antialias), bicubic_taps(g, h, antialias));
    separable(table, g, d, (h, w), (&taps_w, &taps_h))
}

/// A separable resampling of a `g x g` grid of rows of `d` channels
/// (`table`, `[g*g, d]`) to `h x w` in f32: along the width with `taps_w`,
/// then the height with `taps_h` (each output's first source sample and
/// its weights); rows `[h*w, d]`.
pub fn separable(
    table: &[f32],
    g: usize,
    d: usize,
    (h, w): (usize, usize),
    (taps_w, taps_h): (&[Taps], &[Taps]),
) -> Vec<f32> {
    let mut across = vec![0f32; g * w * d];
    for a in 0..g {
        for (x, (lo, ws)) in taps_w.iter().enumerate() {
            let o = &mut across[(a * w + x) * d..(a * w + x + 1) * d];
            for (k, wt) in ws.iter().enumerate() {
                let src = &table[(a * g + lo + k) * d..(a * g + lo + k + 1) * d];
                for (o, v) in o.iter_mut().zip(src) {
                    *o += v * wt;
                }
            }
        }
    }
    let mut out = vec![0f32; h * w * d];
    for (y, (lo, ws)) in taps_h.iter().enumerate() {
        for x in 0..w {
            let o = &mut out[(y * w + x) * d..(y * w + x + 1) * d];
            for (k, wt) in ws.iter().enumerate() {
                let src = &across[((lo + k) * w + x) * d..((lo + k) * w + x + 1) * d];
                for (o, v) in o.iter_mut().zip(src) {
                    *o += v * wt;
                }
            }
        }
    }
    out
}

/// One output sample's resampling: its first source sample and the
/// weights of it and the following ones.
pub type Taps = (usize, Vec<f32>);

/// Output `i`'s taps of PyTorch's antialiased `interpolate` from `inp` to
/// `out` samples, in f32 as on a CPU: `filter` of half-width `support`,
/// stretched by the scale when shrinking, centred at `scale * (i + 0.5)`,
/// its weights normalised to sum 1 (`_compute_weights_aa`).
pub fn antialias_taps(
    inp: usize,
    out: usize,
    i: usize,
    support: f32,
    filter: impl Fn(f32) -> f32,
) -> Taps {
    let scale = inp as f32 / out as f32;
    let center = scale * (i as f32 + 0.5);
    let (support, inv) = if scale >= 1.0 {
        (support * scale, 1.0 / scale)
    } else {
        (support, 1.0)
    };
    let lo = ((center - support + 0.5) as i64).max(0) as usize;
    let hi = ((center + support + 0.5) as i64).min(inp as i64) as usize;
    let mut ws: Vec<f32> = (lo..hi)
        .map(|j| filter((j as f32 - center + 0.5) * inv))
        .collect();
    let total: f32 = ws.iter().sum();
    if total != 0.0 {
        ws.iter_mut().for_each(|v| *v /= total);
    }
    (lo, ws)
}

/// For each of `out` samples from `inp`: the first source sample and the
/// weights of it and the following ones. Without antialiasing the 4 taps
/// of an edge sample are folded onto the samples that exist (PyTorch reads
/// clamped indices).
fn bicubic_taps(inp: usize, out: usize, antialias: bool) -> Vec<Taps> {
    let scale = inp as f32 / out as f32;
    let cubic = |x: f32, a: f32| -> f32 {
        let x = x.abs();
        if x < 1.0 {
            ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            (((x - 5.0) * x + 8.0) * x - 4.0) * a
        } else {
            0.0
        }
    };
    (0..out)
        .map(|i| {
            if antialias {
                antialias_taps(inp, out, i, 2.0, |x| cubic(x, -0.5))
            } else {
                let src = scale * (i as f32 + 0.5) - 0.5;
                let x0 = src.floor();
                let t = src - x0;
                let coeffs = [
                    cubic(t + 1.0, -0.75),
                    cubic(t, -0.75),
                    cubic(1.0 - t, -0.75),
                    cubic(2.0 - t, -0.75),
                ];
                let idx = |k: i64| (x0 as i64 + k).clamp(0, inp as i64 - 1) as usize;
                let lo = idx(-1);
                let mut ws = vec![0f32; idx(2) - lo + 1];
                for (k, c) in coeffs.iter().enumerate() {
                    ws[idx(k as i64 - 1) - lo] += c;
                }
                (lo, ws)
            }
        })
        .collect()
}

/// What the host computes besides the pixels, recorded in the artifact's
/// manifest (`host`) so that every runtime computes the inputs the package
/// was built for: the rotary base and the position-table resampling; and
/// what it does to the outputs: the scale of those that carry the residual
/// stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostRecipe {
    /// The rotary base; absent for families without rotary embeddings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// How a learned position table is resampled; absent for families
    /// without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pos_interpolation: Option<PosInterpolation>,
    /// The program carries the residual stream divided by this (`build
    /// --residual-scale`), and the outputs that are that stream
    /// ([`crate::family::Tower::residual_outputs`]: CLIP's
    /// `last_hidden_state`) are multiplied by it on the host, in f32;
    /// absent when nothing needs scaling back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_scale: Option<u32>,
}

impl HostRecipe {
    /// The recipe's values, or the name of the field that is invalid.
    pub fn validate(&self) -> Result<(), HostError> {
        if let Some(t) = self.rope_theta
            && !(t.is_finite() && t > 1.0)
        {
            return Err(HostError::Recipe {
                field: "host.rope_theta",
                msg: format!("expected a finite number > 1, got {t}"),
            });
        }
        if let Some(s) = self.output_scale
            && !(s >= 2 && s.is_power_of_two() && s <= 4096)
        {
            return Err(HostError::Recipe {
                field: "host.output_scale",
                msg: format!("expected a power of two from 2 to 4096, got {s}"),
            });
        }
        Ok(())
    }
}

/// One call's inputs, each flattened row-major: (name, shape, values), in
/// the order of the function's inputs.
#[derive(Debug)]
pub struct HostInputs {
    pub tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
    /// Real rows (patches of the call).
    pub real: usize,
    /// Columns (slots) of the bucket.
    pub bucket: usize,
    /// The slot of each real row, in the rows' (merge-block) order, when
    /// rows are not simply the first `real` slots (families whose host
    /// lays rows out with padding between them).
    pub slots: Option<Vec<usize>>,
}

impl HostInputs {
    /// (name, shape, values) of every input, as the package names them, in
    /// the order of the function's inputs.
    pub fn named(&self) -> Vec<(&str, &[usize], &[f32])> {
        self.tensors
            .iter()
            .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
            .collect()
    }

    /// The slot (column) of real row `r`.
    pub fn slot(&self, r: usize) -> usize {
        self.slots.as_ref().map_or(r, |s| s[r])
    }

    /// The output column of each real merged token (`unit` rows merge into
    /// one), in merge-block order.
    pub fn token_columns(&self, unit: usize) -> Vec<usize> {
        (0..self.real / unit)
            .map(|u| self.slot(u * unit) / unit)
            .collect()
    }

    /// The values of input `name`.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.tensors
            .iter()
            .find(|t| t.0 == name)
            .map(|t| t.2.as_slice())
    }
}

/// A host table as read from a checkpoint: (name, shape, values).
pub type HostTable = (String, Vec<usize>, Vec<f32>);

/// The tables the runtime keeps besides the package (`host.safetensors`),
/// by name.
#[derive(Debug, Default)]
pub struct HostTables(std::collections::BTreeMap<String, Vec<f32>>);

impl HostTables {
    pub fn insert(&mut self, name: String, values: Vec<f32>) {
        self.0.insert(name, values);
    }

    /// Table `name`, or the message that it is missing.
    pub fn get(&self, name: &str) -> Result<&[f32], HostError> {
        self.0
            .get(name)
            .map(Vec::as_slice)
            .ok_or_else(|| HostError::MissingTable(name.to_string()))
    }
}

/// (row, col) of the tokens of an h x w grid in merge-block order: each
/// `m x m` block of patches that merges into one token is contiguous.
pub fn block_order(h: usize, w: usize, m: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::with_capacity(h * w);
    for br in 0..h / m {
        for bc in 0..w / m {
            for ir in 0..m {
                for ic in 0..m {
                    v.push((br * m + ir, bc * m + ic));
                }
            }
        }
    }
    v
}

/// `patches [3*P*P, bucket]` (channel-major, one column per row): the first
/// temporal frame of each `pixel_values` row, `(c, t=0, py, px)` ->
/// channel `(c, py, px)`; pad columns zero. Refuses a batch that does not
/// fit the bucket or whose rows are not `row_len` values.
pub fn pack_patches(
    batch: &PixelBatch,
    p: usize,
    t: usize,
    row_len: usize,
    bucket: usize,
) -> Result<Vec<f32>, HostError> {
    let slots: Vec<usize> = (0..batch.rows()).collect();
    pack_patches_at(batch, p, t, row_len, bucket, &slots)
}

/// [`pack_patches`] with row `r` in column `slots[r]`.
pub fn pack_patches_at(
    batch: &PixelBatch,
    p: usize,
    t: usize,
    row_len: usize,
    bucket: usize,
    slots: &[usize],
) -> Result<Vec<f32>, HostError> {
    let n = batch.rows();
    if n > bucket {
        return Err(HostError::DoesNotFit(format!(
            "{n} patches do not fit a bucket of {bucket}"
        )));
    }
    if batch.row_len != row_len {
        return Err(HostError::Batch(format!(
            "rows of {} values, the model expects {row_len}",
            batch.row_len
        )));
    }
    let cin = 3 * p * p;
    let mut patches = vec![0f32; cin * bucket];
    for r in 0..n {
        let row = &batch.pixel_values[r * batch.row_len..(r + 1) * batch.row_len];
        for c in 0..3 {
            for k in 0..p * p {
                patches[(c * p * p + k) * bucket + slots[r]] = row[c * t * p * p + k];
            }
        }
    }
    Ok(patches)
}

/// The inputs of a fixed-resolution encoder's bucket of `n` patches of
/// side `p` (CLIP, SigLIP): `patches [1, 3*P*P, 1, n]` alone.
pub fn one_image_input_shapes(p: usize, n: usize) -> Vec<(String, Vec<usize>)> {
    vec![("patches".into(), vec![1, 3 * p * p, 1, n])]
}

/// The inputs of a fixed-resolution encoder's call (CLIP, SigLIP): one
/// image of exactly `bucket` patches as `patches [1, 3*P*P, 1, bucket]`, no
/// padding; the sequence is `extra` tokens (a class token) and the patches,
/// all real. `family` names the family in the message.
pub fn one_image_inputs(
    batch: &PixelBatch,
    p: usize,
    bucket: usize,
    extra: usize,
    family: &str,
) -> Result<HostInputs, HostError> {
    if batch.grid_thw.len() != 1 || batch.rows() != bucket {
        return Err(HostError::Batch(format!(
            "a {family} bucket of {bucket} patches takes one image of exactly {bucket} patches, got {} \
             image(s) of {} patches",
            batch.grid_thw.len(),
            batch.rows()
        )));
    }
    let patches = pack_patches(batch, p, 1, 3 * p * p, bucket)?;
    Ok(HostInputs {
        tensors: vec![("patches".into(), vec![1, 3 * p * p, 1, bucket], patches)],
        real: bucket + extra,
        bucket: bucket + extra,
        slots: None,
    })
}

/// The 2-D rotary tables `cos`, `sin [hd, bucket]` of the batch's rows in
/// merge-block order: channels `[row freqs, col freqs]` twice, frequency
/// `k` being `theta^(-2k / (hd/2))`; pad columns cos 1, sin 0.
pub fn rotary_tables(
    batch: &PixelBatch,
    m: usize,
    hd: usize,
    theta: f64,
    bucket: usize,
) -> (Vec<f32>, Vec<f32>) {
    let slots: Vec<usize> = (0..batch.rows()).collect();
    rotary_tables_at(batch, m, hd, theta, bucket, &slots)
}

/// [`rotary_tables`] with row `r` in column `slots[r]`.
pub fn rotary_tables_at(
    batch: &PixelBatch,
    m: usize,
    hd: usize,
    theta: f64,
    bucket: usize,
    slots: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let mut cos = vec![1f32; hd * bucket];
    let mut sin = vec![0f32; hd * bucket];
    let quarter = hd / 4;
    let inv: Vec<f32> = (0..quarter)
        .map(|k| 1.0 / (theta as f32).powf((2 * k) as f32 / (hd / 2) as f32))
        .collect();
    let mut r = 0usize;
    for &[gt, gh, gw] in &batch.grid_thw {
        let order = block_order(gh, gw, m);
        for _ in 0..gt {
            for &(row, col) in &order {
                let s = slots[r];
                for (k, &f) in inv.iter().enumerate() {
                    let (a, b) = (row as f32 * f, col as f32 * f);
                    for half in [0, hd / 2] {
                        cos[(half + k) * bucket + s] = a.cos();
                        sin[(half + k) * bucket + s] = a.sin();
                        cos[(half + quarter + k) * bucket + s] = b.cos();
                        sin[(half + quarter + k) * bucket + s] = b.sin();
                    }
                }
                r += 1;
            }
        }
    }
    (cos, sin)
}

/// `mask [bucket, bucket]`: 0 where query and key are in the same frame of
/// the same image, [`MASK_VALUE`] elsewhere; pad rows attend to the first
/// pad slot alone (module docs).
pub fn frame_mask(batch: &PixelBatch, bucket: usize) -> Vec<f32> {
    let mut mask = vec![MASK_VALUE; bucket * bucket];
    let mut r = 0usize;
    for &[gt, gh, gw] in &batch.grid_thw {
        for _ in 0..gt {
            let start = r;
            r += gh * gw;
            for q in start..r {
                mask[q * bucket + start..q * bucket + r].fill(0.0);
            }
        }
    }
    for q in r..bucket {
        mask[q * bucket + r] = 0.0;
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recipe_names_its_bad_field() {
        let ok = HostRecipe {
            output_scale: Some(4),
            ..HostRecipe::default()
        };
        assert!(ok.validate().is_ok());
        for s in [0, 1, 3, 8192] {
            let bad = HostRecipe {
                output_scale: Some(s),
                ..HostRecipe::default()
            };
            let m = bad.validate().unwrap_err();
            assert!(
                matches!(
                    m,
                    HostError::Recipe {
                        field: "host.output_scale",
                        ..
                    }
                ),
                "{s}: {m}"
            );
            assert!(m.to_string().starts_with("host.output_scale: "), "{m}");
        }
        let bad = HostRecipe {
            rope_theta: Some(0.5),
            ..HostRecipe::default()
        };
        assert!(matches!(
            bad.validate().unwrap_err(),
            HostError::Recipe {
                field: "host.rope_theta",
                ..
            }
        ));
        // Absent fields stay out of manifests, so older ones read the same.
        assert_eq!(serde_json::to_string(&HostRecipe::default()).unwrap(), "{}");
    }
}
