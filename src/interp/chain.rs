//! Attention chains run in tiles ([`super::fast::attention_chain_seen`]) on a
//! run's values: their operands, what the chains of a run share (V
//! transposed, the mask's spans and packed rows, the keys' norms), the
//! query rows computed once where q is packed, and the first overflow of
//! their inner stages.

use candle_core::{DType as CDType, Device, Tensor};
use rayon::prelude::*;

use super::fp16::with_f32;
use super::{Interpreter, Map, Overflow, Precision, Tally, V, fast, fuse, packed};
use crate::error::InterpError;
use crate::mlpackage::{Arg, Op};

/// What a run's attention chains keep from one chain to the next: the
/// last `v` transposed (the query chunks of one head share it) and each
/// mask's spans by name (values are SSA names: within a run, one name is one
/// value).
#[derive(Default)]
pub(super) struct ChainCache {
    vt: Option<(String, Option<fast::TransposedV>)>,
    spans: Map<String, fast::MaskSpans>,
    /// Per mask name: its rows for the last packed queries that used it.
    rows: RowCache,
    /// The last chain's k by name, and what its chains keep of it.
    kfacts: Option<(String, fast::KeyFacts)>,
}

#[derive(Default)]
struct RowCache(Map<String, PackedRows>);

/// A mask's rows for packed queries of some classes: `None` when the
/// mask's rows do not repeat as the queries' columns do.
struct PackedRows {
    classes: Vec<u32>,
    mask: Option<Tensor>,
    spans: Option<fast::MaskSpans>,
}

impl RowCache {
    /// The rows of `mask [batch or 1, queries, keys]` for queries packed
    /// over `classes` (one row per class, its first query's), if every
    /// query's row equals its class's first row bit for bit; kept per mask
    /// name while the classes stay the same.
    fn packed_rows(
        &mut self,
        name: &str,
        mask: &Tensor,
        classes: &packed::Index,
    ) -> Result<Option<Tensor>, InterpError> {
        if let Some(r) = self.0.get(name)
            && r.classes == classes.of
        {
            return Ok(r.mask.clone());
        }
        let e = InterpError::Candle;
        let (mb, nq, nk) = mask.dims3().map_err(e)?;
        let first = &classes.first;
        let repeats = with_f32(mask, |m| {
            (0..mb * nq).into_par_iter().all(|r| {
                let (b, j) = (r / nq, r % nq);
                let f = first[classes[j] as usize] as usize;
                let (a, c) = ((b * nq + j) * nk, (b * nq + f) * nk);
                m[a..a + nk]
                    .iter()
                    .zip(&m[c..c + nk])
                    .all(|(x, y)| x.to_bits() == y.to_bits())
            })
        })
        .map_err(e)?;
        let rows = if repeats {
            let idx = Tensor::from_vec(first.clone(), first.len(), &Device::Cpu).map_err(e)?;
            Some(
                mask.index_select(&idx, 1)
                    .map_err(e)?
                    .contiguous()
                    .map_err(e)?,
            )
        } else {
            None
        };
        self.0.insert(
            name.to_string(),
            PackedRows {
                classes: classes.of.clone(),
                mask: rows.clone(),
                spans: None,
            },
        );
        Ok(rows)
    }
}

/// What an attention chain gave: its context (packed with `classes`, if
/// any), its first overflow, and how many query rows it computed.
pub(super) struct ChainOut {
    pub(super) ctx: Tensor,
    pub(super) overflow: Option<Overflow>,
    pub(super) classes: Option<packed::Classes>,
    pub(super) rows: usize,
    /// The largest `|x|` of the four inner stages (0 for an absent add).
    pub(super) peaks: [f32; 4],
}

/// What [`chain_run`] needs besides the operands.
struct ChainArgs<'a> {
    vt: Option<&'a fast::TransposedV>,
    kfacts: Option<&'a fast::KeyFacts>,
    spans: Option<&'a fast::MaskSpans>,
    scale: f32,
    /// (batch, hd, hdv, queries, keys).
    dims: (usize, usize, usize, usize, usize),
    fp16: bool,
    /// Ane mode: each stage's [`super::AneRule`] too.
    ane: bool,
    check: bool,
    /// The shortcuts of [`Settings`](super::Settings).
    shortcuts: bool,
    /// The run's counts.
    tally: &'a Tally,
}

/// A chain's context, and its inner stages' counts and peaks.
type Stages = (Vec<f32>, [fast::Counts; 4], [f32; 4]);

/// [`fast::attention_chain_seen`] on tensors (contiguous f32).
fn chain_run(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    a: &ChainArgs,
) -> Result<Stages, InterpError> {
    let (batch, hd, hdv, queries, keys) = a.dims;
    with_f32(q, |q| {
        with_f32(k, |k| {
            with_f32(v, |v| {
                let run = |mask: Option<&[f32]>| {
                    fast::attention_chain_seen(
                        &fast::Chain {
                            q,
                            k,
                            v,
                            mask,
                            vt: a.vt,
                            kfacts: a.kfacts,
                            spans: a.spans,
                            scale: a.scale,
                            batch,
                            hd,
                            hdv,
                            queries,
                            keys,
                        },
                        fast::Mode {
                            fp16: a.fp16,
                            ane: a.ane,
                        },
                        a.check,
                        a.shortcuts,
                        a.tally,
                    )
                };
                match mask {
                    Some(m) => with_f32(m, |m| run(Some(m))),
                    None => Ok(run(None)),
                }
            })
        })
    })
    .and_then(|r| r)
    .and_then(|r| r)
    .and_then(|r| r)
    .map_err(InterpError::from)
}

impl Interpreter<'_> {
    /// Run an attention chain in tiles; in fp16 mode with `check`, also
    /// name the first of its inner ops whose output overflowed.
    ///
    /// With `q_classes`, `q` in `env` is packed over those classes: where
    /// each query row is computed alike wherever it stands
    /// ([`fast::rows_independent`]) and the mask's rows repeat as q's columns
    /// do, the chain runs on the distinct rows alone and its context comes
    /// back packed with the same classes ([`ChainOut::classes`]); otherwise,
    /// or when a stage overflows (whose counts must be the whole chain's), it
    /// runs on every row, and its context is packed only if its columns are
    /// checked to repeat as q's do.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn exec_chain(
        &self,
        p: &fuse::Plan,
        env: &Map<String, V>,
        precision: Precision,
        check: bool,
        cache: &mut ChainCache,
        q_classes: Option<&packed::Classes>,
        tally: &Tally,
    ) -> Result<ChainOut, InterpError> {
        let ops = &self.func.ops;
        let (sc, cx) = (&ops[p.scores], &ops[p.ctx]);
        let get = |op: &Op, k: &str| -> Result<Tensor, InterpError> {
            self.arg(op, env, k)?
                .ok_or_else(|| InterpError::MissingArg(k.to_string()))?
                .tensor()?
                .to_dtype(CDType::F32)
                .and_then(|t| t.contiguous())
                .map_err(InterpError::from)
        };
        let (q, k, v) = (get(sc, "x")?, get(sc, "y")?, get(cx, "x")?);
        let scale = self.resolve(&p.scale, env)?;
        let scale = scale
            .tensor()?
            .flatten_all()
            .and_then(|t| t.to_dtype(CDType::F32))
            .and_then(|t| t.to_vec1::<f32>())?;
        let mask = match &p.mask {
            Some(m) => Some(
                self.resolve(m, env)?
                    .tensor()?
                    .to_dtype(CDType::F32)
                    .and_then(|t| t.contiguous())?,
            ),
            None => None,
        };
        let ((b, hd, nqp), (_, _, nk), (_, hdv, _)) = (q.dims3()?, k.dims3()?, v.dims3()?);
        let nq = q_classes.map_or(nqp, |c| c.len());
        // The planner checked the declared shapes; every value has its declared shape.
        if k.dims() != [b, hd, nk]
            || v.dims() != [b, hdv, nk]
            || scale.len() != 1
            || q_classes.is_some_and(|c| c.width() != nqp)
            || mask
                .as_ref()
                .is_some_and(|m| m.dims() != [b, nq, nk] && m.dims() != [1, nq, nk])
        {
            return Err(invalid!(
                "attention chain operands q {:?}, k {:?}, v {:?}, mask {:?} do not fit",
                q.dims(),
                k.dims(),
                v.dims(),
                mask.as_ref().map(|m| m.dims().to_vec())
            ));
        }
        let fp16 = precision.rounds();
        let ane = precision == Precision::Ane;
        // Values are SSA names: within a run, one name is one value.
        let v_name = match cx.inputs.get("x").map(Vec::as_slice) {
            Some([Arg::Var(n)]) => Some(n.as_str()),
            _ => None,
        };
        let cached = matches!((&cache.vt, v_name), (Some((c, _)), Some(n)) if c == n);
        if !cached {
            let vt = with_f32(&v, |v| fast::values_transposed(v, b, hdv, nk))?;
            cache.vt = v_name.map(|n| (n.to_string(), vt));
        }
        let vt = cache.vt.as_ref().and_then(|(_, vt)| vt.as_ref());
        let mask_name = match &p.mask {
            Some(Arg::Var(name)) => Some(name.as_str()),
            _ => None,
        };
        // The distinct query rows' mask (`Some(None)` without a mask), where
        // the chain can run on the distinct rows.
        let rows = match q_classes {
            Some(c) if fast::rows_independent(vt, hdv) => match (&mask, mask_name) {
                (None, _) => Some(None),
                (Some(m), Some(name)) => cache.rows.packed_rows(name, m, c)?.map(Some),
                (Some(_), None) => None,
            },
            _ => None,
        };
        let stages = [Some(p.scores), Some(p.scaled), p.masked, Some(p.probs)];
        let overflow_of = |counts: [fast::Counts; 4]| {
            stages
                .iter()
                .zip(counts)
                .find_map(|(i, (nonfinite, saturated))| {
                    let op = &ops[(*i)?];
                    (nonfinite + saturated > 0).then(|| Overflow {
                        op: op.label().to_string(),
                        kind: op.kind.clone(),
                        nonfinite,
                        saturated,
                    })
                })
        };
        // The keys' norms, kept while the chains read the same k.
        let k_name = match sc.inputs.get("y").map(Vec::as_slice) {
            Some([Arg::Var(n)]) => Some(n.as_str()),
            _ => None,
        };
        if cache.kfacts.as_ref().map(|(n, _)| Some(n.as_str())) != Some(k_name) {
            cache.kfacts = k_name.map(|n| (n.to_string(), fast::KeyFacts::default()));
        }
        let kfacts = cache.kfacts.as_ref().map(|(_, k)| k);
        let args = |spans, queries| ChainArgs {
            vt,
            kfacts,
            spans,
            scale: scale[0],
            dims: (b, hd, hdv, queries, nk),
            fp16,
            ane,
            check,
            shortcuts: self.settings.shortcuts,
            tally,
        };
        if let (Some(rows), Some(c)) = (rows, q_classes) {
            // The packed mask's spans, kept with its rows.
            let spans = match (&rows, mask_name, vt) {
                (Some(m), Some(name), Some(vt)) if vt.finite => {
                    let entry = cache
                        .rows
                        .0
                        .get_mut(name)
                        .ok_or_else(|| internal!("packed rows not kept"))?;
                    if entry.spans.is_none() {
                        entry.spans = Some(with_f32(m, |m| fast::MaskSpans::scan(m, nk))?);
                    }
                    entry.spans.as_ref()
                }
                _ => None,
            };
            let (ctx, counts, peaks) = chain_run(&q, &k, &v, rows.as_ref(), &args(spans, nqp))?;
            if counts.iter().all(|&(n, s)| n + s == 0) {
                // The rows not computed count among the scores in all.
                tally.scores(0, b * (nq - nqp) * nk);
                let ctx = Tensor::from_vec(ctx, (b, hdv, nqp), &Device::Cpu)?;
                return Ok(ChainOut {
                    ctx,
                    overflow: None,
                    classes: Some(c.clone()),
                    rows: nqp,
                    peaks,
                });
            }
        }
        // Every row: q unpacked where it came packed.
        let q = match q_classes {
            Some(c) => packed::gather_last(&q, c)?,
            None => q,
        };
        // The mask's spans, scanned once per mask value (every head and
        // block that adds it), where its values stay f32 and keep a name.
        let spans = match (mask_name, &mask) {
            (Some(name), Some(m)) if vt.is_some_and(|vt| vt.finite) => {
                if !cache.spans.contains_key(name) {
                    let s = with_f32(m, |m| fast::MaskSpans::scan(m, nk))?;
                    cache.spans.insert(name.to_string(), s);
                }
                cache.spans.get(name)
            }
            _ => None,
        };
        let (ctx, counts, peaks) = chain_run(&q, &k, &v, mask.as_ref(), &args(spans, nq))?;
        let ctx = Tensor::from_vec(ctx, (b, hdv, nq), &Device::Cpu)?;
        // Rows computed one by one may still repeat as q's columns do (pad
        // rows that attend to themselves alone give their own, equal, values):
        // checked bit for bit, the context is packed again.
        if let Some(c) = q_classes
            && let Some(packed) = packed::pack_if_repeats(&ctx, c)?
        {
            return Ok(ChainOut {
                ctx: packed,
                overflow: overflow_of(counts),
                classes: Some(c.clone()),
                rows: nq,
                peaks,
            });
        }
        Ok(ChainOut {
            ctx,
            overflow: overflow_of(counts),
            classes: None,
            rows: nq,
            peaks,
        })
    }
}
