//! fp32 reference towers, one file per family. They keep the checkpoint's
//! layout and share no code with the export path, so that comparing the two
//! compares independent implementations.

pub mod kernels;
pub mod qwen3_vl;

pub use qwen3_vl::{Qwen3VisionTower, TowerOutput};
