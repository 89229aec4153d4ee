//! Decoding image files into 8-bit RGB the way transformers does.
//!
//! transformers opens an image with Pillow, applies the EXIF orientation
//! (`ImageOps.exif_transpose`) and then `convert_to_rgb`: an image with an
//! alpha channel (or a transparency key) is composited onto opaque white with
//! Pillow's integer `alpha_composite`; anything else goes through
//! `Image.convert("RGB")`. This module reproduces those conversions for the
//! pixel formats JPEG, PNG and WebP decode to, including Pillow's quirks:
//!
//! * 16-bit grayscale PNGs open as mode `I;16`, whose conversion to RGB clips
//!   every value above 255 to 255 (it does not rescale).
//! * 16-bit RGB(A) PNGs open as 8-bit RGB(A) keeping the high byte.
//! * JPEGs are decoded by libjpeg-turbo as Pillow decodes them, bit for bit
//!   ([`super::jpeg`]); CMYK JPEGs are read inverted, as Pillow assumes.
//!   Built without the default `libjpeg-turbo` feature (no C compiler or
//!   cmake), JPEGs go through the `image` crate's pure-Rust decoder instead,
//!   whose IDCT and chroma upsampling differ from libjpeg-turbo's by a few
//!   levels on lossy images.

use std::io::Cursor;
use std::path::Path;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

use crate::error::{Error, ImageError, Result};

/// Limits applied before any pixel is decoded.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLimits {
    /// Refuse images with more pixels than this (a decompression bomb guard).
    /// The default is Pillow's own error threshold, `2 * 89_478_485`.
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_pixels: 2 * 89_478_485,
        }
    }
}

/// An 8-bit RGB image, interleaved, row major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    /// `height * width * 3` bytes.
    pub data: Vec<u8>,
}

/// Read and decode an image file; see [`decode_rgb`].
pub fn load_rgb(path: &Path, limits: DecodeLimits) -> Result<RgbImage> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    decode_rgb(&bytes, path, limits)
}

/// Decode JPEG, PNG or WebP bytes into upright 8-bit RGB. `name` is used in
/// error messages only.
pub fn decode_rgb(bytes: &[u8], name: &Path, limits: DecodeLimits) -> Result<RgbImage> {
    let typed = |error: ImageError| Error::image(name, error);
    let err = |msg: String| typed(ImageError::Corrupt(msg));
    if bytes.is_empty() {
        return Err(typed(ImageError::Empty));
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| err(format!("cannot read: {e}")))?;
    match reader.format() {
        Some(ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP) => {}
        Some(other) => return Err(typed(ImageError::Unsupported(format!("{other:?}")))),
        None => return Err(typed(ImageError::NotAnImage)),
    }
    #[cfg(feature = "libjpeg-turbo")]
    if reader.format() == Some(ImageFormat::Jpeg) {
        return decode_jpeg(bytes, limits).map_err(typed);
    }
    let mut reader = reader;
    let mut image_limits = image::Limits::default();
    // 8 bytes per pixel covers RGBA16, the widest format these decoders produce.
    image_limits.max_alloc = Some(limits.max_pixels.saturating_mul(8).saturating_add(1 << 20));
    reader.limits(image_limits);
    let mut decoder = reader
        .into_decoder()
        .map_err(|e| err(format!("cannot decode header: {e}")))?;
    let (w, h) = decoder.dimensions();
    check_size(u64::from(w), u64::from(h), limits).map_err(typed)?;
    let orientation = decoder
        .orientation()
        .map_err(|e| err(format!("cannot read EXIF orientation: {e}")))?;
    let mut img = DynamicImage::from_decoder(decoder)
        .map_err(|e| err(format!("cannot decode (truncated or corrupt?): {e}")))?;
    img.apply_orientation(orientation);
    to_rgb_like_pil(img).map_err(typed)
}

fn check_size(w: u64, h: u64, limits: DecodeLimits) -> std::result::Result<(), ImageError> {
    if w == 0 || h == 0 {
        return Err(ImageError::ZeroSize {
            width: w,
            height: h,
        });
    }
    if w * h > limits.max_pixels {
        return Err(ImageError::TooLarge {
            width: w,
            height: h,
            limit: limits.max_pixels,
        });
    }
    Ok(())
}

/// A JPEG through libjpeg-turbo, then Pillow's EXIF transpose.
#[cfg(feature = "libjpeg-turbo")]
fn decode_jpeg(bytes: &[u8], limits: DecodeLimits) -> std::result::Result<RgbImage, ImageError> {
    use image::metadata::Orientation;
    let d = super::jpeg::decode(bytes, |w, h| check_size(w as u64, h as u64, limits))?;
    let (w, h) = (d.width as u32, d.height as u32);
    let bad = || ImageError::Corrupt("decoded buffer does not match the image size".into());
    let mut img = if d.gray {
        DynamicImage::ImageLuma8(image::GrayImage::from_raw(w, h, d.data).ok_or_else(bad)?)
    } else {
        DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, d.data).ok_or_else(bad)?)
    };
    if let Some(o) = super::jpeg::exif(bytes).and_then(Orientation::from_exif_chunk) {
        img.apply_orientation(o);
    }
    to_rgb_like_pil(img)
}

/// Pillow's `alpha_composite(white, src)` for one channel pair, as in
/// `libImaging/AlphaComposite.c` (7 extra bits of precision, rounded divisions).
fn composite_on_white(v: u8, a: u8) -> u8 {
    const PRECISION_BITS: u32 = 7;
    let shift_div255 = |x: u32| ((x >> 8) + x) >> 8;
    if a == 0 {
        return 255;
    }
    let a = u32::from(a);
    let blend = 255 * (255 - a);
    let outa255 = a * 255 + blend;
    let coef1 = a * 255 * 255 * (1 << PRECISION_BITS) / outa255;
    let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
    let tmp = u32::from(v) * coef1 + 255 * coef2;
    (shift_div255(tmp + (0x80 << PRECISION_BITS)) >> PRECISION_BITS) as u8
}

fn to_rgb_like_pil(img: DynamicImage) -> std::result::Result<RgbImage, ImageError> {
    let (width, height) = (img.width() as usize, img.height() as usize);
    let n = width * height;
    let mut data = Vec::with_capacity(n * 3);
    match img {
        DynamicImage::ImageRgb8(b) => data = b.into_raw(),
        DynamicImage::ImageRgba8(b) => {
            for p in b.as_raw().chunks_exact(4) {
                for c in 0..3 {
                    data.push(composite_on_white(p[c], p[3]));
                }
            }
        }
        DynamicImage::ImageLuma8(b) => {
            for &v in b.as_raw() {
                data.extend_from_slice(&[v, v, v]);
            }
        }
        DynamicImage::ImageLumaA8(b) => {
            for p in b.as_raw().chunks_exact(2) {
                let v = composite_on_white(p[0], p[1]);
                data.extend_from_slice(&[v, v, v]);
            }
        }
        DynamicImage::ImageLuma16(b) => {
            // Pillow's `I;16` -> RGB clips instead of rescaling.
            for &v in b.as_raw() {
                let v = v.min(255) as u8;
                data.extend_from_slice(&[v, v, v]);
            }
        }
        DynamicImage::ImageLumaA16(b) => {
            // Pillow opens 16-bit gray+alpha PNGs as 8-bit LA (high bytes).
            for p in b.as_raw().chunks_exact(2) {
                let v = composite_on_white((p[0] >> 8) as u8, (p[1] >> 8) as u8);
                data.extend_from_slice(&[v, v, v]);
            }
        }
        DynamicImage::ImageRgb16(b) => {
            data.extend(b.as_raw().iter().map(|&v| (v >> 8) as u8));
        }
        DynamicImage::ImageRgba16(b) => {
            for p in b.as_raw().chunks_exact(4) {
                let a = (p[3] >> 8) as u8;
                for &v in &p[..3] {
                    data.push(composite_on_white((v >> 8) as u8, a));
                }
            }
        }
        other => {
            return Err(ImageError::PixelFormat(format!("{:?}", other.color())));
        }
    }
    debug_assert_eq!(data.len(), n * 3);
    Ok(RgbImage {
        width,
        height,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(w: u32, h: u32, format: ImageFormat) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(image::RgbImage::new(w, h))
            .write_to(&mut out, format)
            .unwrap();
        out.into_inner()
    }

    /// What went wrong comes back as a variant, whichever decoder ran.
    #[test]
    fn decode_failures_are_typed() {
        let name = Path::new("x");
        let small = DecodeLimits { max_pixels: 15 };
        let kind = |bytes: &[u8], limits| match decode_rgb(bytes, name, limits) {
            Err(Error::Image { error, .. }) => error,
            other => panic!("expected an image error, got {other:?}"),
        };
        assert_eq!(kind(&[], small), ImageError::Empty);
        assert_eq!(kind(b"plain text", small), ImageError::NotAnImage);
        assert_eq!(
            kind(b"GIF89a\x04\x00\x04\x00\x00\x00\x00;", small),
            ImageError::Unsupported("Gif".into())
        );
        let too_large = ImageError::TooLarge {
            width: 4,
            height: 4,
            limit: 15,
        };
        assert_eq!(kind(&encoded(4, 4, ImageFormat::Png), small), too_large);
        assert_eq!(kind(&encoded(4, 4, ImageFormat::Jpeg), small), too_large);
        let png = encoded(4, 4, ImageFormat::Png);
        let big = DecodeLimits::default();
        assert!(matches!(
            kind(&png[..png.len() - 20], big),
            ImageError::Corrupt(_)
        ));
        let jpeg = encoded(4, 4, ImageFormat::Jpeg);
        assert!(matches!(
            kind(&jpeg[..jpeg.len() / 2], big),
            ImageError::Corrupt(_)
        ));
    }

    #[test]
    fn composite_matches_pillow_corner_cases() {
        // Opaque pixels are unchanged; transparent ones become white.
        for v in [0u8, 1, 127, 128, 254, 255] {
            assert_eq!(composite_on_white(v, 255), v);
            assert_eq!(composite_on_white(v, 0), 255);
        }
        // Values checked against Pillow 13: (0, a=128) -> 127, (10, a=77) -> 181.
        assert_eq!(composite_on_white(0, 128), 127);
        assert_eq!(composite_on_white(10, 77), 181);
        assert_eq!(composite_on_white(200, 1), 255);
    }
}
