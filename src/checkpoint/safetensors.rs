//! Memory-mapped safetensors shards with validation that names the file and tensor.
//!
//! Header parsing is a pure function of bytes ([`parse_header`]); the store
//! mmaps each shard once and hands out tensors converted to f32.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, Metadata, SafeTensorError, SafeTensors};
use serde_json::Value;

pub use crate::error::SafetensorsError;
use crate::error::{Error, Result};

/// Where a tensor lives: shard, dtype, shape and byte range inside the shard's data.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub shard: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range within the file (header included).
    pub range: (usize, usize),
}

/// Parse and validate a safetensors header from the whole file's bytes.
///
/// Returns the size of the header and its metadata. Offsets must be
/// contiguous, match dtype x shape, and cover the data exactly. Errors
/// name the tensor at fault where one is; any other refusal keeps the
/// `safetensors` crate's error ([`SafetensorsError::Other`]).
pub fn parse_header(bytes: &[u8]) -> std::result::Result<(usize, Metadata), SafetensorsError> {
    SafeTensors::read_metadata(bytes).map_err(|e| describe(bytes, e))
}

/// A `SafeTensorError` as the variant naming the tensor at fault when the
/// crate's own error does not.
pub(crate) fn describe(bytes: &[u8], e: SafeTensorError) -> SafetensorsError {
    match e {
        SafeTensorError::HeaderTooSmall => SafetensorsError::HeaderTooSmall,
        SafeTensorError::InvalidHeaderLength => SafetensorsError::HeaderPastEnd,
        SafeTensorError::TensorInvalidInfo | SafeTensorError::MetadataIncompleteBuffer => {
            diagnose(bytes).unwrap_or(SafetensorsError::Other(e))
        }
        SafeTensorError::InvalidOffset(name) => SafetensorsError::Offsets(name),
        other => SafetensorsError::Other(other),
    }
}

/// Re-read the header as plain JSON to say which tensor disagrees with its
/// dtype and shape, or how the file's length disagrees with the header.
fn diagnose(bytes: &[u8]) -> Option<SafetensorsError> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let header: Value = serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
    let data_len = bytes.len() - 8 - n;
    let mut end = 0usize;
    for (name, info) in header.as_object()? {
        if name == "__metadata__" {
            continue;
        }
        let off = info.get("data_offsets")?.as_array()?;
        let (s, e) = (
            off.first()?.as_u64()? as usize,
            off.get(1)?.as_u64()? as usize,
        );
        let elems = info
            .get("shape")?
            .as_array()?
            .iter()
            .try_fold(1usize, |a, d| a.checked_mul(d.as_u64()? as usize))?;
        let width = match info.get("dtype")?.as_str()? {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            _ => 1,
        };
        if e.checked_sub(s)? != elems.checked_mul(width)? {
            return Some(SafetensorsError::TensorSize {
                tensor: name.clone(),
                start: s,
                end: e,
                need: elems * width,
            });
        }
        end = end.max(e);
    }
    Some(SafetensorsError::DataSize {
        described: end,
        held: data_len,
    })
}

/// Decode little-endian elements of `width` bytes into `out`; returns how
/// many are NaN or infinite.
fn convert(bytes: &[u8], out: &mut [f32], width: usize, f: impl Fn(&[u8]) -> f32 + Sync) -> usize {
    const CHUNK: usize = 1 << 16;
    out.par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * width))
        .map(|(o, b)| {
            let mut bad = 0;
            for (o, b) in o.iter_mut().zip(b.chunks_exact(width)) {
                *o = f(b);
                bad += usize::from(!o.is_finite());
            }
            bad
        })
        .sum()
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// A set of mmapped shards and an index of the tensors they hold.
pub struct WeightStore {
    shards: Vec<Shard>,
    tensors: BTreeMap<String, TensorEntry>,
    /// Behind a lock: a reference tower loads its blocks on several threads.
    warned_nonfinite: std::sync::Mutex<Vec<String>>,
    /// The tensors read so far ([`WeightStore::unread`]), behind a lock for
    /// the same reason.
    read: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl WeightStore {
    /// Open shards and index their tensors.
    pub fn open(files: &[PathBuf]) -> Result<WeightStore> {
        let mut shards = Vec::new();
        let mut tensors = BTreeMap::new();
        for path in files {
            let file = File::open(path).map_err(|e| Error::io(path, e))?;
            // SAFETY: the file is opened read-only; like every mmap reader we
            // assume no other process truncates it while we read.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
            let (n, meta) = parse_header(&mmap).map_err(|error| Error::Safetensors {
                path: path.clone(),
                error,
            })?;
            let base = 8 + n;
            for (name, info) in meta.tensors() {
                let entry = TensorEntry {
                    shard: shards.len(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    range: (base + info.data_offsets.0, base + info.data_offsets.1),
                };
                if tensors.insert(name.clone(), entry).is_some() {
                    return Err(Error::tensor(path, &name, "appears in more than one shard"));
                }
            }
            shards.push(Shard {
                path: path.clone(),
                mmap,
            });
        }
        Ok(WeightStore {
            shards,
            tensors,
            warned_nonfinite: Default::default(),
            read: Default::default(),
        })
    }

    /// Names of all indexed tensors.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Unmap every shard, once what is needed has been read from them (a
    /// loaded reference tower holds its own copies): their pages leave this
    /// process's memory, and the store holds no tensors afterwards.
    pub fn unmap(&mut self) {
        self.shards.clear();
        self.tensors.clear();
    }

    /// Keep only the tensors whose names satisfy `keep`.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.tensors.retain(|n, _| keep(n));
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The shard path holding a tensor (for messages).
    pub fn path_of(&self, name: &str) -> Option<&Path> {
        self.tensors
            .get(name)
            .map(|e| self.shards[e.shard].path.as_path())
    }

    /// The dtypes present, for reports.
    pub fn dtypes(&self) -> Vec<String> {
        let mut d: Vec<String> = self
            .tensors
            .values()
            .map(|e| format!("{:?}", e.dtype))
            .collect();
        d.sort();
        d.dedup();
        d
    }

    /// A tensor's index entry, shard path and bytes, its shape checked.
    fn entry(
        &self,
        name: &str,
        shape: &[usize],
        where_: &Path,
    ) -> Result<(&TensorEntry, &Path, &[u8])> {
        let e = self.tensors.get(name).ok_or_else(|| {
            Error::tensor(where_, name, format!("missing (expected shape {shape:?})"))
        })?;
        let path = &self.shards[e.shard].path;
        self.read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_string());
        if e.shape != shape {
            return Err(Error::tensor(
                path,
                name,
                format!(
                    "shape {:?} disagrees with config.json, which implies {shape:?}",
                    e.shape
                ),
            ));
        }
        Ok((e, path, &self.shards[e.shard].mmap[e.range.0..e.range.1]))
    }

    /// Load a tensor keeping a 16-bit storage dtype (F16, BF16) as it is, and
    /// F32 as f32: half the memory for the large matrices of a language
    /// model, whose products are still computed in f32.
    pub fn native(&self, name: &str, shape: &[usize], where_: &Path) -> Result<Tensor> {
        let (e, _, bytes) = self.entry(name, shape, where_)?;
        let bits = || {
            bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        Ok(match e.dtype {
            Dtype::F16 => Tensor::from_vec(
                bits().map(half::f16::from_bits).collect::<Vec<_>>(),
                shape,
                &Device::Cpu,
            )?,
            Dtype::BF16 => Tensor::from_vec(
                bits().map(half::bf16::from_bits).collect::<Vec<_>>(),
                shape,
                &Device::Cpu,
            )?,
            _ => self.f32(name, shape, where_)?,
        })
    }

    /// Load a tensor as f32 on the CPU, checking its shape. `where_` names the
    /// checkpoint in errors when the tensor is missing.
    ///
    /// Tensors holding non-finite values are recorded, not refused
    /// ([`WeightStore::nonfinite_tensors`]; the caller warns, and the gates
    /// will show their effect); the library prints nothing.
    pub fn f32(&self, name: &str, shape: &[usize], where_: &Path) -> Result<Tensor> {
        let (e, path, bytes) = self.entry(name, shape, where_)?;
        let count: usize = shape.iter().product();
        let mut v = vec![0f32; count];
        // Convert straight from the mapped bytes, in parallel; count non-finite values on the way.
        let bad: usize = match e.dtype {
            Dtype::F32 => convert(bytes, &mut v, 4, |b| {
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }),
            Dtype::F16 => convert(bytes, &mut v, 2, |b| {
                half::f16::from_le_bytes([b[0], b[1]]).to_f32()
            }),
            Dtype::BF16 => convert(bytes, &mut v, 2, |b| {
                half::bf16::from_le_bytes([b[0], b[1]]).to_f32()
            }),
            other => {
                return Err(Error::tensor(
                    path,
                    name,
                    format!("dtype {other:?} is not supported, expected F32, F16 or BF16"),
                ));
            }
        };
        if bad > 0 {
            let mut warned = self
                .warned_nonfinite
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !warned.iter().any(|w| w == name) {
                warned.push(name.to_string());
            }
        }
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }

    /// The indexed tensors that no call has read yet, by name, sorted: once
    /// a tower is loaded, the checkpoint's tensors its config does not
    /// account for (a `depth` one less than the blocks saved).
    pub fn unread(&self) -> Vec<String> {
        let read = self
            .read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.tensors
            .keys()
            .filter(|n| !read.contains(*n))
            .cloned()
            .collect()
    }

    /// The warning a caller gives when tensors loaded so far held NaN or
    /// Inf (`None` when none did): how many, and their names.
    pub fn nonfinite_warning(&self) -> Option<String> {
        let v = self.nonfinite_tensors();
        (!v.is_empty()).then(|| {
            format!(
                "{} weight tensors hold NaN or Inf: {}",
                v.len(),
                v.join(", ")
            )
        })
    }

    /// Tensors that held NaN or Inf when loaded so far, by name.
    pub fn nonfinite_tensors(&self) -> Vec<String> {
        let mut v = self
            .warned_nonfinite
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn an_unmapped_store_holds_no_tensors_and_copies_outlive_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let data: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(
            &path,
            file(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                &data,
            ),
        )
        .unwrap();
        let mut w = WeightStore::open(std::slice::from_ref(&path)).unwrap();
        let t = w.f32("a", &[2], &path).unwrap();
        w.unmap();
        assert!(!w.contains("a") && w.names().next().is_none());
        assert!(w.f32("a", &[2], &path).is_err());
        assert_eq!(t.to_vec1::<f32>().unwrap(), [1.5, -2.0]);
    }

    #[test]
    fn good_header_parses() {
        let f = file(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        let (_, m) = parse_header(&f).unwrap();
        assert_eq!(m.info("a").unwrap().shape, vec![2]);
    }

    #[test]
    fn shape_disagreeing_with_offsets_names_tensor() {
        let f = file(
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        let e = parse_header(&f).unwrap_err();
        assert!(
            matches!(&e, SafetensorsError::TensorSize { tensor, start: 0, end: 8, need: 12 } if tensor == "w"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "tensor `w`: data_offsets [0, 8] hold 8 bytes but dtype and shape need 12"
        );
    }

    #[test]
    fn overlap_names_tensor() {
        let f = file(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            &[0; 12],
        );
        let e = parse_header(&f).unwrap_err();
        assert!(
            matches!(&e, SafetensorsError::Offsets(t) if t == "b"),
            "{e:?}"
        );
        assert!(e.to_string().contains("`b`") && e.to_string().contains("overlap"));
    }

    #[test]
    fn truncated_data_is_reported() {
        let f = file(
            r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
            &[0; 10],
        );
        let e = parse_header(&f).unwrap_err();
        assert!(
            matches!(
                e,
                SafetensorsError::DataSize {
                    described: 16,
                    held: 10
                }
            ),
            "{e:?}"
        );
        assert!(matches!(
            parse_header(&[1, 2, 3]),
            Err(SafetensorsError::HeaderTooSmall)
        ));
        let mut g = file(
            r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
            &[0; 16],
        );
        g.truncate(20);
        let e = parse_header(&g).unwrap_err();
        assert!(matches!(e, SafetensorsError::HeaderPastEnd), "{e:?}");
        assert!(e.to_string().contains("past the end"));
    }

    #[test]
    fn the_crate_s_own_error_is_kept() {
        let e = parse_header(&file("{not json", &[])).unwrap_err();
        assert!(
            matches!(
                e,
                SafetensorsError::Other(SafeTensorError::InvalidHeaderDeserialization(_))
            ),
            "{e:?}"
        );
        // Its message is the crate's, and it is not said twice in a chain.
        assert!(e.to_string().starts_with("invalid JSON in header: "), "{e}");
        assert!(std::error::Error::source(&e).is_none());
    }
}
