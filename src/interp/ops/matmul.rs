//! Matrix products: `linear` and `matmul` (the 1x1 convolutions, the
//! tower's Linears, are `conv`).

use candle_core::Tensor;

use super::{Inputs, R, V, boolean, ce, f32t, one};

/// `linear` and `matmul`.
pub(super) fn exec(ins: &Inputs) -> R<Vec<V>> {
    let op = ins.op;
    let get = |k: &str| ins.get(k);
    let opt = |k: &str| ins.opt(k);
    let x = || ins.x();
    match op.kind.as_str() {
        "linear" => {
            let t = x()?;
            let w = f32t(&get("weight")?)?;
            let mut y = t.broadcast_matmul(&w.t().map_err(ce)?).map_err(ce)?;
            if let Some(b) = opt("bias")? {
                y = y.broadcast_add(&f32t(&b)?).map_err(ce)?;
            }
            one(y)
        }
        "matmul" => {
            let mut a = f32t(&get("x")?)?;
            let mut b = f32t(&get("y")?)?;
            if opt("transpose_x")?
                .map(|v| boolean(&v))
                .transpose()?
                .unwrap_or(false)
            {
                a = a.t().map_err(ce)?;
            }
            if opt("transpose_y")?
                .map(|v| boolean(&v))
                .transpose()?
                .unwrap_or(false)
            {
                b = b.t().map_err(ce)?;
            }
            let (a1, b1) = (a.rank() == 1, b.rank() == 1);
            let a = if a1 { a.unsqueeze(0).map_err(ce)? } else { a };
            let b = if b1 { b.unsqueeze(1).map_err(ce)? } else { b };
            let mut y = batched_matmul(&a, &b)?;
            if a1 {
                y = y.squeeze(y.rank() - 2).map_err(ce)?;
            }
            if b1 {
                y = y.squeeze(y.rank() - 1).map_err(ce)?;
            }
            one(y)
        }
        other => Err(internal!("op `{other}` is not supported")),
    }
}

/// `a @ b` over broadcast batch dimensions of any rank: both sides are
/// broadcast to one batch shape, made contiguous and run as one 3-D batched
/// product (candle's own broadcasting product refuses the strides of some
/// rank-5 operands).
fn batched_matmul(a: &Tensor, b: &Tensor) -> R<Tensor> {
    if a.rank() < 2 || b.rank() < 2 {
        return Err(invalid!(
            "matmul of ranks {} and {} after promotion",
            a.rank(),
            b.rank()
        ));
    }
    let (ad, bd) = (a.dims(), b.dims());
    let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
    let (k2, n) = (bd[bd.len() - 2], bd[bd.len() - 1]);
    if k != k2 {
        return Err(invalid!(
            "matmul of {ad:?} and {bd:?}: inner dimensions differ"
        ));
    }
    let (ab, bb) = (&ad[..ad.len() - 2], &bd[..bd.len() - 2]);
    let rank = ab.len().max(bb.len());
    let mut batch = Vec::with_capacity(rank);
    for i in 0..rank {
        let x = if i + ab.len() >= rank {
            ab[i + ab.len() - rank]
        } else {
            1
        };
        let y = if i + bb.len() >= rank {
            bb[i + bb.len() - rank]
        } else {
            1
        };
        batch.push(match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(invalid!(
                    "matmul of {ad:?} and {bd:?}: batch dimensions do not broadcast"
                ));
            }
        });
    }
    let count: usize = batch.iter().product();
    let side = |t: &Tensor, r: usize, c: usize| -> R<Tensor> {
        let mut full = batch.clone();
        full.extend([r, c]);
        t.broadcast_as(full)
            .and_then(|t| t.contiguous())
            .and_then(|t| t.reshape((count, r, c)))
            .map_err(ce)
    };
    let y = side(a, m, k)?.matmul(&side(b, k, n)?).map_err(ce)?;
    let mut out = batch;
    out.extend([m, n]);
    y.reshape(out).map_err(ce)
}
