//! `ane-run bench`'s measurements on a Mac: what it reads, the chip (`system_profiler -xml
//! SPHardwareDataType`) and energy samples (`powermetrics -f plist`), both
//! property lists. The parsers and the energy accounting are pure functions
//! and run anywhere; running the tools needs macOS (and root for
//! `powermetrics`). Figures from here are "measured on a Mac".
//!
//! # How energy per image is measured
//!
//! [`PowerMetrics`] runs `powermetrics` for the whole benchmark and reads its
//! output file as it grows. Before any model is loaded it waits for a few
//! samples: their mean power is the idle baseline. For each row,
//! [`PowerMetrics::measure`] runs the model back to back until at least
//! `min_samples` samples lie wholly inside that loop (the first two samples
//! that end inside it are left out: the first began before it, and so may
//! the second if the first was not yet in the file). The energy per image
//! of each unit is its mean power over those samples times the loop's wall
//! time per image; "above idle" subtracts the baseline's power first. A
//! `powermetrics` without the `ane_power` sampler is run without it
//! ([`SAMPLERS`]).
//!
//! [`plist`] parses, [`energy`] accounts, [`powermetrics`] runs the tools.

pub mod energy;
pub mod plist;
pub mod powermetrics;

pub use energy::{EnergyPerImage, Power, UnitEnergy, energy_per_image, mean_power};
pub use plist::{EnergySample, PlistError, Stream, chip_name, powermetrics_stream};
pub use powermetrics::{BenchError, INTERVAL_MS, PowerMetrics, SAMPLERS, require_root, this_chip};

#[cfg(test)]
mod tests;
