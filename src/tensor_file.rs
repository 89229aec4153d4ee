//! Reading and writing the small safetensors files the commands exchange
//! (`pixel_values`, `grid_thw`, embeddings). Writes go to a temporary file in
//! the destination directory and are renamed into place, so a reader never
//! sees a half-written file.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::error::{Error, Result, SafetensorsError};

/// An owned tensor to write: dtype, shape and little-endian bytes.
pub struct OwnedTensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl OwnedTensor {
    pub fn f32(shape: Vec<usize>, v: &[f32]) -> Self {
        OwnedTensor {
            dtype: Dtype::F32,
            shape,
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
    pub fn i64(shape: Vec<usize>, v: &[i64]) -> Self {
        OwnedTensor {
            dtype: Dtype::I64,
            shape,
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
    pub fn u8(shape: Vec<usize>, v: Vec<u8>) -> Self {
        OwnedTensor {
            dtype: Dtype::U8,
            shape,
            data: v,
        }
    }
}

/// Write tensors (and string metadata) atomically to `path`.
pub fn write(
    path: &Path,
    tensors: Vec<(String, OwnedTensor)>,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(n, t)| {
            TensorView::new(t.dtype, t.shape.clone(), &t.data)
                .map(|v| (n.clone(), v))
                .map_err(|error| Error::TensorWrite {
                    tensor: Some(n.clone()),
                    error,
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(views, metadata).map_err(|error| Error::TensorWrite {
        tensor: None,
        error,
    })?;
    write_atomic(path, &bytes)
}

/// Write bytes to a temporary sibling of `path`, sync, and rename into place.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "parent directory does not exist",
            ),
        ));
    }
    // Created 0666 less the umask, as any other file the user writes
    // (tempfile's default, 0600, would keep artifacts and reports private).
    let mut tmp = tempfile::Builder::new()
        .permissions(umask_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| Error::io(path, e))?;
    tmp.write_all(bytes).map_err(|e| Error::io(path, e))?;
    tmp.as_file().sync_all().map_err(|e| Error::io(path, e))?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// Permissions of `mode` that the kernel narrows by the process's umask
/// when it creates the file or directory (`tempfile` passes them to
/// `open`/`mkdir`), as for any file the user writes.
pub(crate) fn umask_mode(mode: u32) -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    std::fs::Permissions::from_mode(mode)
}

/// A tensor read back as f32 or i64 values with its shape.
pub struct Loaded {
    pub shape: Vec<usize>,
    pub f32: Option<Vec<f32>>,
    pub i64: Option<Vec<i64>>,
}

/// Read one tensor from a safetensors file held in memory.
pub fn read_tensor(bytes: &[u8], path: &Path, name: &str) -> Result<Loaded> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| Error::Safetensors {
        path: path.to_path_buf(),
        error: SafetensorsError::Other(e),
    })?;
    let t = st
        .tensor(name)
        .map_err(|_| Error::tensor(path, name, "missing"))?;
    let shape = t.shape().to_vec();
    let d = t.data();
    let mut out = Loaded {
        shape,
        f32: None,
        i64: None,
    };
    match t.dtype() {
        Dtype::F32 => {
            out.f32 = Some(
                d.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
        }
        Dtype::F16 => {
            out.f32 = Some(
                d.chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            )
        }
        Dtype::BF16 => {
            out.f32 = Some(
                d.chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            )
        }
        Dtype::I64 => {
            out.i64 = Some(
                d.chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
        }
        Dtype::I32 => {
            out.i64 = Some(
                d.chunks_exact(4)
                    .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap())))
                    .collect(),
            )
        }
        Dtype::U8 => out.i64 = Some(d.iter().map(|&v| i64::from(v)).collect()),
        other => {
            return Err(Error::tensor(
                path,
                name,
                format!("dtype {other:?} is not supported here"),
            ));
        }
    }
    Ok(out)
}

/// A tensor's values as a flat f32 vector (converted from its dtype).
pub fn f32_values(t: &candle_core::Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_name_the_tensor_and_keep_the_crate_s_error() {
        let d = tempfile::tempdir().unwrap();
        let short = OwnedTensor {
            dtype: Dtype::F32,
            shape: vec![3],
            data: vec![0; 8],
        };
        let e = write(
            &d.path().join("t.safetensors"),
            vec![("x".into(), short)],
            None,
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::TensorWrite { tensor: Some(t), .. } if t == "x"),
            "{e:?}"
        );
        assert!(e.to_string().starts_with("tensor `x`: "), "{e}");
        let e = read_tensor(b"junk", Path::new("t.safetensors"), "x")
            .err()
            .unwrap();
        assert!(
            matches!(
                e,
                Error::Safetensors {
                    error: SafetensorsError::Other(_),
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
