//! The image processor's configuration: transformers'
//! `preprocessor_config.json` read into [`ImageProcessorConfig`] (the Qwen-VL
//! processor's pixel budget, a fixed-resolution encoder's resize and crop,
//! SigLIP2's patch budget), and the normalisation constants.

use std::path::Path;

use serde_json::Value;

use super::*;
use crate::error::{Error, FieldError, Result};

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
pub(super) fn qwen_size(
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
pub(super) fn side_pair(path: &Path, key: &str, x: &Value) -> Result<(usize, usize)> {
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
pub(super) fn parse_fixed(
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
