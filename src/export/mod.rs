//! The export path: checkpoint -> ANE layout -> Core ML packages, and the
//! host-side inputs the exported program takes. Shares no code with
//! `reference`.

pub mod host;
pub mod layout;
