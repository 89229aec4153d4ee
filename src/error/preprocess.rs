//! Why an image cannot be used: decoded ([`ImageError`], `preprocess`'s
//! decoders raise it; [`super::Error::Image`] names the file) or sized for
//! the model ([`PreprocessError`], `preprocess`'s resizes raise it).

/// Why one image could not be used ([`super::Error::Image`] names the file).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImageError {
    #[error("empty file, expected a JPEG, PNG or WebP image")]
    Empty,
    /// Another image format (its name).
    #[error("{0} images are not supported, expected JPEG, PNG or WebP")]
    Unsupported(String),
    #[error("not a JPEG, PNG or WebP image")]
    NotAnImage,
    #[error("image has zero size ({width}x{height})")]
    ZeroSize { width: u64, height: u64 },
    /// More pixels than the decode limit (a decompression bomb, or a photo
    /// to scale down first).
    #[error("image is {width}x{height} = {} pixels, above the limit of {limit} pixels (possible decompression bomb)", width * height)]
    TooLarge { width: u64, height: u64, limit: u64 },
    /// More patches than allowed (`--max-patches`).
    #[error("needs {patches} patches, more than --max-patches {max}")]
    TooManyPatches { patches: u64, max: u64 },
    /// A JPEG of other than 8-bit samples (Pillow reads those only).
    #[error("{0}-bit JPEG samples are not supported (Pillow reads 8-bit JPEGs only)")]
    JpegPrecision(i32),
    /// A row wider than the JPEG decoder addresses.
    #[error("image is too wide ({0} pixels)")]
    TooWide(usize),
    /// Decoded to a pixel format the conversion to RGB does not know (its name).
    #[error("unsupported pixel format {0}")]
    PixelFormat(String),
    /// libjpeg-turbo could not allocate its decompressor.
    #[error("libjpeg-turbo could not allocate a decompressor")]
    NoDecompressor,
    /// The decoder failed: truncated or corrupt data (its message).
    #[error("{0}")]
    Corrupt(String),
    /// Decoded, but the model's preprocessing refused it (its message, e.g.
    /// an aspect ratio beyond what the processor allows).
    #[error("{0}")]
    Preprocess(PreprocessError),
}

/// Why an image cannot be sized as the model's processor sizes it, or
/// preprocessed images cannot be batched. Sizes are `width x height`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PreprocessError {
    #[error("image has zero size ({width}x{height})")]
    ZeroSize { width: usize, height: usize },
    /// A longer side more than `limit` times the shorter (`smart_resize`
    /// refuses it, as transformers' does).
    #[error("aspect ratio {ratio:.1} ({width}x{height}) is above the limit of {limit}")]
    AspectRatio {
        ratio: f64,
        width: usize,
        height: usize,
        limit: f64,
    },
    /// A pixel budget smaller than one block of `factor` x `factor`.
    #[error("a budget of {max_pixels} pixels cannot hold one {factor}x{factor} block")]
    BudgetTooSmall { max_pixels: u64, factor: usize },
    /// With `do_resize` false, sides that are not multiples of `factor`.
    #[error(
        "image is {width}x{height} but both sides must be multiples of {factor} when do_resize is false"
    )]
    NotMultiple {
        width: usize,
        height: usize,
        factor: usize,
    },
    /// More patches than SigLIP2's budget even at the smallest scale.
    #[error(
        "image is {width}x{height}: even at its smallest it takes {patches} patches, over the budget of {max}"
    )]
    OverBudget {
        width: usize,
        height: usize,
        patches: usize,
        max: usize,
    },
    /// With `do_resize` false, a NaFlex image whose sides are not
    /// multiples of the patch or that holds more patches than the budget.
    #[error(
        "image is {width}x{height} but must be multiples of {patch} within {max} patches when do_resize is false"
    )]
    NotPatches {
        width: usize,
        height: usize,
        patch: usize,
        max: usize,
    },
    /// A shortest-edge resize that rounds the other side to nothing.
    #[error("image is {width}x{height}: its resized shorter side rounds to 0 pixels")]
    RoundsToZero { width: usize, height: usize },
    /// With `do_resize` false, an image of another size than the fixed one.
    #[error(
        "image is {width}x{height} but must be {want_width}x{want_height} when do_resize is false"
    )]
    NotFixedSize {
        width: usize,
        height: usize,
        want_width: usize,
        want_height: usize,
    },
    /// A resized image smaller than the centre crop.
    #[error(
        "image is {width}x{height} after resizing, smaller than the {crop_width}x{crop_height} crop"
    )]
    SmallerThanCrop {
        width: usize,
        height: usize,
        crop_width: usize,
        crop_height: usize,
    },
    /// Images whose rows differ in length cannot be one batch.
    #[error("cannot batch images with rows of {0} and {1} values")]
    RowLengths(usize, usize),
}
