//! The size an image is resized to, as each processor chooses it
//! (`smart_resize`, a fixed resolution, SigLIP2's `naflex_size`), and the
//! resize itself.

use super::*;
use crate::error::PreprocessError;

/// transformers' `smart_resize`: the (height, width) an image is resized to.
///
/// Both sides become multiples of `factor`, the pixel count is kept within
/// `[min_pixels, max_pixels]` and the aspect ratio is kept as closely as
/// possible. Mirrors the Python float arithmetic, including round half to even.
///
/// One addition: `max_pixels` is a hard limit (a bucket's budget). Where
/// transformers' version can overshoot it (raising a tiny image to
/// `min_pixels` rounds sides up; a side held at `factor` in an extreme aspect
/// ratio), the size is scaled down again, then the longer side shortened.
/// With the processors' own limits (65,536 to 16,777,216 pixels) this never
/// changes a result.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: u64,
    max_pixels: u64,
) -> std::result::Result<(usize, usize), PreprocessError> {
    if height == 0 || width == 0 {
        return Err(PreprocessError::ZeroSize { width, height });
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > MAX_ASPECT_RATIO {
        return Err(PreprocessError::AspectRatio {
            ratio,
            width,
            height,
            limit: MAX_ASPECT_RATIO,
        });
    }
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    let max = max_pixels as f64;
    if h_bar * w_bar > max {
        let beta = ((h * w) / max).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    }
    if h_bar * w_bar > max {
        if h_bar > w_bar {
            h_bar = f.max((max / w_bar / f).floor() * f);
        } else {
            w_bar = f.max((max / h_bar / f).floor() * f);
        }
    }
    if h_bar * w_bar > max {
        return Err(PreprocessError::BudgetTooSmall { max_pixels, factor });
    }
    Ok((h_bar as usize, w_bar as usize))
}

/// Resize an RGB image as the processor would; returns the resized image.
pub fn resize_for_model(
    img: &RgbImage,
    cfg: &ImageProcessorConfig,
) -> std::result::Result<RgbImage, PreprocessError> {
    if let Some(f) = &cfg.fixed {
        return resize_fixed(img, f, cfg);
    }
    if let Some(n) = cfg.max_num_patches {
        return resize_naflex(img, n, cfg);
    }
    let (h, w) = if cfg.do_resize {
        smart_resize(
            img.height,
            img.width,
            cfg.factor(),
            cfg.min_pixels,
            cfg.max_pixels,
        )?
    } else {
        (img.height, img.width)
    };
    if h % cfg.factor() != 0 || w % cfg.factor() != 0 {
        return Err(PreprocessError::NotMultiple {
            width: img.width,
            height: img.height,
            factor: cfg.factor(),
        });
    }
    Ok(resampled(img, (w, h), cfg))
}

/// `img` resized to `(w, h)` with the processor's backend and filter.
pub(super) fn resampled(
    img: &RgbImage,
    (w, h): (usize, usize),
    cfg: &ImageProcessorConfig,
) -> RgbImage {
    RgbImage {
        width: w,
        height: h,
        data: resize_rgb(
            &img.data,
            (img.width, img.height),
            (w, h),
            cfg.kernel,
            cfg.filter,
        ),
    }
}

/// SigLIP2's `get_image_size_for_max_num_patches`: the (height, width) an
/// image is resized to. A binary search (on f64, as Python's floats) for the
/// largest scale at which both sides, rounded up to multiples of `patch`
/// (at least one patch), give at most `max_num_patches` patches.
pub fn naflex_size(
    height: usize,
    width: usize,
    patch: usize,
    max_num_patches: usize,
) -> std::result::Result<(usize, usize), PreprocessError> {
    if height == 0 || width == 0 {
        return Err(PreprocessError::ZeroSize { width, height });
    }
    let p = patch as f64;
    let scaled = |scale: f64, size: usize| -> f64 {
        let s = ((size as f64 * scale) / p).ceil() * p;
        s.max(p)
    };
    const EPS: f64 = 1e-5;
    let (mut lo, mut hi) = (EPS / 10.0, 100.0f64);
    while hi - lo >= EPS {
        let scale = (lo + hi) / 2.0;
        let (h, w) = (scaled(scale, height), scaled(scale, width));
        if (h / p) * (w / p) <= max_num_patches as f64 {
            lo = scale;
        } else {
            hi = scale;
        }
    }
    let (h, w) = (scaled(lo, height) as usize, scaled(lo, width) as usize);
    if (h / patch) * (w / patch) > max_num_patches {
        // Only a side over a million patches gets here: the search's
        // smallest scale (1e-6) is over the budget already.
        return Err(PreprocessError::OverBudget {
            width,
            height,
            patches: (h / patch) * (w / patch),
            max: max_num_patches,
        });
    }
    Ok((h, w))
}

/// A NaFlex resize ([`naflex_size`]) with the processor's filter.
pub(super) fn resize_naflex(
    img: &RgbImage,
    max_num_patches: usize,
    cfg: &ImageProcessorConfig,
) -> std::result::Result<RgbImage, PreprocessError> {
    let (h, w) = if cfg.do_resize {
        naflex_size(img.height, img.width, cfg.patch_size, max_num_patches)?
    } else {
        (img.height, img.width)
    };
    let p = cfg.patch_size;
    if h % p != 0 || w % p != 0 || (h / p) * (w / p) > max_num_patches {
        return Err(PreprocessError::NotPatches {
            width: img.width,
            height: img.height,
            patch: p,
            max: max_num_patches,
        });
    }
    Ok(resampled(img, (w, h), cfg))
}

/// A fixed-resolution encoder's resize and centre crop (transformers'
/// `resize` with `default_to_square=False`, then `center_crop`: the top
/// and left offsets are `(resized - crop) // 2`, which both backends
/// compute alike when the crop fits, as it does after a shortest-edge
/// resize to at least the crop).
pub(super) fn resize_fixed(
    img: &RgbImage,
    f: &FixedResize,
    cfg: &ImageProcessorConfig,
) -> std::result::Result<RgbImage, PreprocessError> {
    if img.width == 0 || img.height == 0 {
        return Err(PreprocessError::ZeroSize {
            width: img.width,
            height: img.height,
        });
    }
    let (h, w) = if cfg.do_resize {
        f.resized(img.height, img.width)
    } else {
        (img.height, img.width)
    };
    if h == 0 || w == 0 {
        return Err(PreprocessError::RoundsToZero {
            width: img.width,
            height: img.height,
        });
    }
    let resized = if (h, w) == (img.height, img.width) {
        img.clone()
    } else {
        resampled(img, (w, h), cfg)
    };
    let Some((ch, cw)) = f.crop else {
        if (h, w) != f.size {
            return Err(PreprocessError::NotFixedSize {
                width: w,
                height: h,
                want_width: f.size.1,
                want_height: f.size.0,
            });
        }
        return Ok(resized);
    };
    if ch > h || cw > w {
        return Err(PreprocessError::SmallerThanCrop {
            width: w,
            height: h,
            crop_width: cw,
            crop_height: ch,
        });
    }
    let (top, left) = ((h - ch) / 2, (w - cw) / 2);
    let mut data = Vec::with_capacity(ch * cw * 3);
    for y in top..top + ch {
        data.extend_from_slice(&resized.data[(y * w + left) * 3..(y * w + left + cw) * 3]);
    }
    Ok(RgbImage {
        width: cw,
        height: ch,
        data,
    })
}
