//! What `ane-run bench` reads on a Mac: the chip (`system_profiler -xml
//! SPHardwareDataType`) and energy samples (`powermetrics -f plist`), both
//! property lists. The parsers are pure functions of bytes and run anywhere;
//! running the tools needs macOS (and root for `powermetrics`). Figures from
//! here are "measured on a Mac".

use std::path::Path;

use plist::Value;

/// The chip (or CPU) and model named by `system_profiler -xml SPHardwareDataType`.
pub fn chip_name(xml: &[u8]) -> Result<String, String> {
    let v = Value::from_reader(std::io::Cursor::new(xml))
        .map_err(|e| format!("system_profiler output is not a property list: {e}"))?;
    let items = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_dictionary)
        .find(|d| d.get("_dataType").and_then(Value::as_string) == Some("SPHardwareDataType"))
        .and_then(|d| d.get("_items"))
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_dictionary)
        .ok_or("system_profiler output has no SPHardwareDataType item")?;
    let s = |k: &str| items.get(k).and_then(Value::as_string);
    let chip = s("chip_type")
        .or_else(|| s("cpu_type"))
        .ok_or("SPHardwareDataType has neither chip_type nor cpu_type")?;
    Ok(match s("machine_model") {
        Some(m) => format!("{chip} ({m})"),
        None => chip.to_string(),
    })
}

/// One `powermetrics` sample: its length and the energy of each unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct EnergySample {
    pub elapsed_ns: u64,
    /// Millijoules over the sample.
    pub ane_mj: f64,
    pub cpu_mj: f64,
    pub gpu_mj: f64,
}

fn number(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Integer(i) => i
            .as_signed()
            .map(|x| x as f64)
            .or(i.as_unsigned().map(|x| x as f64)),
        Value::Real(r) => Some(*r),
        _ => None,
    }
}

/// The samples of a `powermetrics -f plist` stream: one property list per
/// sample, separated by NUL bytes. Energies are `processor.ane_energy`,
/// `processor.cpu_energy` and `processor.gpu_energy` (or `gpu.gpu_energy`), in mJ.
pub fn powermetrics_samples(bytes: &[u8]) -> Result<Vec<EnergySample>, String> {
    let mut out = Vec::new();
    for (i, chunk) in bytes.split(|&b| b == 0).enumerate() {
        if chunk.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        let v = Value::from_reader(std::io::Cursor::new(chunk))
            .map_err(|e| format!("powermetrics sample {i}: not a property list: {e}"))?;
        let d = v
            .as_dictionary()
            .ok_or_else(|| format!("powermetrics sample {i}: expected a dictionary"))?;
        let elapsed_ns = number(d.get("elapsed_ns"))
            .ok_or_else(|| format!("powermetrics sample {i}: no elapsed_ns"))?
            as u64;
        let p = d.get("processor").and_then(Value::as_dictionary);
        let g = d.get("gpu").and_then(Value::as_dictionary);
        let e = |k: &str| number(p.and_then(|p| p.get(k)));
        out.push(EnergySample {
            elapsed_ns,
            ane_mj: e("ane_energy").ok_or_else(|| {
                format!("powermetrics sample {i}: no processor.ane_energy (run with --samplers ane_power)")
            })?,
            cpu_mj: e("cpu_energy").unwrap_or(0.0),
            gpu_mj: e("gpu_energy")
                .or_else(|| number(g.and_then(|g| g.get("gpu_energy"))))
                .unwrap_or(0.0),
        });
    }
    Ok(out)
}

/// The Mac's chip, from `system_profiler` (macOS only).
pub fn this_chip() -> Result<String, String> {
    let o = std::process::Command::new("system_profiler")
        .args(["-xml", "SPHardwareDataType"])
        .output()
        .map_err(|e| format!("system_profiler: {e}"))?;
    chip_name(&o.stdout)
}

/// `powermetrics` sampling ANE, CPU and GPU power into a file until stopped
/// (macOS, root).
pub struct PowerMetrics {
    child: std::process::Child,
    file: std::path::PathBuf,
}

impl PowerMetrics {
    pub fn start(file: &Path, interval_ms: u32) -> Result<PowerMetrics, String> {
        let child = std::process::Command::new("powermetrics")
            .args([
                "--samplers",
                "ane_power,cpu_power,gpu_power",
                "-f",
                "plist",
                "-i",
            ])
            .arg(interval_ms.to_string())
            .arg("-o")
            .arg(file)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("powermetrics: {e} (it needs macOS and root)"))?;
        Ok(PowerMetrics {
            child,
            file: file.to_path_buf(),
        })
    }

    /// Stop sampling and read the samples.
    pub fn stop(mut self) -> Result<Vec<EnergySample>, String> {
        // SIGINT lets powermetrics finish its current sample.
        // SAFETY: signalling our own child process.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
        let _ = self.child.wait();
        let bytes =
            std::fs::read(&self.file).map_err(|e| format!("{}: {e}", self.file.display()))?;
        powermetrics_samples(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> Vec<u8> {
        std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/mac")
                .join(name),
        )
        .unwrap()
    }

    #[test]
    fn reads_the_chip() {
        assert_eq!(
            chip_name(&data("system_profiler_hardware.xml")).unwrap(),
            "Apple M2 Pro (Mac14,10)"
        );
        assert!(
            chip_name(b"<plist version=\"1.0\"><array/></plist>")
                .unwrap_err()
                .contains("no SPHardwareDataType")
        );
        assert!(chip_name(b"garbage").is_err());
    }

    #[test]
    fn reads_energy_samples() {
        let s = powermetrics_samples(&data("powermetrics_samples.plist")).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].elapsed_ns, 200_412_000);
        assert_eq!((s[0].ane_mj, s[0].cpu_mj, s[0].gpu_mj), (14.0, 71.0, 3.0));
        // The third sample reports the GPU under `gpu`.
        assert_eq!(s[2].gpu_mj, 5.5);
        let total: f64 = s.iter().map(|x| x.ane_mj).sum();
        assert_eq!(total, 14.0 + 15.0 + 16.0);
        assert!(
            powermetrics_samples(b"<plist version=\"1.0\"><dict/></plist>")
                .unwrap_err()
                .contains("elapsed_ns")
        );
    }
}
