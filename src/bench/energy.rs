//! The energy accounting of `ane-run bench --energy`: each unit's mean power
//! over samples, and energy per image against an idle baseline. Pure.

use super::plist::EnergySample;

/// Mean power of each unit over some samples.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Power {
    pub ane_mw: f64,
    /// `None` unless every sample gives the unit's energy.
    pub cpu_mw: Option<f64>,
    pub gpu_mw: Option<f64>,
    /// Total length of the samples.
    pub seconds: f64,
    pub samples: usize,
}

/// Energy over time of the samples, unit by unit (mJ / s = mW). None when
/// there are no samples.
pub fn mean_power(samples: &[EnergySample]) -> Option<Power> {
    let ns: u64 = samples.iter().map(|s| s.elapsed_ns).sum();
    if ns == 0 {
        return None;
    }
    let seconds = ns as f64 * 1e-9;
    let mw = |f: fn(&EnergySample) -> Option<f64>| {
        samples
            .iter()
            .map(f)
            .sum::<Option<f64>>()
            .map(|mj| mj / seconds)
    };
    Some(Power {
        ane_mw: samples.iter().map(|s| s.ane_mj).sum::<f64>() / seconds,
        cpu_mw: mw(|s| s.cpu_mj),
        gpu_mw: mw(|s| s.gpu_mj),
        seconds,
        samples: samples.len(),
    })
}

/// Millijoules per image of each unit, in total and above the idle
/// baseline; `None` for a unit the samples did not give.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct UnitEnergy {
    pub ane_mj: f64,
    pub cpu_mj: Option<f64>,
    pub gpu_mj: Option<f64>,
}

/// What [`PowerMetrics::measure`] reports for one row.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct EnergyPerImage {
    /// Mean power while the model ran, times the wall time per image.
    pub total: UnitEnergy,
    /// The same with the idle power subtracted first.
    pub above_idle: UnitEnergy,
    /// Mean power over the samples wholly inside the loop.
    pub busy: Power,
    /// Images run in the loop and its wall time per image.
    pub images: usize,
    pub seconds_per_image: f64,
}

/// Energy per image from the power while busy, the idle power, and the
/// wall time per image.
pub fn energy_per_image(busy: Power, idle: Power, images: usize, seconds: f64) -> EnergyPerImage {
    let t = seconds / images.max(1) as f64;
    EnergyPerImage {
        total: UnitEnergy {
            ane_mj: busy.ane_mw * t,
            cpu_mj: busy.cpu_mw.map(|mw| mw * t),
            gpu_mj: busy.gpu_mw.map(|mw| mw * t),
        },
        above_idle: UnitEnergy {
            ane_mj: (busy.ane_mw - idle.ane_mw) * t,
            cpu_mj: busy.cpu_mw.zip(idle.cpu_mw).map(|(b, i)| (b - i) * t),
            gpu_mj: busy.gpu_mw.zip(idle.gpu_mw).map(|(b, i)| (b - i) * t),
        },
        busy,
        images,
        seconds_per_image: t,
    }
}
