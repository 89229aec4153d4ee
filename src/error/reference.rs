//! Why a call's `pixel_values` and `grid_thw` do not go together for a
//! reference tower (the towers' `check_grid` raises it).

/// Why `pixel_values` (`rows` x `cols`) and `grid_thw` disagree.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GridError {
    /// Rows of another length than the model's patch.
    #[error("pixel_values rows hold {got} values, the model expects {expected}")]
    RowLength { got: usize, expected: usize },
    /// No image.
    #[error("grid_thw is empty")]
    Empty,
    /// An image's grid with a zero side, or sides the merge does not divide.
    #[error(
        "grid_thw[{index}] = [{t}, {h}, {w}]: expected positive sizes with h and w multiples of {multiple}"
    )]
    Sizes {
        index: usize,
        t: usize,
        h: usize,
        w: usize,
        multiple: usize,
    },
    /// A grid whose patch count overflows.
    #[error("grid_thw[{0}] overflows")]
    Overflow(usize),
    /// The grids' patches and the rows differ in number.
    #[error("grid_thw describes {patches} patches but pixel_values has {rows} rows")]
    Rows { patches: usize, rows: usize },
    /// More than one frame for a fixed-resolution encoder.
    #[error(
        "grid_thw[{index}]: {t} frames; a fixed-resolution encoder takes one image per grid (t = 1)"
    )]
    Frames { index: usize, t: usize },
}
