//! CPU kernels for the ops that dominate a vision tower's program: the 1x1
//! convolution (the ANE layout's Linear), layer norm over the channel axis,
//! softmax over the last axis, fp16 weight decoding, and the attention chain
//! `matmul → mul → add → softmax → matmul` run in tiles of query rows (see
//! [`attention_chain`]). Each computes what the op-by-op path computes, in
//! f32, over all cores; in fp16 mode every op output is still rounded.
//!
//! By job: `conv.rs` (the 1x1 convolution), `norms.rs` (layer norm,
//! softmax rows), `attention.rs` (the chain's tiles and batches),
//! `dead_keys.rs` (the keys a tile may skip), `stages.rs` (a row's scale,
//! mask, rounding and softmax) and `pv.rs` (the product with V).

mod attention;
mod conv;
mod dead_keys;
mod norms;
mod pv;
mod stages;

pub use attention::{
    Chain, Counts, TransposedV, attention_chain, rows_independent, rows_independent_here,
    values_transposed,
};
pub(super) use conv::COLUMN_GROUP;
pub use conv::{ConvWeights, conv1x1};
pub use dead_keys::MaskSpans;
pub use norms::{layer_norm_axis, softmax_rows};

/// What the shortcuts saved in this process so far: (computed, in all) of
/// the 1x1 convolutions' columns, of the attention chains' scores, and of
/// the other ops' output columns (last axis; fewer where a value is packed,
/// see `packed.rs`).
pub fn shortcut_work() -> [(u64, u64); 3] {
    use std::sync::atomic::Ordering::Relaxed;
    [0, 1, 2].map(|k| (WORK[2 * k].load(Relaxed), WORK[2 * k + 1].load(Relaxed)))
}

static WORK: [std::sync::atomic::AtomicU64; 6] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 6];

/// Add to [`shortcut_work`]'s counts of `kind` (0 convolution columns, 1
/// attention scores, 2 other ops' columns).
pub(super) fn count_work(kind: usize, computed: usize, all: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    WORK[2 * kind].fetch_add(computed as u64, Relaxed);
    WORK[2 * kind + 1].fetch_add(all as u64, Relaxed);
}

/// Whether the interpreter takes its exact shortcuts (repeated columns of
/// a 1x1 convolution, dead keys and equal batches of an attention chain,
/// packed columns carried through the program): yes unless
/// `ANE_EXPORT_SHORTCUTS=0`, which computes every column, key and batch, to
/// check that the shortcuts change no bit.
pub fn shortcuts() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ANE_EXPORT_SHORTCUTS").is_none_or(|v| v != "0"))
}

#[cfg(test)]
pub(super) mod testing {
    pub(super) fn lcg(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// A block-diagonal mask as the hosts make them: images of `sizes`
    /// tokens in turn, every later row a pad that attends to itself alone.
    pub(super) fn padded_mask(n: usize, sizes: &[usize]) -> Vec<f32> {
        let mut m = vec![-1e4f32; n * n];
        let mut start = 0;
        for &len in sizes {
            for q in start..start + len {
                m[q * n + start..q * n + start + len].fill(0.0);
            }
            start += len;
        }
        for q in start..n {
            m[q * n + q] = 0.0;
        }
        m
    }
}
