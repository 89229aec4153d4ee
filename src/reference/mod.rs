//! What the fp32 reference towers share: the kernels and the ViT blocks.
//! Each family's tower is its folder's `reference.rs`
//! (`family/<family>/reference.rs`). They keep the checkpoint's layout and
//! share no code with the export path, so that comparing the two compares
//! independent implementations.

pub mod kernels;
pub mod vit;

use candle_core::Tensor;

use crate::error::{GridError, Result};
pub use vit::{TowerOutput, to_vec};

/// A reference text encoder: each text's token ids (special tokens
/// included, no padding) and token type ids to the outputs of
/// [`crate::family::Tower::outputs`], the texts' rows one after another
/// (`last_hidden_state [tokens, D]`, then `pooler_output [texts, D]` where
/// the checkpoint has a pooler). Every text attends to its own tokens alone:
/// the reference never pads.
pub trait TextEncoder: Send + Sync {
    fn forward(
        &self,
        texts: &[crate::preprocess::TokenBatch],
        keep_blocks: bool,
    ) -> Result<TowerOutput>;

    /// The largest magnitude the residual stream reaches in each block on
    /// one text, where the program carries it divided by `--residual-scale`
    /// (a post-norm block's sums before its norms; a pre-norm block's
    /// stream after it): what the build calibrates the scale on.
    fn stream_peaks(&self, text: &crate::preprocess::TokenBatch) -> Result<Vec<f32>>;
}

/// A reference tower: `pixel_values` (`[n, C*T*P*P]` f32, rows as the
/// family's processor orders them) and the images' `grid_thw` to the
/// outputs of [`crate::family::VisionConfig::output_names`].
pub trait VisionTower: Send + Sync {
    /// Run the tower; `keep_blocks` also returns every block's hidden states.
    fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput>;

    /// Check `grid_thw` against `rows` x `cols` of `pixel_values`; the message says what is wrong.
    fn check_grid(
        &self,
        rows: usize,
        cols: usize,
        grid_thw: &[[usize; 3]],
    ) -> std::result::Result<(), GridError>;
}
