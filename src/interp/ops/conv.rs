//! `conv`: the 1x1 convolution as a matrix product
//! ([`crate::interp::fast::conv1x1`]), rank-4 convolutions through candle, and
//! the general path over 1 to 3 spatial axes.

use candle_core::{Device, Tensor};

use super::super::{Interpreter, Map, Tally, V};
use super::{R, ce, f32t, ints};
use crate::error::InterpError;
use crate::mlpackage::Op;

impl Interpreter<'_> {
    /// `conv` for rank-4 inputs (N, C, H, W) with valid, same or custom padding.
    /// Whether a rank-4 `conv` is a 1x1 convolution with unit strides, no
    /// padding and one group: a matrix product over channels, column by
    /// column ([`crate::interp::fast::conv1x1`]).
    pub(in crate::interp) fn conv_is_pointwise(&self, op: &Op, env: &Map<String, V>) -> R<bool> {
        let get = |k: &str| -> R<Option<V>> { self.arg(op, env, k) };
        let w = get("weight")?.ok_or_else(|| InterpError::MissingArg("weight".into()))?;
        let wd = w.tensor()?.dims().to_vec();
        let ones = |k: &str| -> R<bool> {
            Ok(get(k)?
                .map(|v| ints(&v))
                .transpose()?
                .is_none_or(|v| v.iter().all(|&x| x == 1)))
        };
        let pads_zero = match get("pad_type")? {
            None => true,
            Some(V::S(s)) if matches!(s.as_str(), "valid" | "same" | "same_lower") => true,
            Some(V::S(s)) if s == "custom" => get("pad")?
                .map(|v| ints(&v))
                .transpose()?
                .is_none_or(|p| p.iter().all(|&v| v == 0)),
            _ => false,
        };
        Ok(wd.len() == 4
            && wd[2] == 1
            && wd[3] == 1
            && ones("strides")?
            && ones("groups")?
            && pads_zero)
    }

    /// `conv`; a 1x1 convolution's columns computed are added to `tally`.
    pub(super) fn conv(&self, op: &Op, env: &Map<String, V>, tally: &Tally) -> R<Tensor> {
        let get = |k: &str| -> R<Option<V>> { self.arg(op, env, k) };
        let x = f32t(&get("x")?.ok_or_else(|| InterpError::MissingArg("x".into()))?)?;
        // Weights stay fp16 when the interpreter keeps them as stored
        // (`fp16_conv_weights`); the 1x1 product widens them as it goes,
        // every other path takes them as f32.
        let w = get("weight")?
            .ok_or_else(|| InterpError::MissingArg("weight".into()))?
            .tensor()?
            .clone();
        let w32 = || f32t(&V::T(w.clone()));
        if x.rank() != w.rank() || !(3..=5).contains(&x.rank()) {
            return Err(invalid!(
                "conv on rank {} input with rank {} weight: expected 1-D, 2-D or 3-D convolution \
                 (input and weight of one rank, 3 to 5)",
                x.rank(),
                w.rank()
            ));
        }
        if x.rank() != 4 {
            return self.conv_nd(op, env, &x, &w32()?);
        }
        let pair = |k: &str| -> R<[usize; 2]> {
            Ok(match get(k)? {
                Some(v) => {
                    let v = ints(&v)?;
                    [
                        v.first().copied().unwrap_or(1) as usize,
                        v.get(1).copied().unwrap_or(1) as usize,
                    ]
                }
                None => [1, 1],
            })
        };
        let strides = pair("strides")?;
        let dil = pair("dilations")?;
        let groups = get("groups")?
            .map(|v| ints(&v))
            .transpose()?
            .and_then(|v| v.first().copied())
            .unwrap_or(1) as usize;
        let pad_type = match get("pad_type")? {
            Some(V::S(s)) => s,
            _ => "valid".into(),
        };
        if strides[0] != strides[1] || dil[0] != dil[1] {
            // Per-axis strides or dilations: the general path.
            return self.conv_nd(op, env, &x, &w32()?);
        }
        let (kh, kw) = (w.dims()[2], w.dims()[3]);
        // A 1x1 conv with unit stride and no padding is a matrix product over
        // channels: [O, C] x [C, H*W] (the ANE layout's Linear, R2).
        let pads_zero = match pad_type.as_str() {
            "valid" | "same" | "same_lower" => true,
            "custom" => get("pad")?
                .map(|v| ints(&v))
                .transpose()?
                .is_none_or(|p| p.iter().all(|&v| v == 0)),
            _ => false,
        };
        if (kh, kw) == (1, 1) && strides == [1, 1] && groups == 1 && pads_zero {
            let (n, c, h, wd) = x.dims4().map_err(ce)?;
            let o = w.dims()[0];
            if w.dims()[1] != c {
                return Err(invalid!(
                    "weight {:?} does not fit an input of {c} channels",
                    w.dims()
                ));
            }
            let bias = get("bias")?
                .map(|b| {
                    let b = f32t(&b)?;
                    if b.elem_count() != o {
                        return Err(invalid!(
                            "bias of {} values for {o} outputs",
                            b.elem_count()
                        ));
                    }
                    b.flatten_all().and_then(|f| f.to_vec1::<f32>()).map_err(ce)
                })
                .transpose()?;
            let y = crate::interp::with_f32(&x, |xv| {
                let conv = |wv: crate::interp::fast::ConvWeights<'_>| {
                    crate::interp::fast::conv1x1(
                        xv,
                        (n, c, h * wd),
                        wv,
                        o,
                        bias.as_deref(),
                        self.settings.shortcuts,
                        tally,
                    )
                };
                match crate::interp::with_f16(&w, |wv| {
                    conv(crate::interp::fast::ConvWeights::F16(wv))
                }) {
                    Some(y) => Ok(y),
                    None => crate::interp::with_f32(&w, |wv| {
                        conv(crate::interp::fast::ConvWeights::F32(wv))
                    }),
                }
            })
            .and_then(|r| r)
            .map_err(ce)?;
            return Tensor::from_vec(y, (n, o, h, wd), &Device::Cpu).map_err(ce);
        }
        let (h, wd) = (x.dims()[2], x.dims()[3]);
        // [top, bottom, left, right]
        let pads: [usize; 4] = match pad_type.as_str() {
            "valid" => [0; 4],
            "custom" => {
                let p = ints(&get("pad")?.ok_or_else(|| invalid!("custom padding needs `pad`"))?)?;
                if p.len() != 4 || p.iter().any(|&v| v < 0) {
                    return Err(invalid!("pad {p:?}: expected 4 non-negative values"));
                }
                [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
            }
            "same" | "same_lower" => {
                let total = |n: usize, k: usize, s: usize, d: usize| {
                    let out = n.div_ceil(s);
                    ((out - 1) * s + (k - 1) * d + 1).saturating_sub(n)
                };
                let (th, tw) = (
                    total(h, kh, strides[0], dil[0]),
                    total(wd, kw, strides[1], dil[1]),
                );
                if pad_type == "same" {
                    [th / 2, th - th / 2, tw / 2, tw - tw / 2]
                } else {
                    [th - th / 2, th / 2, tw - tw / 2, tw / 2]
                }
            }
            other => return Err(unsupported!("pad_type `{other}` is not supported")),
        };
        let x = x
            .pad_with_zeros(2, pads[0], pads[1])
            .and_then(|t| t.pad_with_zeros(3, pads[2], pads[3]))
            .map_err(ce)?;
        let mut y = x
            .conv2d(&w32()?, 0, strides[0], dil[0], groups)
            .map_err(ce)?;
        if let Some(b) = get("bias")? {
            let b = f32t(&b)?;
            y = y
                .broadcast_add(&b.reshape((1, b.elem_count(), 1, 1)).map_err(ce)?)
                .map_err(ce)?;
        }
        Ok(y)
    }

    /// `conv` over 1, 2 or 3 spatial axes with per-axis strides, dilations
    /// and padding (valid, same, same_lower, custom), as an explicit
    /// gather of each output's window and a product with the weights per
    /// group. The general path: the tower's convs take the faster ones.
    fn conv_nd(&self, op: &Op, env: &Map<String, V>, x: &Tensor, w: &Tensor) -> R<Tensor> {
        let get = |k: &str| -> R<Option<V>> { self.arg(op, env, k) };
        let nd = x.rank() - 2;
        let (xd, wd) = (x.dims().to_vec(), w.dims().to_vec());
        let per_axis = |k: &str| -> R<Vec<usize>> {
            match get(k)? {
                Some(v) => {
                    let v = ints(&v)?;
                    if v.len() != nd || v.iter().any(|&s| s < 1) {
                        return Err(invalid!("{k} {v:?}: expected {nd} positive values"));
                    }
                    Ok(v.iter().map(|&s| s as usize).collect())
                }
                None => Ok(vec![1; nd]),
            }
        };
        let (strides, dil) = (per_axis("strides")?, per_axis("dilations")?);
        let groups = get("groups")?
            .map(|v| ints(&v))
            .transpose()?
            .and_then(|v| v.first().copied())
            .unwrap_or(1)
            .max(1) as usize;
        let (n, c, o) = (xd[0], xd[1], wd[0]);
        if c % groups != 0 || o % groups != 0 || wd[1] * groups != c {
            return Err(invalid!(
                "weight {wd:?} with {groups} groups does not fit an input of {c} channels"
            ));
        }
        let k: Vec<usize> = wd[2..].to_vec();
        let pad_type = match get("pad_type")? {
            Some(V::S(s)) => s,
            _ => "valid".into(),
        };
        // (before, after) per spatial axis.
        let pads: Vec<(usize, usize)> = match pad_type.as_str() {
            "valid" => vec![(0, 0); nd],
            "custom" => {
                let p = ints(&get("pad")?.ok_or_else(|| invalid!("custom padding needs `pad`"))?)?;
                if p.len() != 2 * nd || p.iter().any(|&v| v < 0) {
                    return Err(invalid!(
                        "pad {p:?}: expected {} non-negative values",
                        2 * nd
                    ));
                }
                (0..nd)
                    .map(|i| (p[2 * i] as usize, p[2 * i + 1] as usize))
                    .collect()
            }
            "same" | "same_lower" => (0..nd)
                .map(|i| {
                    let out = xd[2 + i].div_ceil(strides[i]);
                    let t = ((out - 1) * strides[i] + (k[i] - 1) * dil[i] + 1)
                        .saturating_sub(xd[2 + i]);
                    if pad_type == "same" {
                        (t / 2, t - t / 2)
                    } else {
                        (t - t / 2, t / 2)
                    }
                })
                .collect(),
            other => return Err(unsupported!("pad_type `{other}` is not supported")),
        };
        let mut xp = x.clone();
        for (i, &(b, a)) in pads.iter().enumerate() {
            xp = xp.pad_with_zeros(2 + i, b, a).map_err(ce)?;
        }
        let sp: Vec<usize> = xp.dims()[2..].to_vec();
        let mut out_sp = Vec::with_capacity(nd);
        for i in 0..nd {
            let span = (k[i] - 1) * dil[i] + 1;
            if sp[i] < span {
                return Err(invalid!(
                    "conv window of {span} on axis {} of {} (padded): no output",
                    2 + i,
                    sp[i]
                ));
            }
            out_sp.push((sp[i] - span) / strides[i] + 1);
        }
        let xv = xp
            .flatten_all()
            .and_then(|f| f.to_vec1::<f32>())
            .map_err(ce)?;
        let wv = w
            .flatten_all()
            .and_then(|f| f.to_vec1::<f32>())
            .map_err(ce)?;
        let (cg, og) = (c / groups, o / groups);
        let ksize: usize = k.iter().product();
        let osize: usize = out_sp.iter().product();
        let isize: usize = sp.iter().product();
        // Row-major offsets of an index within a shape.
        let offset = |idx: &[usize], shape: &[usize]| {
            idx.iter()
                .zip(shape)
                .fold(0usize, |acc, (&i, &s)| acc * s + i)
        };
        let unravel = |mut f: usize, shape: &[usize]| {
            let mut v = vec![0usize; shape.len()];
            for d in (0..shape.len()).rev() {
                v[d] = f % shape[d];
                f /= shape[d];
            }
            v
        };
        let mut y = vec![0f32; n * o * osize];
        let mut col = vec![0f32; cg * ksize];
        let mut pos = vec![0usize; nd];
        for b in 0..n {
            for op_i in 0..osize {
                let oi = unravel(op_i, &out_sp);
                for g in 0..groups {
                    for ci in 0..cg {
                        for kk in 0..ksize {
                            let ki = unravel(kk, &k);
                            for d in 0..nd {
                                pos[d] = oi[d] * strides[d] + ki[d] * dil[d];
                            }
                            col[ci * ksize + kk] =
                                xv[(b * c + g * cg + ci) * isize + offset(&pos, &sp)];
                        }
                    }
                    for oc in 0..og {
                        let wrow = &wv[(g * og + oc) * cg * ksize..(g * og + oc + 1) * cg * ksize];
                        let acc: f32 = wrow.iter().zip(&col).map(|(a, b)| a * b).sum();
                        y[(b * o + g * og + oc) * osize + op_i] = acc;
                    }
                }
            }
        }
        let mut shape = vec![n, o];
        shape.extend(&out_sp);
        let mut y = Tensor::from_vec(y, shape, &Device::Cpu).map_err(ce)?;
        if let Some(bias) = get("bias")? {
            let bias = f32t(&bias)?;
            let mut bs = vec![1usize, bias.elem_count()];
            bs.extend(vec![1; nd]);
            y = y
                .broadcast_add(&bias.reshape(bs).map_err(ce)?)
                .map_err(ce)?;
        }
        Ok(y)
    }
}
