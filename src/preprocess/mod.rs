//! Host-side preprocessing, matching transformers' Qwen2-VL image processor
//! (which Qwen2-VL, Qwen2.5-VL and Qwen3-VL all use for still images).
//!
//! decode -> RGB -> `smart_resize` -> bicubic resize with antialias ->
//! rescale and normalise (f32) -> duplicate to `temporal_patch_size` frames ->
//! patchify into merge-block order -> `pixel_values [n, C*T*P*P]`, `grid_thw`.

pub mod decode;
#[cfg(feature = "libjpeg-turbo")]
pub mod jpeg;
pub mod resize;

use std::path::Path;

use serde_json::Value;

pub use decode::{DecodeLimits, RgbImage, decode_rgb, load_rgb};
pub use resize::{Filter, ResizeKernel, resize_rgb};

use crate::error::{Error, FieldError, Result};
pub use crate::error::{ImageError, PreprocessError};

/// OpenAI CLIP's normalisation (`OPENAI_CLIP_MEAN`, `OPENAI_CLIP_STD` in
/// transformers), which the Qwen2-VL and Qwen2.5-VL processors use. The
/// digits are transformers' as written, more than an f32 holds.
#[allow(clippy::excessive_precision)]
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
#[allow(clippy::excessive_precision)]
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_58, 0.275_777_1];

/// ImageNet's mean and std (DINOv2's processor, `BitImageProcessor`).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The largest aspect ratio the processor accepts (`smart_resize` raises above it).
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// The image processor's settings, read from `preprocessor_config.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ImageProcessorConfig {
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    /// `size.shortest_edge` (older files: `min_pixels`): the least pixel count after resizing.
    pub min_pixels: u64,
    /// `size.longest_edge` (older files: `max_pixels`): the largest pixel count after resizing.
    pub max_pixels: u64,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    pub do_resize: bool,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    /// Which backend's arithmetic to reproduce: `Pil` when `image_processor_type`
    /// names the PIL backend, else torchvision (transformers 5's default).
    pub kernel: ResizeKernel,
    /// A fixed-resolution encoder's sizing (resize, centre crop) instead of
    /// `smart_resize`; `None` for the Qwen-VL processors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fixed: Option<FixedResize>,
    /// The resampling filter (`resample`: 3 bicubic, 2 bilinear).
    #[serde(skip_serializing_if = "Filter::is_bicubic")]
    pub filter: Filter,
    /// SigLIP2's NaFlex sizing (`max_num_patches`): the image keeps its
    /// aspect ratio, both sides become multiples of the patch and the patch
    /// count at most this ([`naflex_size`]); rows come out in raster order,
    /// (py, px, c) each. `None` for the other processors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_num_patches: Option<usize>,
}

/// How a fixed-resolution encoder's processor (CLIP's, SigLIP's, DINOv2's)
/// sizes an image: resize, then centre crop when `crop` is set. The result
/// is a square of [`FixedResize::side`] pixels.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedResize {
    /// `size.shortest_edge`: the shorter side is resized to this and the
    /// longer in proportion (truncated, as transformers'
    /// `get_resize_output_image_size`); `None`: resized to `size` exactly.
    pub shortest_edge: Option<usize>,
    /// `size.height`, `size.width` (when there is no shortest edge).
    pub size: (usize, usize),
    /// `crop_size` when `do_center_crop`.
    pub crop: Option<(usize, usize)>,
}

impl FixedResize {
    /// Side of the square the processor produces.
    pub fn side(&self) -> usize {
        self.crop.map_or(self.size.0, |c| c.0)
    }

    /// Check the sizes give one square; the error names the field.
    pub fn validate(&self) -> std::result::Result<(), FieldError> {
        const SQUARE: &str = "a square of positive side";
        if let Some((h, w)) = self.crop {
            if h != w || h == 0 {
                return Err(FieldError::range("crop_size", SQUARE, format!("{h}x{w}")));
            }
        } else if self.shortest_edge.is_some() {
            return Err(FieldError::invalid(
                "do_center_crop",
                "`size.shortest_edge` without a centre crop gives images \
                 of varying size; a fixed-resolution bucket needs one",
            ));
        }
        match self.shortest_edge {
            Some(0) => Err(FieldError::invalid(
                "size.shortest_edge",
                "expected a positive side",
            )),
            None if self.size.0 != self.size.1 || self.size.0 == 0 => Err(FieldError::range(
                "size",
                SQUARE,
                format!("{}x{}", self.size.0, self.size.1),
            )),
            _ => Ok(()),
        }
    }

    /// The same processing scaled to produce a square of `side` pixels: the
    /// crop (or size) becomes `side`, the shortest edge in proportion
    /// (rounded). Unchanged when `side` is what it produces already.
    pub fn scaled_to(&self, side: usize) -> FixedResize {
        let from = self.side();
        if side == from {
            return *self;
        }
        FixedResize {
            shortest_edge: self
                .shortest_edge
                .map(|e| ((e as f64 * side as f64 / from as f64).round() as usize).max(side)),
            size: (side, side),
            crop: self.crop.map(|_| (side, side)),
        }
    }

    /// (height, width) after the resize, before the crop.
    pub fn resized(&self, height: usize, width: usize) -> (usize, usize) {
        match self.shortest_edge {
            None => self.size,
            Some(s) => {
                if width <= height {
                    (((s as f64) * height as f64 / width as f64) as usize, s)
                } else {
                    (s, ((s as f64) * width as f64 / height as f64) as usize)
                }
            }
        }
    }
}

impl ImageProcessorConfig {
    /// transformers' Qwen2-VL image processor (which the Qwen-VL families
    /// share) with these sizes, pixel limits and normalisation; a family
    /// ([`crate::family::VisionConfig::default_preprocessor`]) gives the
    /// values its checkpoints ship, used when a model directory has no
    /// `preprocessor_config.json`.
    pub fn qwen2_vl_processor(
        (patch_size, temporal_patch_size, merge_size): (usize, usize, usize),
        (min_pixels, max_pixels): (u64, u64),
        image_mean: [f32; 3],
        image_std: [f32; 3],
    ) -> Self {
        ImageProcessorConfig {
            patch_size,
            temporal_patch_size,
            merge_size,
            min_pixels,
            max_pixels,
            image_mean,
            image_std,
            do_resize: true,
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            kernel: ResizeKernel::Torchvision,
            fixed: None,
            filter: Filter::Bicubic,
            max_num_patches: None,
        }
    }

    /// SigLIP2's NaFlex image processor (`Siglip2ImageProcessor`): at most
    /// `max_num_patches` patches of `patch_size`, the aspect ratio kept,
    /// bilinear, mean = std = 0.5; rows in raster order, (py, px, c).
    pub fn naflex_processor(patch_size: usize, max_num_patches: usize) -> Self {
        let cap = (max_num_patches * patch_size * patch_size) as u64;
        ImageProcessorConfig {
            filter: Filter::Bilinear,
            max_num_patches: Some(max_num_patches),
            temporal_patch_size: 1,
            merge_size: 1,
            ..Self::qwen2_vl_processor(
                (patch_size, 1, 1),
                ((patch_size * patch_size) as u64, cap),
                [0.5; 3],
                [0.5; 3],
            )
        }
    }

    /// A fixed-resolution encoder's image processor (CLIP, SigLIP, DINOv2):
    /// `fixed`'s resize and crop, patches of `patch_size`, one frame, no
    /// merging; rows come out in raster order.
    pub fn fixed_processor(
        patch_size: usize,
        fixed: FixedResize,
        image_mean: [f32; 3],
        image_std: [f32; 3],
    ) -> Self {
        let side = fixed.side() as u64;
        ImageProcessorConfig {
            fixed: Some(fixed),
            temporal_patch_size: 1,
            merge_size: 1,
            ..Self::qwen2_vl_processor(
                (patch_size, 1, 1),
                (side * side, side * side),
                image_mean,
                image_std,
            )
        }
    }

    /// Parse `preprocessor_config.json`; `defaults` supplies fields the file omits.
    pub fn from_json(path: &Path, text: &str, defaults: &ImageProcessorConfig) -> Result<Self> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::config(path, format!("invalid JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| Error::config(path, "expected a JSON object"))?;
        let mut c = defaults.clone();
        let uint = |key: &str| -> Result<Option<u64>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x.as_u64().map(Some).ok_or_else(|| {
                    Error::config(
                        path,
                        format!("field `{key}`: expected a non-negative integer, got {x}"),
                    )
                }),
            }
        };
        let flag = |key: &str, cur: bool| -> Result<bool> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(cur),
                Some(Value::Bool(b)) => Ok(*b),
                Some(x) => Err(Error::config(
                    path,
                    format!("field `{key}`: expected true or false, got {x}"),
                )),
            }
        };
        let triple = |key: &str, cur: [f32; 3]| -> Result<[f32; 3]> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(cur),
                Some(Value::Number(n)) => {
                    let f = n.as_f64().unwrap_or(f64::NAN) as f32;
                    Ok([f; 3])
                }
                Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_number) => {
                    let mut out = [0f32; 3];
                    for (o, x) in out.iter_mut().zip(a) {
                        *o = x.as_f64().unwrap_or(f64::NAN) as f32;
                    }
                    Ok(out)
                }
                Some(x) => Err(Error::config(
                    path,
                    format!("field `{key}`: expected 3 numbers, got {x}"),
                )),
            }
        };
        if let Some(p) = uint("patch_size")? {
            c.patch_size = p as usize;
        }
        if let Some(p) = uint("temporal_patch_size")? {
            c.temporal_patch_size = p as usize;
        }
        if let Some(p) = uint("merge_size")? {
            c.merge_size = p as usize;
        }
        if let Some(p) = uint("min_pixels")? {
            c.min_pixels = p;
        }
        if let Some(p) = uint("max_pixels")? {
            c.max_pixels = p;
        }
        if let Some(fixed) = &mut c.fixed {
            parse_fixed(path, obj, fixed)?;
        } else if c.max_num_patches.is_some() {
            if let Some(n) = uint("max_num_patches")? {
                if n == 0 || n > 1 << 20 {
                    return Err(Error::config(
                        path,
                        format!("field `max_num_patches`: expected 1..=1048576, got {n}"),
                    ));
                }
                c.max_num_patches = Some(n as usize);
            }
            // Pixel limits follow the budget (reports show them; the
            // resize reads the budget alone).
            let (n, pp) = (
                c.max_num_patches.unwrap_or(1) as u64,
                (c.patch_size * c.patch_size) as u64,
            );
            c.min_pixels = pp;
            c.max_pixels = n * pp;
        } else {
            qwen_size(path, obj, &mut c)?;
        }
        c.image_mean = triple("image_mean", c.image_mean)?;
        c.image_std = triple("image_std", c.image_std)?;
        c.do_resize = flag("do_resize", c.do_resize)?;
        c.do_rescale = flag("do_rescale", c.do_rescale)?;
        c.do_normalize = flag("do_normalize", c.do_normalize)?;
        if !flag("do_convert_rgb", true)? {
            return Err(Error::config(
                path,
                "field `do_convert_rgb`: false is not supported (images are always converted to RGB)",
            ));
        }
        if let Some(x) = obj.get("rescale_factor") {
            c.rescale_factor = x.as_f64().ok_or_else(|| {
                Error::config(
                    path,
                    format!("field `rescale_factor`: expected a number, got {x}"),
                )
            })?;
        }
        if let Some(r) = uint("resample")? {
            // PILImageResampling: BILINEAR == 2, BICUBIC == 3.
            c.filter = match r {
                3 => Filter::Bicubic,
                2 => Filter::Bilinear,
                _ => {
                    return Err(Error::config(
                        path,
                        format!(
                            "field `resample`: only 3 (bicubic) and 2 (bilinear) are supported, got {r}"
                        ),
                    ));
                }
            };
        }
        if let Some(t) = obj.get("image_processor_type").and_then(Value::as_str) {
            c.kernel = if t.to_ascii_lowercase().contains("pil") {
                ResizeKernel::Pil
            } else {
                ResizeKernel::Torchvision
            };
        }
        c.validate().map_err(|e| Error::field(path, e))?;
        Ok(c)
    }

    fn validate(&self) -> std::result::Result<(), FieldError> {
        for (name, v) in [
            ("patch_size", self.patch_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("merge_size", self.merge_size),
        ] {
            if v == 0 || v > 1024 {
                return Err(FieldError::range(name, "1..=1024", v));
            }
        }
        if self.min_pixels > self.max_pixels {
            return Err(FieldError::Inconsistent(format!(
                "min pixels ({}) exceed max pixels ({})",
                self.min_pixels, self.max_pixels
            )));
        }
        if self.image_std.iter().any(|s| !s.is_finite() || *s == 0.0)
            || self.image_mean.iter().any(|m| !m.is_finite())
        {
            return Err(FieldError::Inconsistent(
                "field `image_mean`/`image_std`: expected finite values and a nonzero std".into(),
            ));
        }
        if !(self.rescale_factor.is_finite() && self.rescale_factor > 0.0) {
            return Err(FieldError::range(
                "rescale_factor",
                "a positive number",
                self.rescale_factor,
            ));
        }
        Ok(())
    }

    /// `patch_size * merge_size`: both sides of a resized image are multiples of it.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// Columns of one `pixel_values` row: `3 * T * P * P`.
    pub fn row_len(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

/// `size` of a Qwen-VL processor: pixel counts (`shortest_edge`, `longest_edge`).
fn qwen_size(
    path: &Path,
    obj: &serde_json::Map<String, Value>,
    c: &mut ImageProcessorConfig,
) -> Result<()> {
    match obj.get("size") {
        None | Some(Value::Null) => {}
        Some(Value::Object(size)) => {
            for (key, slot) in [
                ("shortest_edge", &mut c.min_pixels),
                ("longest_edge", &mut c.max_pixels),
            ] {
                if let Some(x) = size.get(key) {
                    *slot = x.as_u64().ok_or_else(|| {
                        Error::config(
                            path,
                            format!("field `size.{key}`: expected a pixel count, got {x}"),
                        )
                    })?;
                }
            }
        }
        Some(x) => {
            return Err(Error::config(
                path,
                format!("field `size`: expected an object, got {x}"),
            ));
        }
    }
    Ok(())
}

/// A side given as an integer or as `{"height": h, "width": w}` (`key` names it).
fn side_pair(path: &Path, key: &str, x: &Value) -> Result<(usize, usize)> {
    let n = |v: &Value| {
        v.as_u64()
            .filter(|&v| v > 0 && v <= 1 << 16)
            .map(|v| v as usize)
    };
    let bad = || {
        Error::config(
            path,
            format!(
                "field `{key}`: expected a side in pixels or {{\"height\", \"width\"}}, got {x}"
            ),
        )
    };
    match x {
        Value::Object(o) => match (o.get("height").and_then(n), o.get("width").and_then(n)) {
            (Some(h), Some(w)) => Ok((h, w)),
            _ => Err(bad()),
        },
        v => n(v).map(|s| (s, s)).ok_or_else(bad),
    }
}

/// `size`, `crop_size` and `do_center_crop` of a fixed-resolution encoder's processor.
fn parse_fixed(
    path: &Path,
    obj: &serde_json::Map<String, Value>,
    f: &mut FixedResize,
) -> Result<()> {
    match obj.get("size") {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) if o.contains_key("shortest_edge") => {
            let s = o["shortest_edge"]
                .as_u64()
                .filter(|&v| v > 0 && v <= 1 << 16)
                .ok_or_else(|| {
                    Error::config(
                        path,
                        format!(
                            "field `size.shortest_edge`: expected a side in pixels, got {}",
                            o["shortest_edge"]
                        ),
                    )
                })?;
            f.shortest_edge = Some(s as usize);
        }
        Some(x) => {
            f.size = side_pair(path, "size", x)?;
            f.shortest_edge = None;
        }
    }
    let crop = match obj.get("do_center_crop") {
        None | Some(Value::Null) => f.crop.is_some(),
        Some(Value::Bool(b)) => *b,
        Some(x) => {
            return Err(Error::config(
                path,
                format!("field `do_center_crop`: expected true or false, got {x}"),
            ));
        }
    };
    f.crop = if crop {
        match obj.get("crop_size") {
            None | Some(Value::Null) => f.crop.or(Some(f.size)),
            Some(x) => Some(side_pair(path, "crop_size", x)?),
        }
    } else {
        None
    };
    f.validate().map_err(|e| Error::field(path, e))
}

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

/// One preprocessed image (or a batch of them, concatenated).
#[derive(Clone, Debug)]
pub struct PixelBatch {
    /// `[n, 3*T*P*P]` row major; rows in merge-block order per image.
    pub pixel_values: Vec<f32>,
    /// Columns per row.
    pub row_len: usize,
    /// `(t, h, w)` in patches, one per image.
    pub grid_thw: Vec<[usize; 3]>,
}

impl PixelBatch {
    /// Total number of patch rows.
    pub fn rows(&self) -> usize {
        self.pixel_values.len() / self.row_len.max(1)
    }

    /// Concatenate several batches into one call.
    pub fn concat(parts: Vec<PixelBatch>) -> Result<PixelBatch> {
        let row_len = parts.first().map_or(0, |p| p.row_len);
        let mut out = PixelBatch {
            pixel_values: Vec::new(),
            row_len,
            grid_thw: Vec::new(),
        };
        for p in parts {
            if p.row_len != row_len {
                return Err(PreprocessError::RowLengths(row_len, p.row_len).into());
            }
            out.pixel_values.extend(p.pixel_values);
            out.grid_thw.extend(p.grid_thw);
        }
        Ok(out)
    }
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
fn resampled(img: &RgbImage, (w, h): (usize, usize), cfg: &ImageProcessorConfig) -> RgbImage {
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
fn resize_naflex(
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
fn resize_fixed(
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

/// Rescale and normalise one 8-bit level in channel `c` exactly as the chosen
/// backend does in f32.
fn normalise_table(cfg: &ImageProcessorConfig) -> [[f32; 256]; 3] {
    let mut t = [[0f32; 256]; 3];
    for (c, tc) in t.iter_mut().enumerate() {
        for (l, v) in tc.iter_mut().enumerate() {
            *v = match (cfg.kernel, cfg.do_rescale, cfg.do_normalize) {
                // torchvision fuses rescale into mean and std: (x - m/r) / (s/r).
                (ResizeKernel::Torchvision, true, true) => {
                    let inv = (1.0 / cfg.rescale_factor) as f32;
                    (l as f32 - cfg.image_mean[c] * inv) / (cfg.image_std[c] * inv)
                }
                // numpy: rescale in f64, cast to f32, then (x - m) / s in f32.
                (_, true, norm) => {
                    let x = (l as f64 * cfg.rescale_factor) as f32;
                    if norm {
                        (x - cfg.image_mean[c]) / cfg.image_std[c]
                    } else {
                        x
                    }
                }
                (_, false, true) => (l as f32 - cfg.image_mean[c]) / cfg.image_std[c],
                (_, false, false) => l as f32,
            };
        }
    }
    t
}

/// Patchify a resized image into merge-block order.
///
/// Rows are ordered (block_row, block_col, in_row, in_col); each row holds
/// (c, t, py, px) with the still image repeated over the T temporal frames.
pub fn patchify(img: &RgbImage, cfg: &ImageProcessorConfig) -> PixelBatch {
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let (gh, gw) = (img.height / p, img.width / p);
    let table = normalise_table(cfg);
    if cfg.max_num_patches.is_some() {
        return patchify_channels_last(img, p, &table);
    }
    let row_len = cfg.row_len();
    let mut out = vec![0f32; gh * gw * row_len];
    let mut r = 0;
    for br in 0..gh / m {
        for bc in 0..gw / m {
            for ir in 0..m {
                for ic in 0..m {
                    let (pr, pc) = (br * m + ir, bc * m + ic);
                    let row = &mut out[r * row_len..(r + 1) * row_len];
                    for c in 0..3 {
                        for py in 0..p {
                            let y = pr * p + py;
                            for px in 0..p {
                                let x = pc * p + px;
                                let v = table[c][img.data[(y * img.width + x) * 3 + c] as usize];
                                for ti in 0..t {
                                    row[((c * t + ti) * p + py) * p + px] = v;
                                }
                            }
                        }
                    }
                    r += 1;
                }
            }
        }
    }
    PixelBatch {
        pixel_values: out,
        row_len,
        grid_thw: vec![[1, gh, gw]],
    }
}

/// SigLIP2's `convert_image_to_patches`: rows in raster order of patches,
/// each (py, px, c).
fn patchify_channels_last(img: &RgbImage, p: usize, table: &[[f32; 256]; 3]) -> PixelBatch {
    let (gh, gw) = (img.height / p, img.width / p);
    let row_len = 3 * p * p;
    let mut out = Vec::with_capacity(gh * gw * row_len);
    for pr in 0..gh {
        for pc in 0..gw {
            for py in 0..p {
                let y = pr * p + py;
                for px in 0..p {
                    let x = pc * p + px;
                    for (c, tc) in table.iter().enumerate() {
                        out.push(tc[img.data[(y * img.width + x) * 3 + c] as usize]);
                    }
                }
            }
        }
    }
    PixelBatch {
        pixel_values: out,
        row_len,
        grid_thw: vec![[1, gh, gw]],
    }
}

/// Decoded, resized and patchified image, with the intermediate sizes kept for reports.
#[derive(Clone, Debug)]
pub struct Preprocessed {
    pub original: (usize, usize),
    pub resized: RgbImage,
    pub batch: PixelBatch,
}

/// The whole host-side pipeline for one image file.
pub fn preprocess_file(
    path: &Path,
    cfg: &ImageProcessorConfig,
    limits: DecodeLimits,
) -> Result<Preprocessed> {
    let img = load_rgb(path, limits)?;
    preprocess_rgb(img, cfg).map_err(|m| Error::image(path, ImageError::Preprocess(m)))
}

/// The pipeline after decoding. The error is [`resize_for_model`]'s
/// message: `runtime` (typed in a later step) still takes it as one.
pub fn preprocess_rgb(
    img: RgbImage,
    cfg: &ImageProcessorConfig,
) -> std::result::Result<Preprocessed, String> {
    let original = (img.width, img.height);
    let resized = resize_for_model(&img, cfg).map_err(|e| e.to_string())?;
    let batch = patchify(&resized, cfg);
    Ok(Preprocessed {
        original,
        resized,
        batch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_matches_python() {
        // Values computed with transformers' smart_resize (factor 32, Qwen3-VL limits).
        let f = |h, w| smart_resize(h, w, 32, 65_536, 16_777_216).unwrap();
        assert_eq!(f(300, 300), (288, 288));
        assert_eq!(f(1010, 1030), (1024, 1024));
        assert_eq!(f(12, 20), (224, 352));
        // Half to even: 48 / 32 = 1.5 rounds to 2.
        assert_eq!(smart_resize(48, 48, 32, 0, u64::MAX).unwrap(), (64, 64));
        assert!(smart_resize(20, 4001, 32, 0, u64::MAX).is_err());
        // A bucket's budget is a hard limit: a tiny image raised to the
        // minimum, and an extreme aspect ratio, stay within 128 patches.
        let cap = 128 * 256;
        let (h, w) = smart_resize(12, 20, 32, cap, cap).unwrap();
        assert!(h * w <= cap as usize && (h, w) == (128, 224), "{h}x{w}");
        let (h, w) = smart_resize(20, 3200, 32, cap, cap).unwrap();
        assert!(h * w <= cap as usize && h == 32, "{h}x{w}");
        let e = smart_resize(20, 20, 32, 0, 500).unwrap_err();
        assert_eq!(
            e,
            PreprocessError::BudgetTooSmall {
                max_pixels: 500,
                factor: 32
            }
        );
        assert_eq!(
            e.to_string(),
            "a budget of 500 pixels cannot hold one 32x32 block"
        );
        let e = smart_resize(20, 4001, 32, 0, u64::MAX).unwrap_err();
        assert!(
            matches!(
                e,
                PreprocessError::AspectRatio {
                    width: 4001,
                    height: 20,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "aspect ratio 200.1 (4001x20) is above the limit of 200"
        );
        assert_eq!(
            smart_resize(0, 5, 32, 0, 500),
            Err(PreprocessError::ZeroSize {
                width: 5,
                height: 0
            })
        );
        // Over the budget: scaled down, then floored to the factor.
        assert_eq!(
            smart_resize(1000, 1000, 32, 0, 1024 * 256).unwrap(),
            (512, 512)
        );
        assert_eq!(
            smart_resize(1000, 700, 32, 0, 1024 * 256).unwrap(),
            (608, 416)
        );
    }

    #[test]
    fn patchify_orders_merge_blocks() {
        let cfg = ImageProcessorConfig {
            do_normalize: false,
            do_rescale: false,
            ..ImageProcessorConfig::qwen2_vl_processor(
                (1, 2, 2),
                (65_536, 16_777_216),
                [0.5; 3],
                [0.5; 3],
            )
        };
        // 4x4 image, pixel value = 10*row + col in every channel.
        let mut data = Vec::new();
        for y in 0..4u8 {
            for x in 0..4u8 {
                data.extend_from_slice(&[10 * y + x; 3]);
            }
        }
        let b = patchify(
            &RgbImage {
                width: 4,
                height: 4,
                data,
            },
            &cfg,
        );
        assert_eq!(b.grid_thw, vec![[1, 4, 4]]);
        assert_eq!(b.row_len, 6);
        let first: Vec<f32> = (0..16).map(|r| b.pixel_values[r * 6]).collect();
        let expect = [
            0., 1., 10., 11., 2., 3., 12., 13., 20., 21., 30., 31., 22., 23., 32., 33.,
        ];
        assert_eq!(first, expect);
        // Both temporal frames hold the same value.
        assert!(b.pixel_values.chunks(2).all(|p| p[0] == p[1]));
    }
}
