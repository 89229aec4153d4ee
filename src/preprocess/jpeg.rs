//! JPEG decoding with libjpeg-turbo, the decoder Pillow is built with.
//!
//! Two JPEG decoders agree only when they share the inverse DCT, the chroma
//! upsampling and the YCbCr conversion. Pillow asks libjpeg-turbo for its
//! defaults (the accurate integer IDCT `JDCT_ISLOW`, "fancy" triangle-filter
//! upsampling, no merged upsampler), and so does this module through the
//! TurboJPEG API (`tj3Decompress8` with `TJPARAM_FASTDCT` and
//! `TJPARAM_FASTUPSAMPLE` left at 0). libjpeg-turbo is built from the source
//! `turbojpeg-sys` bundles (3.1) and linked statically.
//!
//! What Pillow does around the decoder is reproduced here too:
//! * 3-component images are decoded to RGB; 1-component to gray (Pillow's
//!   `L`, replicated to RGB by the caller).
//! * 4-component images (CMYK, YCCK) are decoded to CMYK, which Pillow reads
//!   as `CMYK;I` (inverted, "Adobe conventions", whatever the markers say) and
//!   converts to RGB with `R = (255 - K) - muldiv255(C, 255 - K)`
//!   (`libImaging/Convert.c`, `cmyk2rgb`).
//! * libjpeg's warnings are ignored, as Pillow ignores them (extraneous bytes,
//!   a corrupt segment), except the one that means the file ended early:
//!   Pillow refuses a truncated JPEG, and so does this module.

use turbojpeg_sys as tj;

use crate::error::ImageError;

/// A decoded JPEG: either gray (one byte a pixel) or RGB (three).
pub struct Decoded {
    pub width: usize,
    pub height: usize,
    pub gray: bool,
    pub data: Vec<u8>,
}

/// One TurboJPEG decompressor, destroyed on drop.
struct Handle(tj::tjhandle);

impl Handle {
    fn new() -> Result<Self, ImageError> {
        // SAFETY: tj3Init has no preconditions; a null result is checked.
        let h = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as libc::c_int) };
        if h.is_null() {
            return Err(ImageError::NoDecompressor);
        }
        Ok(Handle(h))
    }

    fn get(&self, param: tj::TJPARAM) -> i32 {
        // SAFETY: the handle is live; tj3Get reads a parameter.
        unsafe { tj::tj3Get(self.0, param as libc::c_int) }
    }

    fn message(&self) -> String {
        // SAFETY: tj3GetErrorStr returns a NUL-terminated string owned by the handle.
        let s = unsafe { std::ffi::CStr::from_ptr(tj::tj3GetErrorStr(self.0)) };
        s.to_string_lossy().into_owned()
    }

    fn is_warning(&self) -> bool {
        // SAFETY: the handle is live.
        unsafe { tj::tj3GetErrorCode(self.0) == tj::TJERR_TJERR_WARNING as libc::c_int }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

fn header(h: &Handle, bytes: &[u8]) -> Result<(usize, usize), ImageError> {
    // SAFETY: the buffer outlives the call and its length is passed with it.
    let rc = unsafe { tj::tj3DecompressHeader(h.0, bytes.as_ptr(), bytes.len() as tj::size_t) };
    if rc != 0 {
        return Err(ImageError::Corrupt(format!(
            "cannot decode the JPEG header: {}",
            h.message()
        )));
    }
    let (w, hh) = (
        h.get(tj::TJPARAM_TJPARAM_JPEGWIDTH),
        h.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT),
    );
    if w <= 0 || hh <= 0 {
        // A stream holding tables only (or nothing) parses without a frame.
        return Err(ImageError::Corrupt(
            "cannot decode the JPEG header: no frame (SOF marker) in the data".into(),
        ));
    }
    Ok((w as usize, hh as usize))
}

/// Decode a JPEG as Pillow does (see the module docs). `check` sees the
/// width and height the header declares before any pixel is decoded (the
/// caller's limits), and its error is returned as it is.
pub fn decode(
    bytes: &[u8],
    check: impl FnOnce(usize, usize) -> Result<(), ImageError>,
) -> Result<Decoded, ImageError> {
    let h = Handle::new()?;
    let (width, height) = header(&h, bytes)?;
    check(width, height)?;
    let precision = h.get(tj::TJPARAM_TJPARAM_PRECISION);
    if precision != 8 {
        return Err(ImageError::JpegPrecision(precision));
    }
    let colorspace = h.get(tj::TJPARAM_TJPARAM_COLORSPACE) as tj::TJCS;
    let (format, channels) = match colorspace {
        tj::TJCS_TJCS_GRAY => (tj::TJPF_TJPF_GRAY, 1),
        tj::TJCS_TJCS_CMYK | tj::TJCS_TJCS_YCCK => (tj::TJPF_TJPF_CMYK, 4),
        _ => (tj::TJPF_TJPF_RGB, 3),
    };
    let pitch = width
        .checked_mul(channels)
        .filter(|&p| p <= i32::MAX as usize)
        .ok_or(ImageError::TooWide(width))?;
    let mut data = vec![0u8; pitch * height];
    // SAFETY: `data` holds `pitch * height` bytes, the size tj3Decompress8
    // writes for this header at this pitch and pixel format.
    let rc = unsafe {
        tj::tj3Decompress8(
            h.0,
            bytes.as_ptr(),
            bytes.len() as tj::size_t,
            data.as_mut_ptr(),
            pitch as libc::c_int,
            format as libc::c_int,
        )
    };
    if rc != 0 {
        let msg = h.message();
        if !h.is_warning() {
            return Err(ImageError::Corrupt(format!(
                "cannot decode the JPEG (corrupt?): {msg}"
            )));
        }
        if msg.contains("Premature end of JPEG file") {
            return Err(ImageError::Corrupt(format!(
                "the JPEG file is truncated: {msg}"
            )));
        }
    }
    let (gray, data) = match channels {
        1 => (true, data),
        3 => (false, data),
        _ => (false, cmyk_inverted_to_rgb(&data)),
    };
    Ok(Decoded {
        width,
        height,
        gray,
        data,
    })
}

/// The TIFF body of the first APP1 `Exif` segment, as Pillow keeps it
/// (`info["exif"]`, the first one wins), without its `Exif\0\0` prefix.
/// Markers are scanned from SOI up to the first scan (SOS).
pub fn exif(bytes: &[u8]) -> Option<&[u8]> {
    let mut i = 2;
    if bytes.get(..2)? != [0xFF, 0xD8] {
        return None;
    }
    loop {
        if *bytes.get(i)? != 0xFF {
            return None;
        }
        while *bytes.get(i)? == 0xFF {
            i += 1;
        }
        let marker = *bytes.get(i)?;
        i += 1;
        match marker {
            0xD9 | 0xDA => return None,
            0x01 | 0xD0..=0xD7 => continue,
            _ => {}
        }
        let len = usize::from(u16::from_be_bytes([*bytes.get(i)?, *bytes.get(i + 1)?]));
        let body = bytes.get(i + 2..(i + len).max(i + 2))?;
        if marker == 0xE1 && body.starts_with(b"Exif\0\0") {
            return Some(&body[6..]);
        }
        i += len.max(2);
    }
}

/// Pillow's `CMYK;I` unpacking (each byte inverted) followed by `cmyk2rgb`.
fn cmyk_inverted_to_rgb(cmyk: &[u8]) -> Vec<u8> {
    let muldiv255 = |a: u32, b: u32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    let mut out = Vec::with_capacity(cmyk.len() / 4 * 3);
    for p in cmyk.chunks_exact(4) {
        let nk = u32::from(p[3]);
        for &c in &p[..3] {
            out.push((nk - muldiv255(255 - u32::from(c), nk)) as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmyk_conversion_matches_pillow_formula() {
        // Stored inverted: stored 255 means ink 0, so white paper stays white.
        assert_eq!(cmyk_inverted_to_rgb(&[255, 255, 255, 255]), [255, 255, 255]);
        // Full black ink (stored 0) gives black whatever the colour inks.
        assert_eq!(cmyk_inverted_to_rgb(&[17, 200, 255, 0]), [0, 0, 0]);
        // C ink 255 (stored 0), no black: R 0; M and Y inks 0: G and B 255.
        assert_eq!(cmyk_inverted_to_rgb(&[0, 255, 255, 255]), [0, 255, 255]);
        // Half K (stored 128 -> nk 128) and C ink 100 (stored 155):
        // 128 - round(100 * 128 / 255) = 128 - 50 = 78.
        assert_eq!(cmyk_inverted_to_rgb(&[155, 255, 255, 128])[0], 78);
    }

    #[test]
    fn finds_the_first_exif_segment() {
        let mut j = vec![0xFF, 0xD8];
        j.extend([0xFF, 0xE0, 0, 4, b'J', b'F']); // APP0
        j.extend([0xFF, 0xE1, 0, 12]);
        j.extend(b"Exif\0\0II*\0");
        j.extend([0xFF, 0xE1, 0, 12]);
        j.extend(b"Exif\0\0MM\0*");
        j.extend([0xFF, 0xDA, 0, 2]);
        assert_eq!(exif(&j), Some(&b"II*\0"[..]));
        j.truncate(12); // the first APP1's body cut off
        assert_eq!(exif(&j), None);
        assert_eq!(exif(b"\x89PNG"), None);
    }

    #[test]
    fn refuses_non_jpeg_bytes() {
        let e = decode(b"\xff\xd8not a jpeg", |_, _| Ok(())).err().unwrap();
        assert!(
            matches!(&e, ImageError::Corrupt(m) if m.starts_with("cannot decode the JPEG header")),
            "{e:?}"
        );
        assert!(matches!(
            decode(&[], |_, _| Ok(())),
            Err(ImageError::Corrupt(_))
        ));
        let e = decode(&[], |_, _| Err(ImageError::NotAnImage))
            .err()
            .unwrap();
        assert!(
            matches!(e, ImageError::Corrupt(_)),
            "the header fails before the limit: {e:?}"
        );
    }
}
