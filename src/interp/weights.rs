//! Decoding the values a program stores (inline constants and weight blobs)
//! into tensors: floats as f32, integers as i64.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::{Interpreter, V};
use crate::error::InterpError;
use crate::mlpackage::{DType, HostData, Value};

/// Decode packed little-endian values into a tensor (floats as f32, integers as i64).
pub(super) fn decode(
    dtype: DType,
    b: &[u8],
    n: usize,
    shape: &[usize],
) -> Result<Tensor, InterpError> {
    let dev = &Device::Cpu;
    let e = InterpError::Candle;
    let need = |w: usize| {
        if b.len() < n * w {
            Err(InterpError::TooFewBytes {
                bytes: b.len(),
                n,
                what: format!("{dtype:?}"),
            })
        } else {
            Ok(())
        }
    };
    let floats = |v: Vec<f32>| Tensor::from_vec(v, shape, dev).map_err(e);
    let ints = |v: Vec<i64>| Tensor::from_vec(v, shape, dev).map_err(e);
    match dtype {
        DType::F16 => {
            need(2)?;
            floats(decode_f16(b, n))
        }
        DType::Bf16 => {
            need(2)?;
            floats(
                b.chunks_exact(2)
                    .take(n)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            )
        }
        DType::F32 => {
            need(4)?;
            floats(
                b.chunks_exact(4)
                    .take(n)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            )
        }
        DType::I8 => {
            need(1)?;
            ints(b.iter().take(n).map(|&v| i64::from(v as i8)).collect())
        }
        DType::U8 => {
            need(1)?;
            ints(b.iter().take(n).map(|&v| i64::from(v)).collect())
        }
        DType::I16 | DType::U16 => {
            need(2)?;
            ints(
                b.chunks_exact(2)
                    .take(n)
                    .map(|c| {
                        if dtype == DType::I16 {
                            i64::from(i16::from_le_bytes([c[0], c[1]]))
                        } else {
                            i64::from(u16::from_le_bytes([c[0], c[1]]))
                        }
                    })
                    .collect(),
            )
        }
        DType::I32 | DType::U32 => {
            need(4)?;
            ints(
                b.chunks_exact(4)
                    .take(n)
                    .map(|c| {
                        let a = [c[0], c[1], c[2], c[3]];
                        if dtype == DType::I32 {
                            i64::from(i32::from_le_bytes(a))
                        } else {
                            i64::from(u32::from_le_bytes(a))
                        }
                    })
                    .collect(),
            )
        }
        DType::U1 | DType::U2 | DType::U3 | DType::U4 | DType::U6 | DType::I4 => {
            let bits = match dtype {
                DType::U1 => 1,
                DType::U2 => 2,
                DType::U3 => 3,
                DType::U6 => 6,
                _ => 4,
            };
            if b.len() * 8 < n * bits {
                return Err(InterpError::TooFewBytes {
                    bytes: b.len(),
                    n,
                    what: format!("{bits}-bit"),
                });
            }
            // Sub-byte values are packed from the least significant bit up.
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let mut v = 0u32;
                for k in 0..bits {
                    let bit = i * bits + k;
                    v |= u32::from((b[bit / 8] >> (bit % 8)) & 1) << k;
                }
                let v = if dtype == DType::I4 && v >= 8 {
                    i64::from(v) - 16
                } else {
                    i64::from(v)
                };
                out.push(v);
            }
            ints(out)
        }
        other => Err(InterpError::Undecodable(format!("{other:?}"))),
    }
}

/// Little-endian fp16 values widened to f32, over all cores (F16C where the
/// CPU has it).
fn decode_f16(b: &[u8], n: usize) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0f32; n];
    out.par_chunks_mut(CHUNK)
        .zip(b[..2 * n].par_chunks(2 * CHUNK))
        .for_each(|(o, b)| crate::blas::widen_f16(o, b));
    out
}

impl Interpreter<'_> {
    /// A constant as a runtime value.
    pub fn constant(&self, v: &Value) -> Result<V, InterpError> {
        let dev = &Device::Cpu;
        let e = InterpError::Candle;
        match v {
            Value::Immediate { ty, data } => {
                let shape = ty.shape.clone();
                Ok(match data {
                    HostData::Str(s) => V::S(s.first().cloned().unwrap_or_default()),
                    HostData::F32(f) => V::T(Tensor::from_vec(f.clone(), shape, dev).map_err(e)?),
                    HostData::F64(f) => V::T(
                        Tensor::from_vec(
                            f.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                            shape,
                            dev,
                        )
                        .map_err(e)?,
                    ),
                    HostData::I64(i) => {
                        if ty.dtype.is_float() {
                            V::T(
                                Tensor::from_vec(
                                    i.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                                    shape,
                                    dev,
                                )
                                .map_err(e)?,
                            )
                        } else {
                            V::T(Tensor::from_vec(i.clone(), shape, dev).map_err(e)?)
                        }
                    }
                    HostData::Bool(b) => V::T(
                        Tensor::from_vec(
                            b.iter().map(|&x| u8::from(x)).collect::<Vec<_>>(),
                            shape,
                            dev,
                        )
                        .map_err(e)?,
                    ),
                    HostData::Bytes(b) => V::T(decode(ty.dtype, b, ty.elements(), &shape)?),
                })
            }
            Value::Blob { .. } => self
                .pkg
                .decoded_blob(v, false, || self.decode_blob(v))
                .map(V::T),
        }
    }

    /// A weight blob's values: floats as f32, integers as i64.
    fn decode_blob(&self, v: &Value) -> Result<Tensor, InterpError> {
        use crate::mlpackage::blob::BlobDtype;
        let b = self.pkg.blob(v)?;
        let ty = v.ty();
        let dtype = match b.dtype {
            BlobDtype::F16 => DType::F16,
            BlobDtype::F32 => DType::F32,
            BlobDtype::Bf16 => DType::Bf16,
            BlobDtype::I8 => DType::I8,
            BlobDtype::U8 => DType::U8,
            BlobDtype::I16 => DType::I16,
            BlobDtype::U16 => DType::U16,
            BlobDtype::I32 => DType::I32,
            BlobDtype::U32 => DType::U32,
            BlobDtype::I4 => DType::I4,
            BlobDtype::U1 => DType::U1,
            BlobDtype::U2 => DType::U2,
            BlobDtype::U3 => DType::U3,
            BlobDtype::U4 => DType::U4,
            BlobDtype::U6 => DType::U6,
        };
        decode(dtype, b.data, ty.elements(), &ty.shape)
    }

    /// A constant of [`fp16_conv_weights`]: an fp16 blob as an f16 tensor,
    /// half the memory of its f32 values (a blob stored otherwise is decoded
    /// as [`Interpreter::constant`] decodes it).
    pub(super) fn stored_fp16(&self, v: &Value) -> Result<V, InterpError> {
        if !matches!(v, Value::Blob { .. }) {
            return self.constant(v);
        }
        self.pkg
            .decoded_blob(v, true, || {
                let b = self.pkg.blob(v)?;
                let ty = v.ty();
                let n = ty.elements();
                if b.dtype != crate::mlpackage::blob::BlobDtype::F16 {
                    return self.decode_blob(v);
                }
                if b.data.len() < 2 * n {
                    return Err(InterpError::TooFewBytes {
                        bytes: b.data.len(),
                        n,
                        what: "F16".into(),
                    });
                }
                let h: Vec<half::f16> = b.data[..2 * n]
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                    .collect();
                Tensor::from_vec(h, ty.shape.as_slice(), &Device::Cpu).map_err(InterpError::from)
            })
            .map(V::T)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_decoding_matches_half() {
        let vals: Vec<u16> = (0..=u16::MAX).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = decode_f16(&bytes, vals.len());
        for (v, g) in vals.iter().zip(&got) {
            let want = half::f16::from_bits(*v).to_f32();
            assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "{v:#x}"
            );
        }
    }
}
