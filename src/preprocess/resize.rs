//! Bicubic and bilinear resampling with antialias, bit-compatible with the
//! two backends of transformers' image processors.
//!
//! Both backends use the same separable filters (Keys cubic with a = -0.5,
//! support 2; or the triangle of bilinear, support 1, which SigLIP2's
//! processor uses) whose support widens with the downscale factor
//! (antialias), compute the filter
//! weights in f64, quantise them to fixed point, accumulate in integers,
//! and resample one axis, then the other (each pass rounds and clips to
//! uint8; an axis whose size does not change is skipped). They differ in
//! the quantisation and in the order of the passes:
//!
//! * [`ResizeKernel::Torchvision`] (transformers 5's default backend:
//!   `tvF.resize(..., antialias=True)` on a uint8 tensor, which runs ATen's
//!   native uint8 kernel, a port of Pillow-SIMD): int16 weights with the
//!   largest precision (at most 22 bits) that keeps the largest weight of the
//!   axis below 2^15.
//!   The width is resampled first.
//! * [`ResizeKernel::Pil`] (Pillow's `ImagingResample`, used by the PIL
//!   backend): 22-bit weights in int32. Pillow 13 resamples the height
//!   first when the height shrinks by more than twice what the width
//!   shrinks (`h - out_h > 2 * (w - out_w)`), else the width first: the
//!   rule [`pil_height_first`] states, found by comparing Pillow 13.0's
//!   output with both orders over 698 random size pairs on which the two
//!   orders differ (ties of the rule included; each pair matched the
//!   rule's order) after the golden CLIP images disagreed.
//!
//! The input and output are interleaved RGB, row major (`H x W x 3`).

/// Which backend's arithmetic to reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResizeKernel {
    /// torchvision's `resize` with antialias on uint8 input (ATen's uint8 kernel).
    Torchvision,
    /// Pillow's `Image.resize(..., BICUBIC)`.
    Pil,
}

/// The resampling filter (`resample` in `preprocessor_config.json`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Filter {
    /// `PILImageResampling.BICUBIC` (3): the Qwen-VL, CLIP, SigLIP and DINOv2 processors.
    #[default]
    Bicubic,
    /// `PILImageResampling.BILINEAR` (2): SigLIP2's processor.
    Bilinear,
}

impl Filter {
    /// Whether it is bicubic (the default, left out of manifests).
    pub fn is_bicubic(&self) -> bool {
        *self == Filter::Bicubic
    }

    /// Half the filter's width at scale 1 (Pillow's `support`, ATen's `interp_size / 2`).
    fn support(self) -> f64 {
        match self {
            Filter::Bicubic => 2.0,
            Filter::Bilinear => 1.0,
        }
    }
}

/// Pillow's `bilinear_filter` and ATen's `aa_filter` for bilinear (they agree).
fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 { 1.0 - x } else { 0.0 }
}

/// Pillow's `bicubic_filter` (a = -0.5).
fn cubic_pil(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// ATen's `aa_filter` for bicubic: `cubic_convolution1/2` with a = -0.5.
fn cubic_aten(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

/// Fixed-point filter taps for one axis: output `i` reads inputs
/// `start[i] .. start[i] + len[i]` with weights `w[i * ksize ..][.. len[i]]`,
/// scaled by `2^precision`.
struct Taps {
    start: Vec<usize>,
    len: Vec<usize>,
    ksize: usize,
    w: Vec<i32>,
    precision: u32,
}

/// Normalised f64 weights, shared by both backends (Pillow's `precompute_coeffs`,
/// ATen's `_compute_weights_aa`; the two agree step for step).
fn float_taps(
    in_size: usize,
    out_size: usize,
    filter: fn(f64) -> f64,
    support: f64,
) -> (Vec<usize>, Vec<usize>, usize, Vec<f64>) {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = support * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut start = Vec::with_capacity(out_size);
    let mut len = Vec::with_capacity(out_size);
    let mut w = vec![0f64; out_size * ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // C's `(int)` truncates toward zero before the clamp.
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) - xmin;
        let (xmin, xmax) = (xmin as usize, (xmax.max(0) as usize).min(ksize));
        let k = &mut w[xx * ksize..xx * ksize + ksize];
        let mut ww = 0.0;
        for (x, kx) in k.iter_mut().enumerate().take(xmax) {
            let v = filter(((x + xmin) as f64 - center + 0.5) * ss);
            *kx = v;
            ww += v;
        }
        if ww != 0.0 {
            for kx in k.iter_mut().take(xmax) {
                *kx /= ww;
            }
        }
        start.push(xmin);
        len.push(xmax);
    }
    (start, len, ksize, w)
}

/// Round half away from zero and truncate, as `(int)(v +- 0.5)` does in C.
fn quantise(v: f64, precision: u32) -> i32 {
    let s = v * f64::from(1u32 << precision);
    if s < 0.0 {
        (s - 0.5) as i32
    } else {
        (s + 0.5) as i32
    }
}

/// Pillow: `normalize_coeffs_8bpc`, 22 bits.
fn pil_taps(in_size: usize, out_size: usize, f: Filter) -> Taps {
    const PRECISION_BITS: u32 = 32 - 8 - 2;
    let filter = match f {
        Filter::Bicubic => cubic_pil,
        Filter::Bilinear => triangle,
    };
    let (start, len, ksize, w) = float_taps(in_size, out_size, filter, f.support());
    Taps {
        start,
        len,
        ksize,
        w: w.iter().map(|&v| quantise(v, PRECISION_BITS)).collect(),
        precision: PRECISION_BITS,
    }
}

/// ATen: `_compute_index_ranges_int16_weights`.
fn torch_taps(in_size: usize, out_size: usize, f: Filter) -> Taps {
    let filter = match f {
        Filter::Bicubic => cubic_aten,
        Filter::Bilinear => triangle,
    };
    let (start, len, ksize, w) = float_taps(in_size, out_size, filter, f.support());
    let wt_max = w.iter().copied().fold(0f64, f64::max);
    let mut precision = 0u32;
    while precision < 22 {
        let next = (0.5 + wt_max * f64::from(1u32 << (precision + 1))) as i32;
        if next >= 1 << 15 {
            break;
        }
        precision += 1;
    }
    let w = w
        .iter()
        .map(|&v| i32::from(quantise(v, precision) as i16))
        .collect();
    Taps {
        start,
        len,
        ksize,
        w,
        precision,
    }
}

/// Resize an interleaved RGB image from `(w, h)` to `(out_w, out_h)` with `filter`.
///
/// # Panics
/// Panics if `src.len() != w * h * 3` (a caller bug, not user input).
pub fn resize_rgb(
    src: &[u8],
    (w, h): (usize, usize),
    (out_w, out_h): (usize, usize),
    kernel: ResizeKernel,
    filter: Filter,
) -> Vec<u8> {
    assert_eq!(src.len(), w * h * 3, "image buffer does not match its size");
    let taps = |i, o| match kernel {
        ResizeKernel::Pil => pil_taps(i, o, filter),
        ResizeKernel::Torchvision => torch_taps(i, o, filter),
    };
    let horizontal = |img: &[u8], rows: usize| pass(img, rows, w, out_w, 3, &taps(w, out_w));
    // Rows are the "pixels" of the vertical pass; a row is `cols * 3` values.
    let vertical = |img: &[u8], cols: usize| pass(img, 1, h, out_h, cols * 3, &taps(h, out_h));
    match (out_w != w, out_h != h) {
        (false, false) => src.to_vec(),
        (true, false) => horizontal(src, h),
        (false, true) => vertical(src, w),
        (true, true) if kernel == ResizeKernel::Pil && pil_height_first(w, h, out_w, out_h) => {
            horizontal(&vertical(src, w), out_h)
        }
        (true, true) => vertical(&horizontal(src, h), out_w),
    }
}

/// Whether Pillow 13 resamples the height before the width (see the module
/// documentation): the height shrinks, by more than twice what the width
/// shrinks.
pub fn pil_height_first(w: usize, h: usize, out_w: usize, out_h: usize) -> bool {
    out_h < h && (h - out_h) as i64 > 2 * (w as i64 - out_w as i64)
}

/// One separable pass over `lines` independent lines of `n_in` samples of
/// `width` values each. Horizontal: a line is an image row and a sample one
/// RGB pixel (`width` 3). Vertical: one line whose samples are whole rows.
fn pass(src: &[u8], lines: usize, n_in: usize, n_out: usize, width: usize, t: &Taps) -> Vec<u8> {
    let half = 1i32 << (t.precision.max(1) - 1);
    let mut out = vec![0u8; lines * n_out * width];
    for line in 0..lines {
        let base_in = line * n_in * width;
        let base_out = line * n_out * width;
        for o in 0..n_out {
            let k = &t.w[o * t.ksize..o * t.ksize + t.len[o]];
            for c in 0..width {
                let mut acc = half;
                for (j, &kj) in k.iter().enumerate() {
                    acc += i32::from(src[base_in + (t.start[o] + j) * width + c]) * kj;
                }
                out[base_out + o * width + c] = (acc >> t.precision).clamp(0, 255) as u8;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pil_pass_order_follows_pillow_13() {
        // Where Pillow 13.0 switched to the height first, measured with
        // 200x200 and 300x200 images (width first below each threshold).
        for (w, h, oh, first_ow) in [
            (200, 200, 20, 112),
            (200, 200, 50, 126),
            (200, 200, 100, 152),
            (200, 300, 50, 76),
            (300, 200, 50, 226),
        ] {
            assert!(
                !pil_height_first(w, h, first_ow - 2, oh),
                "{w}x{h} -> {}x{oh}",
                first_ow - 2
            );
            assert!(
                pil_height_first(w, h, first_ow, oh),
                "{w}x{h} -> {first_ow}x{oh}"
            );
        }
        // Growing heights always go width first; a grown width with a shrunk height, height first.
        assert!(!pil_height_first(100, 100, 300, 300));
        assert!(pil_height_first(200, 200, 250, 100));
        // The golden CLIP image tall.png: 180x500 -> 140x388.
        assert!(pil_height_first(180, 500, 140, 388));
    }

    #[test]
    fn identity_size_is_a_copy() {
        let img: Vec<u8> = (0..4 * 3 * 3).map(|v| v as u8).collect();
        for k in [ResizeKernel::Pil, ResizeKernel::Torchvision] {
            assert_eq!(resize_rgb(&img, (4, 3), (4, 3), k, Filter::Bicubic), img);
        }
    }

    #[test]
    fn constant_image_stays_constant() {
        // Weights are normalised, so a flat image must come out flat at any scale.
        let img = vec![77u8; 37 * 23 * 3];
        for k in [ResizeKernel::Pil, ResizeKernel::Torchvision] {
            for (ow, oh) in [(10, 7), (64, 64), (37, 5), (3, 50)] {
                let out = resize_rgb(&img, (37, 23), (ow, oh), k, Filter::Bicubic);
                assert_eq!(out.len(), ow * oh * 3);
                assert!(out.iter().all(|&v| v == 77), "{k:?} {ow}x{oh}");
            }
        }
    }

    #[test]
    fn taps_sum_to_one() {
        for f in [Filter::Bicubic, Filter::Bilinear] {
            for (i, o) in [(100, 31), (31, 100), (7, 7), (1000, 3), (128, 320)] {
                for t in [torch_taps(i, o, f), pil_taps(i, o, f)] {
                    for x in 0..o {
                        let s: i32 = t.w[x * t.ksize..x * t.ksize + t.len[x]].iter().sum();
                        let one = 1i32 << t.precision;
                        assert!(
                            (s - one).abs() <= t.len[x] as i32,
                            "{f:?} {i}->{o} at {x}: {s} vs {one}"
                        );
                        assert!(t.start[x] + t.len[x] <= i);
                    }
                }
                // int16 weights: the largest must fit.
                assert!(torch_taps(i, o, f).w.iter().all(|&w| w.abs() < 1 << 15));
            }
        }
    }

    #[test]
    fn bilinear_is_narrower_than_bicubic() {
        // Upscaling: a triangle of support 1 reads 2 inputs per output
        // (3 taps allotted), the cubic 4 (5 allotted).
        let (lin, cub) = (
            pil_taps(10, 40, Filter::Bilinear),
            pil_taps(10, 40, Filter::Bicubic),
        );
        assert_eq!((lin.ksize, cub.ksize), (3, 5));
        // Output 20's centre is input 5.125: 0.375 on input 4, 0.625 on input 5.
        let one = f64::from(1u32 << lin.precision);
        let k = &lin.w[20 * lin.ksize..20 * lin.ksize + lin.len[20]];
        let nonzero: Vec<f64> = k
            .iter()
            .filter(|&&w| w != 0)
            .map(|&w| f64::from(w) / one)
            .collect();
        assert_eq!(nonzero.len(), 2, "{k:?}");
        assert!(
            (nonzero[0] - 0.375).abs() < 1e-6 && (nonzero[1] - 0.625).abs() < 1e-6,
            "{nonzero:?}"
        );
    }
}
