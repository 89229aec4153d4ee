//! What the cosine gate measures, as pure functions of the two sides'
//! values: cosines per token, the largest error, non-finite values, and
//! the statistics a case reports.

use std::collections::HashMap;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::super::Status;
use crate::interp::Overflow;

/// Agreement of one output over real tokens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OutputStats {
    pub name: String,
    pub min_cos: f64,
    pub mean_cos: f64,
    pub max_abs_err: f64,
    /// Non-finite values in the whole output, pad tokens included.
    pub nonfinite: usize,
    /// Cosine of every real token.
    pub token_cos: Vec<f64>,
}

/// Agreement after one block, over real rows.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BlockStats {
    pub block: String,
    pub min_cos: f64,
    pub mean_cos: f64,
}

/// One case in one bucket.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseResult {
    pub bucket: String,
    pub case: String,
    pub images: Vec<String>,
    pub grid_thw: Vec<[usize; 3]>,
    pub real_patches: usize,
    pub bucket_patches: usize,
    /// `pass`, `fail`, `error` (could not run) or `skipped` (does not fit).
    pub status: Status,
    pub threshold: f64,
    pub outputs: Vec<OutputStats>,
    pub blocks: Vec<BlockStats>,
    pub first_overflow: Option<Overflow>,
    pub drift_enters: Option<String>,
    pub message: String,
    pub seconds: HashMap<String, f64>,
    /// Each op's largest magnitude in this run (the interpreter in fp16 or
    /// ane mode), gathered into the gate's `headroom`; not written per case.
    #[serde(skip)]
    pub peaks: Vec<crate::interp::Peak>,
}

/// Cosine of two vectors in f64; 1 when both are zero, 0 when one is.
pub(super) fn cosine(
    a: impl Iterator<Item = f64> + Clone,
    b: impl Iterator<Item = f64> + Clone,
) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (x, y) in a.zip(b) {
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 && bb == 0.0 {
        1.0
    } else if aa == 0.0 || bb == 0.0 || !ab.is_finite() {
        0.0
    } else {
        ab / (aa.sqrt() * bb.sqrt())
    }
}

/// Compare reference rows `[n, c]` with the artifact's `[1, c, 1, cols]`,
/// reference row `t` against column `columns[t]` (the real ones; `n` is
/// `columns.len()`). Returns per-row cosines, max abs error and non-finite
/// count over the whole artifact tensor.
pub(super) fn compare(
    reference: &[f32],
    c: usize,
    art: &[f32],
    cols: usize,
    columns: &[usize],
) -> (Vec<f64>, f64, usize) {
    let nonfinite = art
        .par_chunks(1 << 16)
        .map(|p| p.iter().filter(|v| !v.is_finite()).count())
        .sum();
    // Channel by channel, so that `art` is read along its rows: a column at
    // a time would touch a new cache line per value.
    let mut rows = vec![0f32; columns.len() * c];
    for (k, channel) in art.chunks_exact(cols).take(c).enumerate() {
        for (t, &col) in columns.iter().enumerate() {
            rows[t * c + k] = channel[col];
        }
    }
    let (cos, max_err) = compare_rows(reference, c, &rows);
    (cos, max_err, nonfinite)
}

/// Per-token cosines and the largest absolute difference between two
/// `[tokens, c]` row-major sets of rows (the reference's and the rows the
/// runtime read from the artifact's output).
pub(super) fn compare_rows(reference: &[f32], c: usize, rows: &[f32]) -> (Vec<f64>, f64) {
    // Per token (over all cores): its cosine and its largest error.
    let per_token: Vec<(f64, f64)> = (0..rows.len() / c.max(1))
        .into_par_iter()
        .map(|t| {
            let r = (0..c).map(move |k| reference[t * c + k] as f64);
            let a = (0..c).map(move |k| rows[t * c + k] as f64);
            let mut max_err = 0f64;
            for (x, y) in r.clone().zip(a.clone()) {
                let e = (x - y).abs();
                max_err = if e.is_nan() {
                    f64::INFINITY
                } else {
                    max_err.max(e)
                };
            }
            (cosine(r, a), max_err)
        })
        .collect();
    let max_err = per_token.iter().map(|&(_, e)| e).fold(0f64, f64::max);
    (per_token.into_iter().map(|(c, _)| c).collect(), max_err)
}

pub(super) fn min_mean(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (1.0, 1.0);
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    (min, v.iter().sum::<f64>() / v.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_reads_the_channel_major_layout() {
        // Reference rows [2 tokens, 3 channels]; artifact [1, 3, 1, 4] with 2 pad columns.
        let r = [1.0, 2.0, 3.0, 0.0, 1.0, 0.0];
        let a = [
            1.0,
            0.0,
            9.0,
            f32::NAN,
            2.0,
            1.0,
            9.0,
            9.0,
            3.0,
            0.0,
            9.0,
            9.0,
        ];
        let (cos, err, nonfinite) = compare(&r, 3, &a, 4, &[0, 1]);
        assert!((cos[0] - 1.0).abs() < 1e-12 && (cos[1] - 1.0).abs() < 1e-12);
        assert_eq!(err, 0.0);
        assert_eq!(nonfinite, 1);
        // A swapped channel pair is seen.
        let a2 = [3.0, 0.0, 0.0, 0.0, 2.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let (cos, err, _) = compare(&r, 3, &a2, 4, &[0, 1]);
        assert!(cos[0] < 0.72 && err == 2.0);
        assert_eq!(cosine([0.0].into_iter(), [0.0].into_iter()), 1.0);
        assert_eq!(cosine([1.0].into_iter(), [0.0].into_iter()), 0.0);
        // Non-finite values are counted in every chunk of a large output,
        // padding columns included.
        let (c, cols) = (3, 100_000);
        let mut big = vec![1f32; c * cols];
        for i in [5, 70_000, 150_000, c * cols - 1] {
            big[i] = f32::INFINITY;
        }
        big[200_001] = f32::NAN;
        let (_, _, nonfinite) = compare(&[1.0; 3], c, &big, cols, &[0]);
        assert_eq!(nonfinite, 5);
    }

    /// What the reference side spills reads back exactly, in any order,
    /// whatever the tensor's float dtype.

    #[test]
    fn compare_rows_agrees_with_the_column_reading() {
        // The rows the runtime returns for the artifact above: [2 tokens, 3].
        let r = [1.0, 2.0, 3.0, 0.0, 1.0, 0.0];
        let rows = [1.0, 2.0, 3.0, 0.0, 1.0, 0.0];
        let (cos, err) = compare_rows(&r, 3, &rows);
        assert_eq!(cos.len(), 2);
        assert!((cos[0] - 1.0).abs() < 1e-12 && (cos[1] - 1.0).abs() < 1e-12 && err == 0.0);
        let swapped = [3.0, 2.0, 1.0, 0.0, 1.0, 0.0];
        let (cos, err) = compare_rows(&r, 3, &swapped);
        let (want, want_err, _) = compare(&r, 3, &[3.0, 0.0, 2.0, 1.0, 1.0, 0.0], 2, &[0, 1]);
        assert_eq!((cos, err), (want, want_err));
        let (_, err) = compare_rows(&r, 3, &[f32::NAN, 2.0, 3.0, 0.0, 1.0, 0.0]);
        assert_eq!(err, f64::INFINITY, "a NaN is the largest error");
    }
}
