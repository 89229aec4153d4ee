//! The weight file of an ML program, `Data/com.apple.CoreML/weights/weight.bin`
//! (coremltools' MILBlob storage, version 2).
//!
//! Layout, little-endian:
//!
//! * a 64-byte file header: `u32 count` (number of blobs), `u32 version` (2),
//!   then reserved bytes;
//! * per blob, a 64-byte metadata record at a 64-byte aligned offset:
//!   `u32 sentinel` (`0xDEADBEEF`), `u32 dtype`, `u64 size_in_bytes`,
//!   `u64 data_offset` (from the start of the file), `u64 padding_size_in_bits`
//!   (sub-byte types), then reserved bytes;
//! * the data, at a 64-byte aligned offset.
//!
//! A `BlobFileValue` in the program names the file and the offset of a
//! metadata record. Parsing is a pure function of bytes; every offset and
//! size is checked against the file.

use crate::error::PackageError;

/// Element types a blob can hold (MILBlob's `BlobDataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlobDtype {
    F16,
    F32,
    U8,
    I8,
    Bf16,
    I16,
    U16,
    I4,
    U1,
    U2,
    U4,
    U3,
    U6,
    I32,
    U32,
}

impl BlobDtype {
    fn from_code(c: u32) -> Option<BlobDtype> {
        use BlobDtype::*;
        Some(match c {
            1 => F16,
            2 => F32,
            3 => U8,
            4 => I8,
            5 => Bf16,
            6 => I16,
            7 => U16,
            8 => I4,
            9 => U1,
            10 => U2,
            11 => U4,
            12 => U3,
            13 => U6,
            14 => I32,
            15 => U32,
            _ => return None,
        })
    }

    /// Bits per element.
    pub fn bits(self) -> u64 {
        use BlobDtype::*;
        match self {
            F16 | Bf16 | I16 | U16 => 16,
            F32 | I32 | U32 => 32,
            U8 | I8 => 8,
            I4 | U4 => 4,
            U1 => 1,
            U2 => 2,
            U3 => 3,
            U6 => 6,
        }
    }
}

/// The metadata record's sentinel.
pub const SENTINEL: u32 = 0xDEAD_BEEF;
/// Size of the file header and of each metadata record.
pub const RECORD: usize = 64;

/// One blob: its element type and bytes.
#[derive(Clone, Copy, Debug)]
pub struct Blob<'a> {
    pub dtype: BlobDtype,
    pub data: &'a [u8],
    /// Bits of padding at the end of `data` (sub-byte types).
    pub padding_bits: u64,
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(o..o.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Check the file header; returns the blob count it declares.
pub fn parse_header(file: &[u8]) -> Result<u32, PackageError> {
    if file.len() < RECORD {
        return Err(PackageError::WeightFileTooShort(file.len()));
    }
    let count = u32_at(file, 0).unwrap_or(0);
    let version = u32_at(file, 4).unwrap_or(0);
    if version != 2 {
        return Err(PackageError::WeightFileVersion(version));
    }
    // Each blob needs at least a record; a count beyond that is a lie.
    if u64::from(count) > (file.len() / RECORD) as u64 {
        return Err(PackageError::TooManyBlobs {
            count,
            len: file.len(),
        });
    }
    Ok(count)
}

/// The blob whose metadata record is at `offset`.
pub fn blob_at(file: &[u8], offset: u64) -> Result<Blob<'_>, PackageError> {
    let o = usize::try_from(offset).map_err(|_| PackageError::OffsetOutOfRange(offset))?;
    if o < RECORD || o % RECORD != 0 {
        return Err(PackageError::Misaligned(offset));
    }
    let rec = file.get(o..o + RECORD).ok_or(PackageError::PastTheEnd {
        offset,
        len: file.len(),
    })?;
    let sentinel = u32_at(rec, 0).unwrap_or(0);
    if sentinel != SENTINEL {
        return Err(PackageError::BadSentinel { offset, sentinel });
    }
    let code = u32_at(rec, 4).unwrap_or(0);
    let dtype =
        BlobDtype::from_code(code).ok_or(PackageError::UnknownBlobDtype { offset, code })?;
    let size = u64_at(rec, 8).unwrap_or(0);
    let data_offset = u64_at(rec, 16).unwrap_or(0);
    let padding_bits = u64_at(rec, 24).unwrap_or(0);
    let end = data_offset
        .checked_add(size)
        .filter(|&e| e <= file.len() as u64)
        .ok_or(PackageError::DataPastTheEnd {
            offset,
            data_offset,
            size,
            len: file.len(),
        })?;
    if data_offset < offset + RECORD as u64 {
        return Err(PackageError::DataOverlapsRecord {
            offset,
            data_offset,
        });
    }
    if padding_bits >= 8 || padding_bits > size * 8 {
        return Err(PackageError::BadPadding {
            offset,
            bits: padding_bits,
        });
    }
    Ok(Blob {
        dtype,
        data: &file[data_offset as usize..end as usize],
        padding_bits,
    })
}

impl Blob<'_> {
    /// Elements the blob holds.
    pub fn elements(&self) -> u64 {
        (self.data.len() as u64 * 8 - self.padding_bits) / self.dtype.bits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with_blob(dtype: u32, data: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 128];
        f[0..4].copy_from_slice(&1u32.to_le_bytes());
        f[4..8].copy_from_slice(&2u32.to_le_bytes());
        f[64..68].copy_from_slice(&SENTINEL.to_le_bytes());
        f[68..72].copy_from_slice(&dtype.to_le_bytes());
        f[72..80].copy_from_slice(&(data.len() as u64).to_le_bytes());
        f[80..88].copy_from_slice(&128u64.to_le_bytes());
        f.extend_from_slice(data);
        f
    }

    #[test]
    fn reads_a_blob() {
        let f = file_with_blob(2, &[0, 0, 128, 63, 0, 0, 0, 64]);
        assert_eq!(parse_header(&f).unwrap(), 1);
        let b = blob_at(&f, 64).unwrap();
        assert_eq!(b.dtype, BlobDtype::F32);
        assert_eq!(b.elements(), 2);
    }

    #[test]
    fn rejects_lies() {
        let f = file_with_blob(2, &[0; 8]);
        assert!(matches!(blob_at(&f, 0), Err(PackageError::Misaligned(0))));
        assert!(matches!(
            blob_at(&f, 192),
            Err(PackageError::PastTheEnd {
                offset: 192,
                len: 136
            })
        ));
        assert!(matches!(blob_at(&f, 65), Err(PackageError::Misaligned(65))));
        let mut g = f.clone();
        g[72..80].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = blob_at(&g, 64).unwrap_err();
        assert!(
            matches!(
                e,
                PackageError::DataPastTheEnd {
                    offset: 64,
                    data_offset: 128,
                    size: u64::MAX,
                    len: 136
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("runs past the end"), "{e}");
        let mut g = f.clone();
        g[64] = 0;
        let e = blob_at(&g, 64).unwrap_err();
        assert!(
            matches!(
                e,
                PackageError::BadSentinel {
                    offset: 64,
                    sentinel: 0xDEAD_BE00
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "blob at offset 64: bad sentinel 0xdeadbe00, expected 0xdeadbeef"
        );
        let mut g = f.clone();
        g[68] = 99;
        assert!(matches!(
            blob_at(&g, 64),
            Err(PackageError::UnknownBlobDtype {
                offset: 64,
                code: 99
            })
        ));
        let mut g = f.clone();
        g[88] = 8;
        assert!(matches!(
            blob_at(&g, 64),
            Err(PackageError::BadPadding {
                offset: 64,
                bits: 8
            })
        ));
        let mut g = f.clone();
        g[80..88].copy_from_slice(&64u64.to_le_bytes());
        assert!(matches!(
            blob_at(&g, 64),
            Err(PackageError::DataOverlapsRecord {
                offset: 64,
                data_offset: 64
            })
        ));
    }

    #[test]
    fn the_header_is_checked() {
        let f = file_with_blob(2, &[0; 8]);
        let mut g = f.clone();
        g[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = parse_header(&g).unwrap_err();
        assert!(
            matches!(
                e,
                PackageError::TooManyBlobs {
                    count: u32::MAX,
                    len: 136
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "weight file declares 4294967295 blobs, more than 136 bytes can hold"
        );
        assert!(matches!(
            parse_header(&[0; 10]),
            Err(PackageError::WeightFileTooShort(10))
        ));
        let mut g = f;
        g[4] = 3;
        assert!(matches!(
            parse_header(&g),
            Err(PackageError::WeightFileVersion(3))
        ));
    }
}
