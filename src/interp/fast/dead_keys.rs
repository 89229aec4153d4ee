//! Dead keys: where a chain's mask leaves keys whose probabilities are
//! exactly 0, the tiles of query rows that may skip them, and the bound on
//! the scores that decides it.

use rayon::prelude::*;

/// The query rows of a tile where [`DeadKeys`] cut spans.
const DEAD_TILE_ROWS: usize = 16;

/// A mask value at or below this makes a key dead for its query row: its
/// probability is exactly 0 whatever the scores are, when [`DeadKeys::tile_span`]
/// bounds them. (Masks put -1e4 there; real keys get 0.)
const DEAD_MASK: f32 = -1000.0;

/// Where a chain's mask leaves keys dead, and how large the keys can make a
/// score.
///
/// The op-by-op path computes every score, then `exp(x - max)` of each; a
/// dead key's `x` lies so far below the row's maximum that its exponential
/// is exactly 0 (the interpreter's `exp` is 0 below [`crate::interp::kernels::EXP_LO`]),
/// so its probability is exactly 0 and, with finite values, it adds exactly
/// nothing to the product with `v`. A tile of query rows then computes only
/// the keys from its rows' first live key to their last (16-aligned, so that
/// the softmax's lanes sum what they summed), and the bits are those of the
/// whole row. Whether a dead key's score stays small enough is not assumed:
/// `|q . k| <= |q| |k|` bounds every score of the row, and a tile whose bound
/// is not far enough below its live keys, or would leave fp16's range (the
/// op-by-op path would count it), is computed whole.
pub(super) struct DeadKeys<'a> {
    pub(super) spans: &'a MaskSpans,
    /// Per batch (head): the largest `|k_j|` over every key.
    pub(super) kmax: Vec<f64>,
}

/// Each row of a mask `[rows, keys]`: the span of its live keys (mask above
/// [`DEAD_MASK`]), the mask's extremes, and whether it is zero over the
/// span. One scan serves every head and block that adds the same mask (the
/// interpreter keeps it by the mask's name for a run).
#[derive(Clone)]
pub struct MaskSpans {
    /// `None` where every key is dead or a value outside the span is not
    /// finite.
    pub(super) rows: Vec<Option<RowSpan>>,
    pub(super) keys: usize,
    /// Some row's span leaves keys out.
    pub(super) any_dead: bool,
}

#[derive(Clone, Copy)]
pub(super) struct RowSpan {
    /// The first live key and one past the last.
    lo: usize,
    hi: usize,
    /// The mask's largest value in `lo..hi` (a live key's).
    live_max: f64,
    /// The mask's largest and smallest value outside `lo..hi`.
    out_max: f64,
    out_min: f64,
    /// Every value in `lo..hi` is +0 or -0 (a lone image's keys).
    zero: bool,
}

impl MaskSpans {
    /// Scan `mask [rows, keys]`, each row once.
    pub fn scan(mask: &[f32], keys: usize) -> Self {
        let rows = mask
            .par_chunks(keys)
            .map(|row| {
                // Live: above DEAD_MASK, or NaN.
                let dead = |m: &f32| *m <= DEAD_MASK;
                let lo = row.iter().position(|m| !dead(m))?;
                let hi = row.iter().rposition(|m| !dead(m))? + 1;
                let live_max = row[lo..hi].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let (mut out_max, mut out_min) = (f32::NEG_INFINITY, f32::INFINITY);
                for &m in row[..lo].iter().chain(&row[hi..]) {
                    // Outside the span every value is <= DEAD_MASK (not NaN).
                    (out_max, out_min) = (out_max.max(m), out_min.min(m));
                }
                (live_max.is_finite() && out_min > f32::NEG_INFINITY).then_some(RowSpan {
                    lo,
                    hi,
                    live_max: live_max as f64,
                    out_max: out_max as f64,
                    out_min: out_min as f64,
                    zero: row[lo..hi].iter().all(|&m| m == 0.0),
                })
            })
            .collect::<Vec<_>>();
        let any_dead = rows.iter().flatten().any(|r| r.hi - r.lo < keys);
        MaskSpans {
            rows,
            keys,
            any_dead,
        }
    }

    /// Whether mask row `row` is zero over the keys `lo..hi`.
    pub(super) fn zero_over(&self, row: usize, lo: usize, hi: usize) -> bool {
        self.rows
            .get(row)
            .copied()
            .flatten()
            .is_some_and(|r| r.zero && r.lo <= lo && hi <= r.hi)
    }
}

/// Per batch of `k [batch, hd, keys]`: the largest norm of a key.
pub(super) fn key_norms(k: &[f32], (batch, hd, keys): (usize, usize, usize)) -> Vec<f64> {
    (0..batch)
        .into_par_iter()
        .map(|b| {
            let mut sq = vec![0f64; keys];
            for d in k[b * hd * keys..(b + 1) * hd * keys].chunks_exact(keys) {
                for (s, &x) in sq.iter_mut().zip(d) {
                    *s += x as f64 * x as f64;
                }
            }
            sq.iter().fold(0f64, |a, &b| a.max(b)).sqrt()
        })
        .collect()
}

impl DeadKeys<'_> {
    /// The tiles `(first row, rows)` of a chain's `nq` query rows whose mask
    /// rows start at `row0`: 16 rows each ([`DEAD_TILE_ROWS`]), except that
    /// consecutive groups of 16 that compute every key anyway
    /// ([`DeadKeys::whole`]) go together, up to `big` rows.
    pub(super) fn tiles(&self, row0: usize, nq: usize, big: usize) -> Vec<(usize, usize)> {
        let mut tiles = Vec::new();
        let mut i = 0;
        while i < nq {
            let t = DEAD_TILE_ROWS.min(nq - i);
            let mut j = i + t;
            if self.whole(row0 + i, t) {
                while j < nq && j - i < big {
                    let u = DEAD_TILE_ROWS.min(nq - j).min(big - (j - i));
                    if !self.whole(row0 + j, u) {
                        break;
                    }
                    j += u;
                }
            }
            tiles.push((i, j - i));
            i = j;
        }
        tiles
    }

    /// Whether a tile of the `t` mask rows from `row0` computes every key
    /// whatever its scores: a row with no span, or a span of most keys
    /// ([`DeadKeys::tile_span`]'s first tests).
    fn whole(&self, row0: usize, t: usize) -> bool {
        self.union(row0, t)
            .is_none_or(|(lo, hi)| (hi - lo) * 4 > self.spans.keys * 3)
    }

    /// The 16-aligned union of the spans of the `t` mask rows from `row0`;
    /// `None` where a row has no span.
    fn union(&self, row0: usize, t: usize) -> Option<(usize, usize)> {
        let keys = self.spans.keys;
        let rows = self.spans.rows.get(row0..row0 + t)?;
        let (mut lo, mut hi) = (usize::MAX, 0);
        for r in rows {
            let r = r.as_ref()?;
            (lo, hi) = (lo.min(r.lo), hi.max(r.hi));
        }
        Some((lo / 16 * 16, hi.next_multiple_of(16).min(keys)))
    }

    /// The keys `lo..hi` that the `t` query rows from mask row `row0` of
    /// batch `b` must compute, or `None` when the tile runs whole: a row
    /// with no live key or a non-finite mask, a span of most keys anyway,
    /// or a bound too weak. `q [hd, nq]` is batch `b`'s queries, the tile's
    /// from column `i0`. With `peaks` (fp16 and ane modes, whose peaks are
    /// every score's: [`DeadKeys::dead_peaks`]), each row's mask must be one
    /// value over its dead keys; with `ane`, the scores' bound must also stay
    /// below ane mode's matmul ceiling (32,768: `AneRule::ceiling`), so that
    /// no skipped score would have become infinite.
    pub(super) fn tile_span(
        &self,
        (b, row0, t): (usize, usize, usize),
        (q, nq, i0): (&[f32], usize, usize),
        scale: f32,
        (peaks, ane): (bool, bool),
    ) -> Option<(usize, usize)> {
        let keys = self.spans.keys;
        let rows = self.spans.rows.get(row0..row0 + t)?;
        let (lo, hi) = self.union(row0, t)?;
        if (hi - lo) * 4 > keys * 3 {
            return None;
        }
        if peaks
            && rows
                .iter()
                .any(|r| r.is_some_and(|r| r.out_min != r.out_max))
        {
            return None;
        }
        let mut qsq = vec![0f64; t];
        let hd = q.len() / nq;
        for d in 0..hd {
            let row = &q[d * nq + i0..d * nq + i0 + t];
            for (s, &x) in qsq.iter_mut().zip(row) {
                *s += x as f64 * x as f64;
            }
        }
        // |score| <= |q| |k| (the f32 dot product is within hd * 2^-24 of
        // it: 1e-3 covers that and each stage's fp16 rounding, 2^-11).
        let kmax = self.kmax[b];
        let ok = rows.iter().zip(&qsq).all(|(r, &qs)| {
            let r = r.as_ref().expect("checked above");
            let score = qs.sqrt() * kmax * 1.001 + 1.0;
            let a = score * (scale.abs() as f64) * 1.002 + 1.0;
            let slack = |x: f64| x.abs() * 2e-3 + 1.0;
            // The largest a dead key's value can be, the smallest the row's
            // maximum can be (a live key's).
            let dead_hi = r.out_max + a;
            let max_lo = r.live_max - a;
            let gap = (max_lo - slack(max_lo)) - (dead_hi + slack(dead_hi));
            score < if ane { 32000.0 } else { 60000.0 }
                && a < 60000.0
                && r.out_min - a - slack(r.out_min - a) > -60000.0
                && gap > 100.0
        });
        ok.then_some((lo, hi))
    }

    /// The peaks of the first three stages over the keys that the query
    /// rows from mask row `row0` skipped, from each row's smallest and
    /// largest skipped score (`extremes`, as the whole row computes them):
    /// each stage's value is a non-decreasing or non-increasing function of
    /// the score (fp16 rounding, ane mode's flush, the product by `scale`
    /// and the add of the row's one dead mask value are each monotone), so
    /// its largest `|x|` is at one of the two. (The bound of
    /// [`DeadKeys::tile_span`] keeps every skipped value finite and below
    /// the ceiling, so none counts; a dead key's probability is exactly 0,
    /// which no peak exceeds.)
    pub(super) fn dead_peaks(
        &self,
        row0: usize,
        extremes: &[(f32, f32)],
        scale: f32,
        ane: bool,
        peaks: &mut [f32; 4],
    ) {
        let Some(rows) = self.spans.rows.get(row0..row0 + extremes.len()) else {
            return;
        };
        let mut none = (0, 0);
        let mut made = 0;
        let rule = crate::interp::AneRule::PRODUCT;
        for (&(mn, mx), r) in extremes.iter().zip(rows) {
            let Some(r) = r else { continue };
            if mn > mx {
                continue;
            }
            for x in [mn, mx] {
                let mut s0 = crate::interp::round1(x, false, &mut none);
                if ane {
                    s0 = rule.apply(s0, &mut made);
                }
                let s1 = crate::interp::round1(s0 * scale, false, &mut none);
                let s2 = crate::interp::round1(s1 + r.out_max as f32, false, &mut none);
                for (p, v) in peaks.iter_mut().zip([s0, s1, s2]) {
                    *p = p.max(v.abs());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::attention::{Chain, Mode, attention_chain_seen, values_transposed};
    use super::super::pv::pv_fits;
    use super::super::stages::Simd;
    use super::*;
    use crate::interp::Tally;
    use crate::interp::fast::testing::{lcg, padded_mask};

    /// Skipping dead keys gives the whole chain's bits and counts, where it
    /// skips and where its bound sends a tile back to the whole row: padded
    /// and windowed masks, fp32 and fp16, values that overflow fp16.
    #[test]
    fn dead_keys_are_skipped_bit_exactly() {
        if !Simd::here().any() || !pv_fits(64) {
            eprintln!("no AVX2 nor AVX-512: the chain computes every key, nothing to compare");
            return;
        }
        let (batch, hd, hdv, n) = (3, 64, 64, 300);
        let masks = [
            ("one image and pads", padded_mask(n, &[100])),
            ("two images and pads", padded_mask(n, &[37, 90])),
            ("windows", padded_mask(n, &[64, 64, 64, 64, 44])),
            ("a large image and pads", padded_mask(n, &[260])),
            ("no padding", padded_mask(n, &[n])),
        ];
        // Tiles: rows that attend to most keys (the large image's, and a
        // group of 16 that holds some) in tiles of up to 150 rows (a
        // thread's share), the pad rows by 16.
        let large = MaskSpans::scan(&masks[3].1, n);
        let d = DeadKeys {
            spans: &large,
            kmax: vec![1.0; batch],
        };
        assert_eq!(
            d.tiles(0, n, 150),
            [(0, 150), (150, 112), (262, 16), (278, 16), (294, 6)]
        );
        let base = (
            lcg(batch * hd * n, 1),
            lcg(batch * hd * n, 2),
            lcg(batch * hdv * n, 3),
        );
        // A mask whose dead keys have two values (peaks then need every
        // dead score: such tiles run whole in fp16 and ane modes).
        let mut two = padded_mask(n, &[100]);
        two.iter_mut()
            .step_by(7)
            .filter(|m| **m < 0.0)
            .for_each(|m| *m = -2e4);
        let masks: Vec<(&str, Vec<f32>)> = masks
            .into_iter()
            .chain([("one image, pads of two dead values", two)])
            .collect();
        // The queries' scale at which the pad tile (rows 200..250 of batch 0)
        // has a bound of 35,000: past ane mode's ceiling, inside fp16's range.
        let kmax = key_norms(&base.1, (batch, hd, n));
        let qn = (200..250)
            .map(|i| {
                (0..hd)
                    .map(|d| (base.0[d * n + i] as f64).powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
            .fold(0f64, f64::max);
        let ceiling = (35000.0 / (qn * kmax[0])) as f32;
        // Scaled queries: ordinary scores; scores whose bound passes ane
        // mode's ceiling (skipped in fp16 mode alone); scores whose bound is
        // too weak (the tile runs whole); scores beyond fp16's range (counted).
        // Keys past 150 that repeat three keys (a bucket's pad keys): the
        // skipped keys' peaks multiply each distinct key once.
        let mut repeated = base.1.clone();
        for row in repeated.chunks_exact_mut(n) {
            for j in 153..n {
                row[j] = row[150 + j % 3];
            }
        }
        for (what, qscale) in [
            ("ordinary", 1.0f32),
            ("repeated keys", 1.0),
            ("past the ceiling", ceiling),
            ("weak bound", 1800.0),
            ("overflow", 10000.0),
        ] {
            let q: Vec<f32> = base.0.iter().map(|x| x * qscale).collect();
            let k = if what == "repeated keys" {
                &repeated
            } else {
                &base.1
            };
            let v = &base.2;
            let vt = values_transposed(v, batch, hdv, n).unwrap();
            for (mname, mask) in &masks {
                for (fp16, ane) in [(false, false), (true, false), (true, true)] {
                    let ch = Chain {
                        q: &q,
                        k,
                        v,
                        mask: Some(mask),
                        vt: Some(&vt),
                        kfacts: None,
                        spans: None,
                        scale: 0.125,
                        batch,
                        hd,
                        hdv,
                        queries: n,
                        keys: n,
                    };
                    let mode = Mode { fp16, ane };
                    let run = |ch: &Chain, shortcuts| {
                        attention_chain_seen(ch, mode, true, shortcuts, &Tally::default())
                    };
                    let (whole, cw, pw) = run(&ch, false);
                    let (skipped, cs, ps) = run(&ch, true);
                    // With the spans kept by the caller, as the interpreter does.
                    let spans = MaskSpans::scan(mask, n);
                    let kept = Chain {
                        spans: Some(&spans),
                        ..ch
                    };
                    let (kept, ck, pk) = run(&kept, true);
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    let at = format!("{what}, {mname}, {mode:?}");
                    assert!(bits(&whole) == bits(&skipped), "{at}");
                    assert!(bits(&whole) == bits(&kept), "{at}");
                    assert_eq!(cw, cs, "{at}");
                    assert_eq!(cw, ck, "{at}");
                    // Every score's peaks (fp32 mode has none).
                    assert_eq!(bits(&pw), bits(&ps), "{at}");
                    assert_eq!(bits(&pw), bits(&pk), "{at}");
                    if what == "overflow" && fp16 {
                        assert!(cw[0].0 + cw[0].1 > 0, "{at}: the scores should overflow");
                    }
                }
            }
            // Whether a pad-only tile of batch 0 is cut to its own keys.
            let one = MaskSpans::scan(&masks[0].1, n);
            let dead = DeadKeys {
                spans: &one,
                kmax: key_norms(k, (batch, hd, n)),
            };
            let ordinary = what == "ordinary" || what == "repeated keys";
            let below = ordinary || what == "past the ceiling";
            for (modes, skips) in [
                ((false, false), below),
                ((true, false), below),
                ((true, true), ordinary),
            ] {
                let span = dead.tile_span((0, 200, 50), (&q[..hd * n], n, 200), 0.125, modes);
                assert_eq!(span, skips.then_some((192, 256)), "{what}, {modes:?}");
            }
            // Two dead values in a row: run whole where the peaks are kept.
            let two = MaskSpans::scan(&masks[5].1, n);
            let dead2 = DeadKeys {
                spans: &two,
                kmax: key_norms(k, (batch, hd, n)),
            };
            let span = |modes| dead2.tile_span((0, 200, 50), (&q[..hd * n], n, 200), 0.125, modes);
            if ordinary {
                assert_eq!(span((false, false)), Some((192, 256)));
                assert_eq!(span((true, false)), None);
            }
            // Unpadded rows attend to every key: nothing to cut.
            let dead = DeadKeys {
                spans: &large,
                kmax: key_norms(k, (batch, hd, n)),
            };
            assert_eq!(
                dead.tile_span((0, 0, 50), (&q[..hd * n], n, 0), 0.125, (true, false)),
                None
            );
        }
    }
}
