//! What the families' ANE layouts share: checkpoint tensors written in the
//! layout and storage the builders take (each family's layout is its
//! folder's `layout.rs`). Shares no code with `reference`; the host inputs
//! are a stage of their own (`crate::host`).

pub mod layout;
