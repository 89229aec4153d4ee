//! The 1x1 convolution (the ANE layout's Linear) as a BLAS product, with
//! its exact shortcut for repeated columns.

use rayon::prelude::*;

use crate::interp::Tally;

/// The weights of a 1x1 convolution, `[o, c]` row-major: f32, or fp16 as
/// the package stores them (widened a task's rows at a time, exactly).
#[derive(Clone, Copy)]
pub enum ConvWeights<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
}

impl ConvWeights<'_> {
    fn len(&self) -> usize {
        match self {
            ConvWeights::F32(w) => w.len(),
            ConvWeights::F16(w) => w.len(),
        }
    }
}

/// `y[b] = W · x[b] + bias` for `x [n, c, s]`, `W [o, c]`, `bias [o]`:
/// a 1x1 convolution with unit stride and no padding. The output starts as
/// the broadcast bias and the product accumulates into it.
///
/// A column of `x[b]` equal bit for bit to the one before it (in every
/// channel) has the same output column: where such repeats are a quarter of
/// the columns or more, the product runs over the distinct columns alone and
/// each repeat copies its column's output ([`distinct_columns`]). Padding is
/// where this pays: a bucket's pad slots hold the same values, block after
/// block, until the merger.
///
/// The bits are the whole product's because BLAS computes each output
/// column in the lanes of one kernel, the same sum in the same order
/// wherever the column stands, as long as it is not in the kernel's
/// remainder (the last columns when their count is not a multiple of its
/// width). So the shortcut runs only when the column count is a multiple of
/// [`COLUMN_GROUP`], and fills the distinct columns up to such a multiple:
/// every column of both products is in a whole group. That holds for some
/// kernels and not others: OpenBLAS's Haswell and Zen kernels gave equal
/// columns of one product different bits by position, so the shortcut runs
/// only under the kernels [`crate::blas::columns_independent`] names.
/// Checked against the whole product in the tests, and with the shortcuts
/// off (`shortcuts` false, `ANE_EXPORT_SHORTCUTS=0`) on whole towers. The
/// columns computed, and all of them, are added to `tally`.
pub fn conv1x1(
    x: &[f32],
    (n, c, s): (usize, usize, usize),
    w: ConvWeights,
    o: usize,
    bias: Option<&[f32]>,
    shortcuts: bool,
    tally: &Tally,
) -> Vec<f32> {
    debug_assert_eq!(x.len(), n * c * s);
    debug_assert_eq!(w.len(), o * c);
    let mut dst = vec![0f32; n * o * s];
    for (bi, out) in dst.chunks_exact_mut(o * s).enumerate() {
        let xb = &x[bi * c * s..(bi + 1) * c * s];
        let distinct = (shortcuts && crate::blas::columns_independent())
            .then(|| distinct_columns(xb, c, s))
            .flatten();
        tally.conv_columns(distinct.as_ref().map_or(s, |(cols, _)| cols.len()), s);
        match distinct {
            Some((cols, of)) => {
                let u = cols.len();
                // The distinct columns, gathered: [c, u].
                let mut xu = vec![0f32; c * u];
                xu.par_chunks_mut(u)
                    .zip(xb.par_chunks(s))
                    .for_each(|(d, row)| d.iter_mut().zip(&cols).for_each(|(d, &j)| *d = row[j]));
                let mut yu = vec![0f32; o * u];
                product(&xu, (c, u), w, bias, &mut yu);
                out.par_chunks_mut(s)
                    .zip(yu.par_chunks(u))
                    .for_each(|(d, row)| d.iter_mut().zip(&of).for_each(|(d, &k)| *d = row[k]));
            }
            None => product(xb, (c, s), w, bias, out),
        }
    }
    dst
}

/// `out [o, s] = W · x + bias` for `x [c, s]`: `out` starts as the
/// broadcast bias and the product accumulates into it (without a bias it
/// is overwritten).
pub(super) fn product(
    x: &[f32],
    (c, s): (usize, usize),
    w: ConvWeights,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let o = out.len() / s;
    debug_assert_eq!(out.len(), o * s);
    if let Some(b) = bias {
        out.par_chunks_mut(s)
            .enumerate()
            .for_each(|(r, row)| row.fill(b[r]));
    }
    // SAFETY: out is [o, s], W [o, c] and x [c, s], all row-major and
    // contiguous, with the lengths the caller's shapes give.
    unsafe {
        let a = match w {
            ConvWeights::F32(w) => crate::blas::exact::Left::F32(w.as_ptr(), c),
            ConvWeights::F16(w) => crate::blas::exact::Left::F16(w),
        };
        crate::blas::conv_sgemm(
            (o, s, c),
            a,
            (x.as_ptr(), s),
            (out.as_mut_ptr(), s),
            bias.is_some(),
        )
    }
}

/// The columns of a 1x1 convolution go through BLAS in whole groups of
/// this many for [`conv1x1`]'s shortcut: the width of OpenBLAS's sgemm
/// kernels in the columns' dimension (16 lanes of AVX-512), a multiple of
/// the narrower kernels' widths. Measured (`crate::blas::columns_independent`):
/// a column in a product of any multiple of 16 columns has the bits it has
/// among 1024; 8, 24 or 40 columns gave others under the SkylakeX and
/// Cooperlake kernels. Groups of 64 computed up to 63 dummy columns: 48 of
/// 384 for a 324-patch image in a 1024-patch bucket.
pub(in crate::interp) const COLUMN_GROUP: usize = 16;

/// For `x [c, s]` whose columns repeat: the distinct columns' indices (each
/// run's first column, then the last one again up to a multiple of
/// [`COLUMN_GROUP`]) and, per column, the index of its run in that list.
/// `None` when fewer than a quarter of the columns repeat the one before,
/// or `s` is not a multiple of [`COLUMN_GROUP`].
fn distinct_columns(x: &[f32], c: usize, s: usize) -> Option<(Vec<usize>, Vec<usize>)> {
    if s < 2 || c == 0 || !s.is_multiple_of(COLUMN_GROUP) {
        return None;
    }
    // Per column j >= 1: equal to column j - 1 in every channel, as bits
    // (+0 and -0 differ; a NaN is equal to the same NaN).
    const BAND: usize = 32;
    let same = x
        .par_chunks(s * BAND)
        .map(|band| {
            let mut same = vec![true; s];
            for row in band.chunks_exact(s) {
                for (j, eq) in same.iter_mut().enumerate().skip(1) {
                    *eq &= row[j].to_bits() == row[j - 1].to_bits();
                }
            }
            same
        })
        .reduce(
            || vec![true; s],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(a, b)| *a &= b);
                a
            },
        );
    let repeats = same[1..].iter().filter(|&&e| e).count();
    if repeats * 4 < s {
        return None;
    }
    let mut cols = Vec::with_capacity(s - repeats);
    let mut of = Vec::with_capacity(s);
    for (j, &eq) in same.iter().enumerate() {
        if j == 0 || !eq {
            cols.push(j);
        }
        of.push(cols.len() - 1);
    }
    let last = cols[cols.len() - 1];
    cols.resize(cols.len().next_multiple_of(COLUMN_GROUP), last);
    (cols.len() < s).then_some((cols, of))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::fast::testing::lcg;

    /// What [`COLUMN_GROUP`] rests on, under the kernels that
    /// `columns_independent` names: a column multiplied among any whole
    /// number of groups of columns has the bits it has among 1024, with
    /// f32 and fp16 weights, at small and odd inner sizes (where narrower
    /// remainder kernels would show) and at a tower's. Elsewhere the
    /// shortcut does not run, and there is nothing to check.
    #[test]
    fn columns_in_whole_groups_are_computed_alike_wherever_they_stand() {
        if !crate::blas::columns_independent() {
            eprintln!("BLAS kernels {}: not checked", crate::blas::kernel());
            return;
        }
        let s = 1024;
        for (o, c) in [(96, 70), (96, 33), (50, 129), (256, 1024)] {
            let w = lcg(o * c, 21);
            let w16: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
            let x = lcg(c * s, 22);
            for w in [ConvWeights::F32(&w), ConvWeights::F16(&w16)] {
                let mut whole = vec![0f32; o * s];
                product(&x, (c, s), w, None, &mut whole);
                for groups in [1, 2, 3, 5, 7, 21] {
                    let u = groups * COLUMN_GROUP;
                    // Columns from all over, out of order.
                    let cols: Vec<usize> = (0..u).map(|j| (j * 37 + 11) % s).collect();
                    let mut xu = vec![0f32; c * u];
                    for (d, row) in xu.chunks_exact_mut(u).zip(x.chunks_exact(s)) {
                        d.iter_mut().zip(&cols).for_each(|(d, &j)| *d = row[j]);
                    }
                    let mut yu = vec![0f32; o * u];
                    product(&xu, (c, u), w, None, &mut yu);
                    for (a, b) in yu.chunks_exact(u).zip(whole.chunks_exact(s)) {
                        for (k, &j) in cols.iter().enumerate() {
                            assert_eq!(a[k].to_bits(), b[j].to_bits(), "{o} x {c}, {u} columns");
                        }
                    }
                }
            }
        }
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "at {i}: {x} vs {y}");
        }
    }

    #[test]
    fn conv1x1_is_a_matrix_product_plus_bias() {
        let (n, c, s, o) = (2, 5, 7, 3);
        let (x, w, b) = (lcg(n * c * s, 1), lcg(o * c, 2), lcg(o, 3));
        let y = conv1x1(
            &x,
            (n, c, s),
            ConvWeights::F32(&w),
            o,
            Some(&b),
            true,
            &Tally::default(),
        );
        let mut want = vec![0f32; n * o * s];
        for bi in 0..n {
            for r in 0..o {
                for j in 0..s {
                    let dot: f32 = (0..c).map(|k| w[r * c + k] * x[(bi * c + k) * s + j]).sum();
                    want[(bi * o + r) * s + j] = dot + b[r];
                }
            }
        }
        close(&y, &want, 1e-6);
        let y0 = conv1x1(
            &x,
            (n, c, s),
            ConvWeights::F32(&w),
            o,
            None,
            true,
            &Tally::default(),
        );
        let no_bias: Vec<f32> = want
            .iter()
            .enumerate()
            .map(|(i, v)| v - b[(i / s) % o])
            .collect();
        close(&y0, &no_bias, 1e-6);
        // fp16 weights: bit for bit the product with the widened weights.
        let w16: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
        let wide: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        assert_eq!(
            conv1x1(
                &x,
                (n, c, s),
                ConvWeights::F16(&w16),
                o,
                Some(&b),
                true,
                &Tally::default()
            ),
            conv1x1(
                &x,
                (n, c, s),
                ConvWeights::F32(&wide),
                o,
                Some(&b),
                true,
                &Tally::default()
            )
        );
    }

    /// Repeated columns: the product over the distinct ones gives the whole
    /// product's bits, with f32 and fp16 weights, with and without a bias,
    /// for repeats at the start, inside and at the end, and -0 against +0.
    #[test]
    fn repeated_columns_are_computed_once_bit_exactly() {
        let (c, s, o) = (96, 320, 70);
        let mut x = lcg(c * s, 11);
        // Column j takes the values of column src(j): runs of repeats.
        let src = |j: usize| match j {
            0..=9 => 0,
            40..=59 => 40,
            100 => 99,
            150..=319 => 150,
            j => j,
        };
        for row in x.chunks_exact_mut(s) {
            for j in 0..s {
                row[j] = row[src(j)];
            }
        }
        // Column 120 equals 119 but for one -0 against +0: not a repeat.
        for j in [119, 120] {
            x[5 * s + j] = if j == 119 { 0.0 } else { -0.0 };
        }
        for j in 121..150 {
            for ch in 0..c {
                x[ch * s + j] = x[ch * s + 121];
            }
        }
        if !crate::blas::columns_independent() {
            eprintln!(
                "BLAS kernels {}: repeated columns are not shortcut",
                crate::blas::kernel()
            );
            let y = conv1x1(
                &x,
                (1, c, s),
                ConvWeights::F32(&lcg(o * c, 12)),
                o,
                None,
                true,
                &Tally::default(),
            );
            let mut whole = vec![0f32; o * s];
            product(
                &x,
                (c, s),
                ConvWeights::F32(&lcg(o * c, 12)),
                None,
                &mut whole,
            );
            assert!(
                y.iter()
                    .zip(&whole)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            return;
        }
        let (cols, of) = distinct_columns(&x, c, s).expect("repeats");
        // 0; 10..=39; 40; 60..=99; 101..=118; 119; 120; 121; 150: 94 distinct,
        // then 150 again up to 96.
        assert_eq!(cols.len(), 96);
        assert!(cols[94..].iter().all(|&j| j == 150));
        assert!(cols.contains(&120) && !cols.contains(&100) && cols.contains(&150));
        assert_eq!(of.len(), s);
        let w = lcg(o * c, 12);
        let w16: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
        let bias = lcg(o, 13);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for w in [ConvWeights::F32(&w), ConvWeights::F16(&w16)] {
            for b in [None, Some(bias.as_slice())] {
                let mut whole = vec![0f32; o * s];
                product(&x, (c, s), w, b, &mut whole);
                let y = conv1x1(&x, (1, c, s), w, o, b, true, &Tally::default());
                assert!(bits(&whole) == bits(&y));
            }
        }
        // Few repeats, or a column count out of whole groups: the whole
        // product runs.
        assert!(distinct_columns(&lcg(c * s, 14), c, s).is_none());
        assert!(distinct_columns(&x[..c * 300], c, 300).is_none());
    }
}
