//! The export path: checkpoint -> ANE layout -> Core ML packages, and the
//! host-side inputs the exported program takes. Shares no code with
//! `reference`.

pub mod clip;
pub mod dinov2;
pub mod host;
pub mod layout;
pub mod qwen2_5_vl;
pub mod qwen2_vl;
pub mod qwen3_vl;
pub mod siglip;
pub mod siglip2;
