//! The attention chain's inner stages on one row of scores: scale, mask,
//! fp16 rounding and counts, softmax; portable, AVX2 and AVX-512, with the
//! same bits.

#[cfg(target_arch = "x86_64")]
mod x86;

use super::Counts;
use crate::interp::AneRule;
use crate::interp::fp16::round_f16_seen;
use crate::interp::kernels::softmax_in_place;

/// The vector path [`inner_stages`] takes: each gives the portable path's
/// bits in three passes over a row instead of seven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Simd {
    /// The portable stages, op by op.
    None,
    /// 8 lanes: AVX2 with FMA, F16C and POPCNT (the product with V uses FMA).
    Avx2,
    /// 16 lanes: AVX-512F with AVX2, F16C and POPCNT.
    Avx512,
}

impl Simd {
    /// The widest path this CPU has, or narrower where the environment's
    /// `ANE_EXPORT_SIMD` asks (`avx2` or `none`, for a side-by-side
    /// comparison and for the tests of the narrower paths; read once).
    pub(super) fn here() -> Simd {
        static HERE: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *HERE.get_or_init(|| {
            let best = Simd::detected();
            match std::env::var("ANE_EXPORT_SIMD").as_deref() {
                Ok("none") => Simd::None,
                Ok("avx2") if best == Simd::Avx512 => Simd::Avx2,
                _ => best,
            }
        })
    }

    /// The widest path this CPU has (AVX2 at most where `ANE_EXPORT_CPU=avx2`
    /// asks: [`crate::blas::avx512`]).
    fn detected() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let base = has!("avx2") && has!("fma") && has!("f16c") && has!("popcnt");
            if base && crate::blas::avx512() {
                return Simd::Avx512;
            }
            if base {
                return Simd::Avx2;
            }
        }
        Simd::None
    }

    /// Whether a vector path runs here: the chain's dead keys, equal rows
    /// and its product with V by [`super::pv`] then keep their sums.
    pub(super) fn any(self) -> bool {
        self != Simd::None
    }
}

/// The mask that [`inner_stages`] adds to one row of scores.
#[derive(Clone, Copy)]
pub(super) enum RowMask<'a> {
    /// The chain has no add.
    Absent,
    /// Zero over the row's keys (from [`MaskSpans`]), so not read: the sum
    /// is the scaled row again, with its fp16 rounding's counts taken again
    /// as the op-by-op path takes them. (A `-0` stays `-0` where the add
    /// would give `+0`; no later value differs: `exp(±0)` is 1 and
    /// `x - (±0)` is `x`.)
    Zero,
    /// The mask's values over the row's keys.
    Values(&'a [f32]),
}

/// The chain's inner stages on one query row of scores, in place:
/// `scaled = row * scale`, `masked = scaled + mask`, `probs = softmax(masked)`.
/// With `fp16 = Some(check)`, the scores and each stage's output are rounded
/// to fp16 as the op-by-op path rounds them, and (with `check`) counted
/// first into `c`. `simd` (from [`Simd::here`]) takes the AVX2 or AVX-512
/// path, which gives the same bits in three passes over the row instead of
/// seven. With fp16, `peaks` keeps each stage's largest `|x|`; with `ane`,
/// each stage's rounding is followed by its op's [`AneRule`] (the scores'
/// matmul: ceiling and flush; NaN to +0 in all) and `c` counts (infs, infs
/// the rule made), as the op-by-op path counts in ane mode.
#[allow(clippy::too_many_arguments)]
pub(super) fn inner_stages(
    row: &mut [f32],
    mask: RowMask,
    scale: f32,
    fp16: Option<bool>,
    ane: bool,
    c: &mut [Counts; 4],
    peaks: &mut [f32; 4],
    simd: Simd,
) {
    // The rule acts on rounded values only.
    let ane = ane && fp16.is_some();
    #[cfg(target_arch = "x86_64")]
    if simd.any() {
        // SAFETY: `simd` says the CPU has the features the path needs.
        unsafe { x86::inner_stages(row, mask, scale, fp16, ane, c, peaks, simd) };
        return;
    }
    let _ = simd;
    let mut stage = |s: &mut [f32], i: usize| {
        if let Some(check) = fp16 {
            let rule = AneRule::product_if(i == 0);
            let seen = round_f16_seen(s, check, ane.then_some(&rule));
            let (n, sat) = if ane {
                (seen.infs, seen.made)
            } else {
                seen.counts
            };
            c[i].0 += n;
            c[i].1 += sat;
            peaks[i] = peaks[i].max(seen.max_abs);
        }
    };
    stage(row, 0);
    row.iter_mut().for_each(|x| *x *= scale);
    stage(row, 1);
    match mask {
        RowMask::Absent => {}
        // Each value is fp16 already: the rounding keeps it, and counts.
        RowMask::Zero => stage(row, 2),
        RowMask::Values(m) => {
            row.iter_mut().zip(m).for_each(|(x, m)| *x += m);
            stage(row, 2);
        }
    }
    softmax_in_place(row);
    stage(row, 3);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::fast::testing::lcg;

    /// Bits, with every NaN alike (the compiler may commute a product, and
    /// with it which NaN's sign propagates).
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter()
            .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
            .collect()
    }

    /// The vector paths this CPU runs: AVX2 under AVX-512 too.
    pub(in crate::interp::fast) fn vector_paths() -> Vec<Simd> {
        match Simd::detected() {
            Simd::Avx512 => vec![Simd::Avx2, Simd::Avx512],
            Simd::Avx2 => vec![Simd::Avx2],
            Simd::None => vec![],
        }
    }

    /// The AVX2 and AVX-512 inner stages give the portable stages' bits,
    /// counts and peaks, in fp32, fp16 and ane modes: on plain rows with a
    /// tail, on rows with values beyond fp16's range, past ane mode's
    /// ceiling, fp16 subnormals (ane mode's flush), and on rows with an
    /// infinity or a NaN.
    #[test]
    fn inner_stages_paths_agree() {
        for len in [5usize, 8, 16, 37, 90, 300] {
            let plain: Vec<f32> = lcg(len, 11).iter().map(|v| v * 40.0).collect();
            let mask: Vec<f32> = (0..len)
                .map(|i| if i % 3 == 0 { -1e9 } else { 0.0 })
                .collect();
            let mut big = plain.clone();
            big[len / 2] = 1e6;
            big[len - 1] = -7e4;
            let mut inf = plain.clone();
            inf[len - 2] = f32::INFINITY;
            let mut nan = plain.clone();
            nan[1] = f32::NAN;
            let mut ceiling = plain.clone();
            ceiling[0] = 40000.0;
            ceiling[len - 1] = -32768.0;
            ceiling[len / 2] = 32752.0;
            let mut tiny = plain.clone();
            tiny[len / 3] = 3e-5;
            tiny[len - 1] = -1e-7;
            // Past the ceiling and NaN where the 16-lane path takes one
            // register at a time after its quads (lengths 90 and 300).
            let mut late = plain.clone();
            late[len * 7 / 8] = 40000.0;
            late[(len * 7 / 8 + 1) % len] = f32::NAN;
            for (kind, row) in [
                ("plain", &plain),
                ("big", &big),
                ("inf", &inf),
                ("nan", &nan),
                ("ceiling", &ceiling),
                ("tiny", &tiny),
                ("late", &late),
            ] {
                for (fp16, ane) in [
                    (None, false),
                    (Some(false), false),
                    (Some(true), false),
                    (Some(false), true),
                    (Some(true), true),
                ] {
                    for m in [RowMask::Absent, RowMask::Values(&mask)] {
                        let mut a = row.clone();
                        let mut ca = [(0, 0); 4];
                        let mut pa = [0.0; 4];
                        inner_stages(&mut a, m, 0.37, fp16, ane, &mut ca, &mut pa, Simd::None);
                        for simd in vector_paths() {
                            let mut b = row.clone();
                            let mut cb = [(0, 0); 4];
                            let mut pb = [0.0; 4];
                            inner_stages(&mut b, m, 0.37, fp16, ane, &mut cb, &mut pb, simd);
                            let at = format!("{kind} len {len} fp16 {fp16:?} ane {ane} {simd:?}");
                            assert_eq!(bits(&a), bits(&b), "{at}");
                            assert_eq!(ca, cb, "{at}");
                            assert_eq!(bits(&pa), bits(&pb), "{at}");
                        }
                        if ane {
                            // No NaN survives ane mode; the ceiling makes
                            // infs of the scores past it, counted as made.
                            assert!(a.iter().all(|x| !x.is_nan()), "{kind} len {len}");
                            let want = match kind {
                                "ceiling" => (2, 2),
                                "late" => (1, 1),
                                "big" => (2, 0),
                                "inf" => (1, 0),
                                _ => (0, 0),
                            };
                            assert_eq!(ca[0], want, "{kind} len {len} ane");
                            continue;
                        }
                        if fp16 == Some(true) {
                            let want = match kind {
                                "plain" | "ceiling" | "tiny" => (0, 0),
                                "big" => (0, 2),
                                // "inf", "nan", "late"
                                _ => (1, 0),
                            };
                            assert_eq!(ca[0], want, "{kind} len {len}");
                        }
                        if kind == "plain" {
                            let sum: f32 = a.iter().sum();
                            assert!((sum - 1.0).abs() < 1e-2, "{sum}");
                        }
                    }
                }
            }
        }
    }

    /// A mask of zeros not read ([`RowMask::Zero`]) gives the bits and
    /// counts of adding it, on both paths: rows with -0 scores (the add
    /// would make them +0), a row of zeros, values beyond fp16's range,
    /// infinities and NaN, masks of +0 and of -0.
    #[test]
    fn a_zero_mask_not_read_gives_the_same_bits_and_counts() {
        for len in [5usize, 16, 37, 300] {
            let mut plain: Vec<f32> = lcg(len, 5).iter().map(|v| v * 30.0).collect();
            plain[0] = -0.0;
            plain[len - 1] = -0.0;
            let zeros = vec![0f32; len];
            let mut negzeros = vec![-0f32; len];
            negzeros[len / 2] = 0.0;
            let mut big = plain.clone();
            big[len / 2] = 7e4;
            let mut odd = plain.clone();
            odd[1] = f32::NAN;
            odd[len - 2] = f32::NEG_INFINITY;
            let mut simds = vector_paths();
            simds.push(Simd::None);
            for row in [&plain, &vec![-0f32; len], &big, &odd] {
                for (fp16, ane) in [
                    (None, false),
                    (Some(false), false),
                    (Some(true), false),
                    (Some(true), true),
                ] {
                    for added in [&zeros, &negzeros] {
                        for &simd in &simds {
                            let (mut a, mut b) = (row.clone(), row.clone());
                            let (mut ca, mut cb) = ([(0, 0); 4], [(0, 0); 4]);
                            let (mut pa, mut pb) = ([0.0; 4], [0.0; 4]);
                            let added = RowMask::Values(added);
                            inner_stages(&mut a, added, 0.125, fp16, ane, &mut ca, &mut pa, simd);
                            inner_stages(
                                &mut b,
                                RowMask::Zero,
                                0.125,
                                fp16,
                                ane,
                                &mut cb,
                                &mut pb,
                                simd,
                            );
                            let at = format!("len {len} fp16 {fp16:?} ane {ane} {simd:?}");
                            assert_eq!(bits(&a), bits(&b), "{at}");
                            assert_eq!(ca, cb, "{at}");
                            assert_eq!(bits(&pa), bits(&pb), "{at}");
                            if fp16 == Some(true) && row == &big {
                                assert_eq!(cb[2], (1, 0), "{at}: 7e4 is inf after stage 1");
                            }
                        }
                    }
                }
            }
        }
    }
}
