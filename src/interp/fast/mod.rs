//! CPU kernels for the ops that dominate a vision tower's program: the 1x1
//! convolution (the ANE layout's Linear), layer norm over the channel axis,
//! softmax over the last axis, fp16 weight decoding, and the attention chain
//! `matmul → mul → add → softmax → matmul` run in tiles of query rows (see
//! [`attention_chain_seen`]). Each computes what the op-by-op path computes, in
//! f32, over all cores; in fp16 mode every op output is still rounded.
//!
//! By job: `conv.rs` (the 1x1 convolution), `norms.rs` (layer norm,
//! softmax rows), `attention.rs` (the chain's tiles and batches),
//! `dead_keys.rs` (the keys a tile may skip), `stages/` (a row's scale,
//! mask, rounding and softmax: `mod.rs` the portable path, `x86.rs` the
//! AVX2 and AVX-512 ones) and `pv.rs` (the product with V).

mod attention;
mod conv;
mod dead_keys;
mod norms;
mod pv;
mod stages;

pub use attention::{
    Chain, Counts, KeyFacts, Mode, TransposedV, attention_chain_seen, attention_path,
    rows_independent, rows_independent_here, values_transposed,
};
pub(super) use conv::COLUMN_GROUP;
pub use conv::{ConvWeights, conv1x1};
pub use dead_keys::MaskSpans;
pub use norms::{layer_norm_axis, softmax_rows};

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
