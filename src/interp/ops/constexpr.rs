//! The constexpr ops that dequantise compressed weights.

use candle_core::{DType as CDType, Device, Tensor};

use super::{Inputs, R, V, axis, ce, f32t, ints, one};

/// `constexpr_affine_dequantize`, `constexpr_blockwise_shift_scale` and
/// `constexpr_lut_to_dense`.
pub(super) fn exec(ins: &Inputs) -> R<Vec<V>> {
    let op = ins.op;
    let get = |k: &str| ins.get(k);
    let opt = |k: &str| ins.opt(k);
    match op.kind.as_str() {
        "constexpr_affine_dequantize" => {
            let q = f32t(&get("quantized_data")?)?;
            let zp = f32t(&get("zero_point")?)?;
            let scale = f32t(&get("scale")?)?;
            let ax = axis(ints(&get("axis")?)?.first().copied().unwrap_or(0), q.rank())?;
            let shape: Vec<usize> = (0..q.rank())
                .map(|i| if i == ax { q.dims()[i] } else { 1 })
                .collect();
            let fit = |p: Tensor| {
                if p.elem_count() == 1 {
                    p.reshape(vec![1; q.rank()])
                } else {
                    p.reshape(shape.clone())
                }
            };
            one(q
                .broadcast_sub(&fit(zp).map_err(ce)?)
                .and_then(|d| d.broadcast_mul(&fit(scale)?))
                .map_err(ce)?)
        }
        "constexpr_blockwise_shift_scale" => {
            let data = f32t(&get("data")?)?;
            let scale = f32t(&get("scale")?)?;
            let off = opt("offset")?.map(|v| f32t(&v)).transpose()?;
            let expand = |p: &Tensor| -> R<Tensor> {
                // Each scale entry covers a block of data along each axis.
                let mut p = p.clone();
                for d in 0..data.rank() {
                    let block = data.dims()[d] / p.dims()[d].max(1);
                    if block > 1 {
                        let idx: Vec<u32> =
                            (0..data.dims()[d]).map(|i| (i / block) as u32).collect();
                        let idx =
                            Tensor::from_vec(idx, data.dims()[d], &Device::Cpu).map_err(ce)?;
                        p = p.index_select(&idx, d).map_err(ce)?;
                    }
                }
                Ok(p)
            };
            let mut y = data.clone();
            if let Some(o) = off {
                y = y.sub(&expand(&o)?).map_err(ce)?;
            }
            one(y.mul(&expand(&scale)?).map_err(ce)?)
        }
        "constexpr_lut_to_dense" => {
            let idx = get("indices")?
                .tensor()?
                .to_dtype(CDType::I64)
                .map_err(ce)?;
            let lut = f32t(&get("lut")?)?;
            if let Some(shape) = opt("shape")? {
                // iOS16: one palette of 2^nbits entries, the indices
                // packed LSB first into bytes, and the output's shape.
                return one(lut_ios16(&lut, &idx, &ints(&shape)?)?);
            }
            // iOS18: lut [block counts per axis of indices..., palette,
            // vector_size]; a vector palette (vector_size > 1) writes
            // each entry's values along `vector_axis`.
            let r = idx.rank();
            if lut.rank() != r + 2 {
                return Err(invalid!(
                    "lut of shape {:?} for indices of rank {r}: expected rank {}",
                    lut.dims(),
                    r + 2
                ));
            }
            let vs = lut.dims()[r + 1];
            if vs > 1 {
                let va = match opt("vector_axis")? {
                    Some(v) => axis(ints(&v)?.first().copied().unwrap_or(0), r)?,
                    None => return Err(invalid!("a vector palette needs `vector_axis`")),
                };
                return one(lut_vectors(&lut, &idx, va)?);
            }
            let dims = idx.dims().to_vec();
            let iv = idx
                .flatten_all()
                .and_then(|f| f.to_vec1::<i64>())
                .map_err(ce)?;
            let lv = lut
                .flatten_all()
                .and_then(|f| f.to_vec1::<f32>())
                .map_err(ce)?;
            let palette = lut.dims()[r];
            let blocks: Vec<usize> = (0..r).map(|d| dims[d] / lut.dims()[d].max(1)).collect();
            let mut out = Vec::with_capacity(iv.len());
            let mut coord = vec![0usize; r];
            for &i in &iv {
                let mut li = 0usize;
                for d in 0..r {
                    li = li * lut.dims()[d] + coord[d] / blocks[d].max(1);
                }
                let k = usize::try_from(i)
                    .ok()
                    .filter(|&k| k < palette)
                    .ok_or_else(|| invalid!("palette index {i} out of range"))?;
                out.push(lv[li * palette + k]);
                for d in (0..r).rev() {
                    coord[d] += 1;
                    if coord[d] < dims[d] {
                        break;
                    }
                    coord[d] = 0;
                }
            }
            one(Tensor::from_vec(out, dims, &Device::Cpu).map_err(ce)?)
        }
        other => Err(internal!("op `{other}` is not supported")),
    }
}

/// iOS16's `constexpr_lut_to_dense`: `lut` of 2^nbits entries, `packed`
/// holding the indices as nbits-bit fields packed from the least significant
/// bit up, `shape` the output's.
fn lut_ios16(lut: &Tensor, packed: &Tensor, shape: &[i64]) -> R<Tensor> {
    let lv = lut
        .flatten_all()
        .and_then(|f| f.to_vec1::<f32>())
        .map_err(ce)?;
    let bytes = packed
        .flatten_all()
        .and_then(|f| f.to_vec1::<i64>())
        .map_err(ce)?;
    let nbits = lv.len().trailing_zeros() as usize;
    if !lv.len().is_power_of_two() || !(1..=8).contains(&nbits) {
        return Err(invalid!(
            "lut of {} entries: expected 2, 4, ..., 256",
            lv.len()
        ));
    }
    let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    let n: usize = dims.iter().product();
    if bytes.len() * 8 < n * nbits {
        return Err(invalid!(
            "{} bytes of indices hold fewer than the {n} entries of shape {dims:?}",
            bytes.len()
        ));
    }
    let bit = |i: usize| (bytes[i / 8] >> (i % 8)) & 1;
    let out: Vec<f32> = (0..n)
        .map(|e| {
            let k = (0..nbits).fold(0usize, |k, b| k | (bit(e * nbits + b) as usize) << b);
            lv[k]
        })
        .collect();
    Tensor::from_vec(out, dims, &Device::Cpu).map_err(ce)
}

/// iOS18's `constexpr_lut_to_dense` with vector palettes: `lut` is
/// `[blocks per axis of idx..., palette, vs]`; the output has idx's shape
/// with axis `va` `vs` times longer, entry `(.., c, ..)` of idx writing
/// its vector at `(.., c * vs + e, ..)`.
fn lut_vectors(lut: &Tensor, idx: &Tensor, va: usize) -> R<Tensor> {
    let r = idx.rank();
    let (ld, dims) = (lut.dims().to_vec(), idx.dims().to_vec());
    let (palette, vs) = (ld[r], ld[r + 1]);
    let lv = lut
        .flatten_all()
        .and_then(|f| f.to_vec1::<f32>())
        .map_err(ce)?;
    let iv = idx
        .flatten_all()
        .and_then(|f| f.to_vec1::<i64>())
        .map_err(ce)?;
    let blocks: Vec<usize> = (0..r).map(|d| dims[d] / ld[d].max(1)).collect();
    let mut out_dims = dims.clone();
    out_dims[va] *= vs;
    let mut out = vec![0f32; iv.len() * vs];
    let mut coord = vec![0usize; r];
    for &i in &iv {
        let k = usize::try_from(i)
            .ok()
            .filter(|&k| k < palette)
            .ok_or_else(|| invalid!("palette index {i} out of range"))?;
        let mut li = 0usize;
        for d in 0..r {
            li = li * ld[d] + coord[d] / blocks[d].max(1);
        }
        for e in 0..vs {
            let mut o = 0usize;
            for d in 0..r {
                let c = if d == va { coord[d] * vs + e } else { coord[d] };
                o = o * out_dims[d] + c;
            }
            out[o] = lv[(li * palette + k) * vs + e];
        }
        for d in (0..r).rev() {
            coord[d] += 1;
            if coord[d] < dims[d] {
                break;
            }
            coord[d] = 0;
        }
    }
    Tensor::from_vec(out, out_dims, &Device::Cpu).map_err(ce)
}
