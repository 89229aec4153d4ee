//! What `ane-run bench` reads on a Mac: the chip (`system_profiler -xml
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

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plist::Value;

use crate::error::{Error, Result};

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
    /// Millijoules over the sample. The ANE's must be there; the CPU's and
    /// the GPU's are `None` when the sample does not give them (a sampler
    /// left out), never taken as 0.
    pub ane_mj: f64,
    pub cpu_mj: Option<f64>,
    pub gpu_mj: Option<f64>,
}

fn number(v: Option<&Value>) -> Option<f64> {
    let x = match v? {
        Value::Integer(i) => i
            .as_signed()
            .map(|x| x as f64)
            .or(i.as_unsigned().map(|x| x as f64))?,
        Value::Real(r) => *r,
        _ => return None,
    };
    x.is_finite().then_some(x)
}

/// One sample from one property list. A unit's energy is its mean power
/// `processor.X_power` (mW, a real number; macOS 13 and later) times the
/// sample's `elapsed_ns`, or else `processor.X_energy` (mJ, rounded to an
/// integer: coarse at short intervals; the only key on macOS 12). The GPU's
/// may also sit under `gpu` (`gpu.gpu_energy`).
fn sample(i: usize, chunk: &[u8]) -> Result<EnergySample, String> {
    let v = Value::from_reader(std::io::Cursor::new(chunk))
        .map_err(|e| format!("powermetrics sample {i}: not a property list: {e}"))?;
    let d = v
        .as_dictionary()
        .ok_or_else(|| format!("powermetrics sample {i}: expected a dictionary"))?;
    let elapsed_ns = number(d.get("elapsed_ns"))
        .filter(|&x| x > 0.0)
        .ok_or_else(|| format!("powermetrics sample {i}: no positive elapsed_ns"))?
        as u64;
    let seconds = elapsed_ns as f64 * 1e-9;
    let p = d.get("processor").and_then(Value::as_dictionary);
    let g = d.get("gpu").and_then(Value::as_dictionary);
    let from = |d: Option<&plist::Dictionary>, unit: &str| {
        let d = d?;
        number(d.get(&format!("{unit}_power")))
            .map(|mw| mw * seconds)
            .or_else(|| number(d.get(&format!("{unit}_energy"))))
    };
    Ok(EnergySample {
        elapsed_ns,
        ane_mj: from(p, "ane").ok_or_else(|| {
            format!(
                "powermetrics sample {i}: no processor.ane_energy or ane_power \
                 (it needs --samplers ane_power on Apple silicon)"
            )
        })?,
        cpu_mj: from(p, "cpu"),
        gpu_mj: from(p, "gpu").or_else(|| from(g, "gpu")),
    })
}

/// The samples of a `powermetrics -f plist` stream: one property list per
/// sample, with a NUL byte written before each sample after the first. A
/// chunk followed by a NUL is complete and must parse (the error names its
/// index). The last chunk may still be being written: until it ends with
/// `</plist>` it is left out (`incomplete_tail`); then it must parse too.
#[derive(Debug, Default, PartialEq)]
pub struct Stream {
    pub samples: Vec<EnergySample>,
    pub incomplete_tail: bool,
}

pub fn powermetrics_stream(bytes: &[u8]) -> Result<Stream, String> {
    let mut r = StreamReader::default();
    r.feed(bytes)?;
    let (samples, incomplete_tail) = r.visible();
    Ok(Stream {
        samples,
        incomplete_tail,
    })
}

/// Incremental parse of a growing stream: chunks followed by a NUL are
/// final; the last chunk is read again on the next feed.
#[derive(Default)]
struct StreamReader {
    /// Bytes consumed up to and including the last NUL seen.
    consumed: u64,
    done: Vec<EnergySample>,
    /// The last chunk, when it is a whole sample.
    tail: Option<EnergySample>,
    /// The last chunk is a sample still being written.
    incomplete: bool,
}

impl StreamReader {
    /// `bytes`: everything from `consumed` to the current end of the stream.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), String> {
        let mut rest = bytes;
        while let Some(nul) = rest.iter().position(|&b| b == 0) {
            let chunk = &rest[..nul];
            if !blank(chunk) {
                self.done.push(sample(self.done.len(), chunk)?);
            }
            self.consumed += nul as u64 + 1;
            rest = &rest[nul + 1..];
        }
        self.tail = None;
        self.incomplete = !blank(rest) && !rest.trim_ascii_end().ends_with(b"</plist>");
        if !blank(rest) && !self.incomplete {
            self.tail = Some(sample(self.done.len(), rest)?);
        }
        Ok(())
    }

    /// The complete samples, and whether a sample still being written was left out.
    fn visible(&self) -> (Vec<EnergySample>, bool) {
        let mut v = self.done.clone();
        v.extend(self.tail);
        (v, self.incomplete)
    }

    fn len(&self) -> usize {
        self.done.len() + usize::from(self.tail.is_some())
    }
}

fn blank(b: &[u8]) -> bool {
    b.iter().all(|b| b.is_ascii_whitespace())
}

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

/// The Mac's chip, from `system_profiler` (macOS only).
pub fn this_chip() -> Result<String, String> {
    let o = Command::new("system_profiler")
        .args(["-xml", "SPHardwareDataType"])
        .output()
        .map_err(|e| format!("system_profiler: {e}"))?;
    chip_name(&o.stdout)
}

/// `powermetrics` reads the energy counters only as root: say so before
/// anything runs.
pub fn require_root() -> Result<()> {
    #[cfg(unix)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::Invalid(
            "--energy needs root: powermetrics reads the energy counters only as root \
             (run `sudo ane-run bench --energy ...`)"
                .into(),
        ));
    }
    Ok(())
}

/// How often `ane-run bench --energy` has `powermetrics` sample, in ms.
pub const INTERVAL_MS: u32 = 100;

/// The samplers `ane-run bench --energy` asks `powermetrics` for, the
/// Neural Engine's own first. A version of `powermetrics` without one of
/// them refuses to start ("unrecognized sampler"): [`PowerMetrics::start`]
/// then drops it, as long as `cpu_power` remains, whose `processor`
/// dictionary also carries the ANE's energy on the versions without
/// `ane_power` (checked sample by sample: the parser needs it).
pub const SAMPLERS: [&str; 3] = ["ane_power", "cpu_power", "gpu_power"];

/// The sampler a `powermetrics` that refused to start named as unknown
/// (`powermetrics: unrecognized sampler: NAME`).
fn unrecognized_sampler(stderr: &str) -> Option<&str> {
    const SAYS: &str = "unrecognized sampler:";
    let at = stderr.to_ascii_lowercase().find(SAYS)? + SAYS.len();
    stderr[at..]
        .split(|c: char| c.is_whitespace() || c == ',')
        .find(|w| !w.is_empty())
}

/// `powermetrics` sampling ANE, CPU and GPU power into a temporary file
/// for as long as this value lives (macOS, root). Dropping it stops the
/// process, so an error part-way through a benchmark leaves none behind.
pub struct PowerMetrics {
    child: Option<Child>,
    program: PathBuf,
    samplers: Vec<String>,
    _dir: tempfile::TempDir,
    file: PathBuf,
    stderr: PathBuf,
    interval: Duration,
    reader: StreamReader,
}

impl PowerMetrics {
    /// Start `powermetrics --samplers ane_power,cpu_power,gpu_power -f plist
    /// -b 0` (unbuffered, so each sample is in the file when it ends) and
    /// wait for its first sample; see [`SAMPLERS`] for a `powermetrics`
    /// that lacks one of them.
    pub fn start(interval_ms: u32) -> Result<PowerMetrics> {
        PowerMetrics::start_program(
            Path::new("powermetrics"),
            interval_ms,
            Duration::from_secs(30),
        )
    }

    /// [`PowerMetrics::start`] with `program` in place of `powermetrics`
    /// (the tests use a stand-in). An error if it exits first, or writes
    /// no sample within `first_within`.
    pub fn start_program(
        program: &Path,
        interval_ms: u32,
        first_within: Duration,
    ) -> Result<PowerMetrics> {
        let mut samplers: Vec<String> = SAMPLERS.iter().map(|s| s.to_string()).collect();
        loop {
            let mut pm = PowerMetrics::spawn(program, interval_ms, &samplers)?;
            let Err(e) = pm.wait_for(1, first_within) else {
                return Ok(pm);
            };
            let printed = crate::exec::child::text_tail(&pm.stderr, 2000);
            match unrecognized_sampler(&printed) {
                Some(x) if x != "cpu_power" && samplers.iter().any(|s| s == x) => {
                    samplers.retain(|s| s != x);
                    eprintln!(
                        "warning: {} has no `{x}` sampler on this Mac; sampling {} instead",
                        program.display(),
                        samplers.join(",")
                    );
                }
                _ => return Err(e),
            }
        }
    }

    fn spawn(program: &Path, interval_ms: u32, samplers: &[String]) -> Result<PowerMetrics> {
        let dir = tempfile::tempdir()
            .map_err(|e| Error::Invalid(format!("a temporary directory for powermetrics: {e}")))?;
        let file = dir.path().join("samples.plist");
        let stderr = dir.path().join("stderr.txt");
        let err = std::fs::File::create(&stderr).map_err(|e| Error::io(&stderr, e))?;
        let child = Command::new(program)
            .arg("--samplers")
            .arg(samplers.join(","))
            .args(["-f", "plist", "-b", "0"])
            .arg("-i")
            .arg(interval_ms.max(1).to_string())
            .arg("-o")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| {
                Error::Invalid(format!(
                    "{}: {e} (energy needs macOS's powermetrics, run as root)",
                    program.display()
                ))
            })?;
        Ok(PowerMetrics {
            child: Some(child),
            program: program.to_path_buf(),
            samplers: samplers.to_vec(),
            _dir: dir,
            file,
            stderr,
            interval: Duration::from_millis(interval_ms.max(1) as u64),
            reader: StreamReader::default(),
        })
    }

    /// How long without a new sample counts as a sampler that stopped.
    fn stall(&self) -> Duration {
        (self.interval * 20).max(Duration::from_secs(2))
    }

    /// The samplers it runs with (see [`SAMPLERS`]).
    pub fn samplers(&self) -> &[String] {
        &self.samplers
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn stderr_text(&self) -> String {
        match crate::exec::child::text_tail(&self.stderr, 2000) {
            s if s.is_empty() => "it printed nothing".into(),
            s => format!("it printed: {s}"),
        }
    }

    /// An error naming the exit status and what the process printed, if it
    /// has exited.
    fn check_alive(&mut self) -> Result<()> {
        let Some(c) = self.child.as_mut() else {
            return Err(Error::Invalid(format!(
                "{} was stopped",
                self.program.display()
            )));
        };
        match c.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                self.child = None;
                let when = if self.len() == 0 {
                    "before its first sample"
                } else {
                    "during the measurement"
                };
                Err(Error::Invalid(format!(
                    "{} exited ({status}) {when}; {}",
                    self.program.display(),
                    self.stderr_text()
                )))
            }
            Err(e) => Err(Error::Invalid(format!("{}: {e}", self.program.display()))),
        }
    }

    /// Read what was appended since the last call; the number of complete
    /// samples so far.
    pub fn poll(&mut self) -> Result<usize> {
        let mut f = match std::fs::File::open(&self.file) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(self.len()),
            Err(e) => return Err(Error::io(&self.file, e)),
        };
        let mut buf = Vec::new();
        f.seek(SeekFrom::Start(self.reader.consumed))
            .and_then(|_| f.read_to_end(&mut buf))
            .map_err(|e| Error::io(&self.file, e))?;
        self.reader
            .feed(&buf)
            .map_err(|m| Error::Invalid(format!("{}: {m}", self.file.display())))?;
        Ok(self.len())
    }

    fn len(&self) -> usize {
        self.reader.len()
    }

    /// The complete samples read so far.
    pub fn samples(&self) -> Vec<EnergySample> {
        self.reader.visible().0
    }

    /// Wait until at least `n` samples are complete and return them all; an
    /// error if the process exits or `timeout` passes first.
    pub fn wait_for(&mut self, n: usize, timeout: Duration) -> Result<Vec<EnergySample>> {
        let t0 = Instant::now();
        loop {
            if self.poll()? >= n {
                return Ok(self.samples());
            }
            self.check_alive()?;
            if t0.elapsed() > timeout {
                return Err(Error::Invalid(format!(
                    "{} wrote {} of {n} samples in {:.1} s; {}",
                    self.program.display(),
                    self.len(),
                    timeout.as_secs_f64(),
                    self.stderr_text()
                )));
            }
            std::thread::sleep(self.interval / 4);
        }
    }

    /// Run `work` back to back until it has run at least `min_images` times
    /// and at least `min_samples` samples lie wholly inside the loop, then
    /// report the energy per image against the `idle` baseline. An error if
    /// the process exits or writes nothing for 20 intervals (at least 2 s).
    pub fn measure(
        &mut self,
        idle: Power,
        min_images: usize,
        min_samples: usize,
        mut work: impl FnMut() -> Result<()>,
    ) -> Result<EnergyPerImage> {
        let n0 = self.poll()?;
        // Sample n0 is the first to end inside the loop: it began before it.
        // So may sample n0 + 1, if n0 had ended but was not yet in the file
        // at the poll above: both are left out.
        let first = n0 + 2;
        let need = first.saturating_add(min_samples.max(1));
        let stall = self.stall();
        let t0 = Instant::now();
        let (mut images, mut seen, mut last_poll, mut last_new) = (0usize, n0, t0, t0);
        loop {
            work()?;
            images += 1;
            let now = Instant::now();
            if images < min_images || now - last_poll < self.interval / 2 {
                continue;
            }
            last_poll = now;
            let n = self.poll()?;
            if n >= need {
                // Every sample before n ended before `now`.
                let busy = mean_power(&self.samples()[first..n])
                    .ok_or_else(|| Error::Invalid("powermetrics samples of zero length".into()))?;
                return Ok(energy_per_image(
                    busy,
                    idle,
                    images,
                    (now - t0).as_secs_f64(),
                ));
            }
            self.check_alive()?;
            if n > seen {
                (seen, last_new) = (n, now);
            } else if now - last_new > stall {
                return Err(Error::Invalid(format!(
                    "{} wrote no sample in {:.1} s ({} of {need} so far); {}",
                    self.program.display(),
                    (now - last_new).as_secs_f64(),
                    n,
                    self.stderr_text()
                )));
            }
        }
    }

    /// Stop sampling and read every sample written.
    pub fn stop(mut self) -> Result<Stream> {
        if let Some(mut c) = self.child.take() {
            interrupt(&mut c);
        }
        self.poll()?;
        let (samples, incomplete_tail) = self.reader.visible();
        Ok(Stream {
            samples,
            incomplete_tail,
        })
    }
}

impl Drop for PowerMetrics {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            interrupt(&mut c);
        }
    }
}

/// SIGINT (powermetrics then finishes its sample and exits), and a kill if
/// it is still running 5 s later.
fn interrupt(c: &mut Child) {
    #[cfg(unix)]
    // SAFETY: signalling our own child process, which has not been reaped.
    unsafe {
        libc::kill(c.id() as i32, libc::SIGINT);
    }
    crate::exec::child::wait_or_kill(c, Duration::from_secs(5));
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

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    /// A figure that is there and close to `b`.
    fn has(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| close(a, b))
    }

    /// The recordings `make mac-check` makes on a Mac (tests/mac-check.sh
    /// runs this test after recording; it fails where they are absent).
    #[test]
    #[ignore = "needs the recordings of `make mac-check`, made on a Mac"]
    fn reads_recordings_from_a_mac() {
        let chip = chip_name(&data("recorded/system_profiler_hardware.xml")).unwrap();
        assert!(chip.starts_with("Apple M"), "{chip}");
        let st = powermetrics_stream(&data("recorded/powermetrics_samples.plist")).unwrap();
        assert_eq!(st.samples.len(), 5, "powermetrics -n 5");
        for s in &st.samples {
            assert!(s.elapsed_ns > 50_000_000 && s.ane_mj.is_finite() && s.ane_mj >= 0.0);
        }
        assert!(mean_power(&st.samples).unwrap().samples == 5);
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
        let st = powermetrics_stream(&data("powermetrics_samples.plist")).unwrap();
        assert!(!st.incomplete_tail);
        let s = st.samples;
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].elapsed_ns, 102_345_000);
        // Mean power (mW) times the sample's length.
        let t = 0.102_345;
        assert!(close(s[0].ane_mj, 136.8 * t) && has(s[0].cpu_mj, 693.6 * t));
        assert!(has(s[0].gpu_mj, 29.3 * t));
        assert!(close(s[2].ane_mj, 152.2 * 0.101_002));
        let p = mean_power(&s).unwrap();
        let mw = (136.8 * 0.102_345 + 148.7 * 0.100_871 + 152.2 * 0.101_002) / 0.304_218;
        assert!(close(p.ane_mw, mw) && p.samples == 3);
        assert!(
            powermetrics_stream(b"<plist version=\"1.0\"><dict/></plist>\0")
                .unwrap_err()
                .contains("elapsed_ns")
        );
    }

    fn doc(elapsed_ns: u64, processor: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<plist version=\"1.0\">\n<dict>\n\
             <key>elapsed_ns</key><integer>{elapsed_ns}</integer>\n\
             <key>processor</key><dict>{processor}</dict>\n</dict>\n</plist>\n"
        )
    }

    #[test]
    fn power_only_samples_are_power_times_time() {
        // 250 ms at 40 mW (ANE) and 1200 mW (CPU): 10 mJ and 300 mJ.
        let d = doc(
            250_000_000,
            "<key>ane_power</key><real>40</real><key>cpu_power</key><real>1200</real>",
        );
        let s = powermetrics_stream(d.as_bytes()).unwrap().samples;
        assert!(close(s[0].ane_mj, 10.0) && has(s[0].cpu_mj, 300.0));
        // A unit the sample does not give is unknown, not 0.
        assert_eq!(s[0].gpu_mj, None);
        let p = mean_power(&s).unwrap();
        assert!(has(p.cpu_mw, 1200.0) && p.gpu_mw.is_none());
        // The power key (exact) wins over the energy key (rounded to mJ).
        let d = doc(
            250_000_000,
            "<key>ane_energy</key><integer>7</integer><key>ane_power</key><real>27.6</real>",
        );
        assert!(close(
            powermetrics_stream(d.as_bytes()).unwrap().samples[0].ane_mj,
            6.9
        ));
        // macOS 12: energies only.
        let d = doc(
            250_000_000,
            "<key>ane_energy</key><integer>7</integer><key>gpu_energy</key><integer>2</integer>\
             <key>dram_energy</key><integer>9</integer><key>package_energy</key><integer>90</integer>",
        );
        let s = powermetrics_stream(d.as_bytes()).unwrap().samples;
        assert_eq!((s[0].ane_mj, s[0].gpu_mj), (7.0, Some(2.0)));
        // The GPU only under `gpu`.
        let d = doc(100_000_000, "<key>ane_energy</key><integer>1</integer>").replace(
            "</dict>\n</dict>",
            "</dict><key>gpu</key><dict><key>gpu_energy</key><integer>4</integer></dict>\n</dict>",
        );
        assert_eq!(
            powermetrics_stream(d.as_bytes()).unwrap().samples[0].gpu_mj,
            Some(4.0)
        );
        // Neither: an error that says which sampler to run.
        let d = doc(250_000_000, "<key>cpu_energy</key><integer>7</integer>");
        assert!(
            powermetrics_stream(d.as_bytes())
                .unwrap_err()
                .contains("ane_power")
        );
    }

    #[test]
    fn a_sample_still_being_written_is_left_out() {
        let one = doc(100_000_000, "<key>ane_energy</key><integer>3</integer>");
        let two = doc(100_000_000, "<key>ane_energy</key><integer>4</integer>");
        // As powermetrics writes them: a NUL before each sample after the first.
        let whole = format!("{one}\0{two}");
        let st = powermetrics_stream(whole.as_bytes()).unwrap();
        assert_eq!((st.samples.len(), st.incomplete_tail), (2, false));
        // The second sample cut anywhere before its `</plist>`: one sample
        // and an incomplete tail.
        for cut in (one.len() + 1..whole.trim_end().len()).step_by(7) {
            let st = powermetrics_stream(&whole.as_bytes()[..cut]).unwrap();
            assert_eq!(
                (st.samples.len(), st.incomplete_tail),
                (1, cut > one.len() + 1),
                "{cut}"
            );
        }
        // A NUL after the last sample changes nothing.
        assert_eq!(
            powermetrics_stream(format!("{whole}\0").as_bytes())
                .unwrap()
                .samples
                .len(),
            2
        );
        // A damaged sample followed by a NUL is an error, named by index.
        let bad = format!("{one}\0{}\0{two}", &two[..40]);
        assert!(
            powermetrics_stream(bad.as_bytes())
                .unwrap_err()
                .contains("sample 1")
        );
    }

    #[test]
    fn reading_a_growing_stream_in_pieces_gives_the_same_samples() {
        let whole = (0..4)
            .map(|i| {
                doc(
                    100_000_000 + i,
                    &format!("<key>ane_energy</key><integer>{i}</integer>"),
                )
            })
            .collect::<Vec<_>>()
            .join("\0");
        let bytes = whole.as_bytes();
        let all = powermetrics_stream(bytes).unwrap().samples;
        assert_eq!(all.len(), 4);
        for step in [1, 7, 64, 333] {
            let mut r = StreamReader::default();
            let mut end = 0;
            while end < bytes.len() {
                end = (end + step).min(bytes.len());
                r.feed(&bytes[r.consumed as usize..end]).unwrap();
                let (seen, _) = r.visible();
                assert_eq!(seen[..], all[..seen.len()], "step {step}, end {end}");
            }
            assert_eq!(r.visible(), (all.clone(), false));
        }
    }

    #[test]
    fn energy_per_image_is_busy_power_times_time() {
        let p = |ane, cpu, gpu| Power {
            ane_mw: ane,
            cpu_mw: Some(cpu),
            gpu_mw: gpu,
            seconds: 1.0,
            samples: 10,
        };
        let e = energy_per_image(
            p(500.0, 900.0, Some(30.0)),
            p(20.0, 400.0, Some(10.0)),
            40,
            2.0,
        );
        assert_eq!(e.seconds_per_image, 0.05);
        assert!(close(e.total.ane_mj, 25.0) && has(e.total.cpu_mj, 45.0));
        assert!(close(e.above_idle.ane_mj, 24.0) && has(e.above_idle.gpu_mj, 1.0));
        // No GPU figure while busy or while idle: none per image.
        let e = energy_per_image(p(500.0, 900.0, None), p(20.0, 400.0, Some(10.0)), 40, 2.0);
        assert_eq!((e.total.gpu_mj, e.above_idle.gpu_mj), (None, None));
        let m = mean_power(&[
            EnergySample {
                elapsed_ns: 100_000_000,
                ane_mj: 4.0,
                cpu_mj: Some(0.0),
                gpu_mj: Some(1.0),
            },
            EnergySample {
                elapsed_ns: 300_000_000,
                ane_mj: 8.0,
                cpu_mj: None,
                gpu_mj: Some(1.0),
            },
        ])
        .unwrap();
        assert!(close(m.ane_mw, 30.0) && has(m.gpu_mw, 5.0) && close(m.seconds, 0.4));
        // One sample without the CPU's figure: no CPU mean.
        assert_eq!(m.cpu_mw, None);
        assert_eq!(mean_power(&[]), None);
    }

    /// A stand-in for `powermetrics` taking its arguments: every 50 ms a
    /// sample of 50 ms, written in two halves after a NUL (none before the
    /// first), as powermetrics does; ANE 5 mJ for a sample that began when
    /// the file `busy` beside the script existed, 1 mJ otherwise; the CPU
    /// as 200 mW (power only); the GPU 1 mJ under `gpu`, whose dictionary
    /// repeats a key as recorded output does. SIGINT ends it.
    #[cfg(unix)]
    fn stand_in(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("powermetrics");
        std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// The wait for a stand-in's first sample: ample on a loaded machine.
    #[cfg(unix)]
    const FIRST: Duration = Duration::from_secs(20);

    #[cfg(unix)]
    const SAMPLER: &str = r#"
while [ $# -gt 0 ]; do
  case "$1" in -o) out=$2; shift ;; esac
  shift
done
trap 'exit 0' INT
busy="$(dirname "$0")/busy"
n=0
: > "$out"
while :; do
  if [ -e "$busy" ]; then ane=5; else ane=1; fi
  sleep 0.04
  if [ $n -gt 0 ]; then printf '\000' >> "$out"; fi
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<plist version="1.0">\n<dict>\n<key>elapsed_ns</key><integer>50000000</integer>\n<key>processor</key>\n<dict>\n<key>ane_energy</key><integer>%s</integer>\n' "$ane" >> "$out"
  sleep 0.01
  printf '<key>cpu_power</key><real>200.0</real>\n</dict>\n<key>gpu</key><dict><key>idle_ratio</key><real>0.9</real><key>idle_ratio</key><real>0.9</real><key>gpu_energy</key><integer>1</integer></dict>\n</dict>\n</plist>\n' >> "$out"
  n=$((n+1))
done
"#;

    #[cfg(unix)]
    #[test]
    fn measures_a_running_sampler() {
        let dir = tempfile::tempdir().unwrap();
        let mut pm =
            PowerMetrics::start_program(&stand_in(dir.path(), SAMPLER), 50, FIRST).unwrap();
        let s = pm.wait_for(3, Duration::from_secs(20)).unwrap();
        let idle = mean_power(&s[..3]).unwrap();
        assert!(close(idle.ane_mw, 20.0) && has(idle.cpu_mw, 200.0) && has(idle.gpu_mw, 20.0));
        // Busy from here: the sample in progress began idle, so counting it
        // (or any sample that began before the loop) would lower the power.
        std::fs::write(dir.path().join("busy"), "").unwrap();
        let mut calls = 0;
        let e = pm
            .measure(idle, 4, 5, || {
                calls += 1;
                std::thread::sleep(Duration::from_millis(15));
                Ok(())
            })
            .unwrap();
        assert_eq!(e.images, calls);
        assert!(calls >= 4 && e.busy.samples >= 5);
        assert!(e.seconds_per_image >= 0.015);
        assert!(close(e.busy.ane_mw, 100.0) && has(e.busy.cpu_mw, 200.0));
        let t = e.seconds_per_image;
        assert!(close(e.total.ane_mj, 100.0 * t) && close(e.above_idle.ane_mj, 80.0 * t));
        assert!(has(e.above_idle.cpu_mj, 0.0) && has(e.above_idle.gpu_mj, 0.0));
        // An error from the work ends the measurement with that error.
        let err = pm
            .measure(idle, 1, 5, || Err(Error::Invalid("predict failed".into())))
            .unwrap_err();
        assert!(err.to_string().contains("predict failed"));
        let pid = pm.pid().unwrap();
        let st = pm.stop().unwrap();
        assert!(st.samples.len() >= 3 + 2 + 5);
        // SAFETY: signal 0 only asks whether the process exists.
        assert_eq!(
            unsafe { libc::kill(pid as i32, 0) },
            -1,
            "the sampler was stopped"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_sampler_that_fails_is_named_with_what_it_printed() {
        let dir = tempfile::tempdir().unwrap();
        let p = stand_in(
            dir.path(),
            "echo 'powermetrics must be invoked as the superuser' >&2\nexit 1\n",
        );
        let e = PowerMetrics::start_program(&p, 50, FIRST)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("exited")
                && e.contains("before its first sample")
                && e.contains("superuser"),
            "{e}"
        );
        let e = PowerMetrics::start_program(&dir.path().join("absent"), 50, FIRST)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("absent") && e.contains("powermetrics"), "{e}");
    }

    #[test]
    fn reads_the_sampler_named_unknown() {
        for (says, name) in [
            (
                "powermetrics: unrecognized sampler: ane_power\n",
                Some("ane_power"),
            ),
            (
                "Unrecognized sampler: gpu_power, exiting",
                Some("gpu_power"),
            ),
            ("powermetrics: unrecognized sampler:", None),
            ("powermetrics must be invoked as the superuser", None),
        ] {
            assert_eq!(unrecognized_sampler(says), name, "{says}");
        }
    }

    /// Refuses to start with the ane_power sampler, as a powermetrics that
    /// lacks it does, and keeps its arguments in `args`.
    #[cfg(unix)]
    const NO_ANE_SAMPLER: &str = r#"
echo "$@" > "$(dirname "$0")/args"
case ",$2," in *,ane_power,*)
  echo 'powermetrics: unrecognized sampler: ane_power' >&2; exit 64 ;;
esac
"#;

    #[cfg(unix)]
    #[test]
    fn a_sampler_this_powermetrics_lacks_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = stand_in(dir.path(), &format!("{NO_ANE_SAMPLER}{SAMPLER}"));
        let mut pm = PowerMetrics::start_program(&p, 50, FIRST).unwrap();
        assert_eq!(pm.samplers(), ["cpu_power", "gpu_power"]);
        let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
        assert!(
            args.starts_with("--samplers cpu_power,gpu_power -f plist"),
            "{args}"
        );
        // The ANE's energy comes from cpu_power's processor dictionary.
        let s = pm.wait_for(2, Duration::from_secs(20)).unwrap();
        assert!(close(mean_power(&s).unwrap().ane_mw, 20.0));
        drop(pm);
        // cpu_power itself is never dropped: the error is the refusal.
        let q = stand_in(
            dir.path(),
            "echo 'powermetrics: unrecognized sampler: cpu_power' >&2\nexit 64\n",
        );
        let e = PowerMetrics::start_program(&q, 50, FIRST)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("exited") && e.contains("sampler: cpu_power"),
            "{e}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_silent_sampler_does_not_hang_the_benchmark_and_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        // Silent from the start: an error at start, and no process left.
        let p = stand_in(
            dir.path(),
            "echo $$ > \"$(dirname \"$0\")/pid\"\ntrap 'exit 0' INT\nwhile :; do sleep 0.05; done\n",
        );
        let e = PowerMetrics::start_program(&p, 50, Duration::from_secs(2))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("wrote 0 of 1 samples"), "{e}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: signal 0 only asks whether the process exists.
        assert_eq!(unsafe { libc::kill(pid, 0) }, -1, "stopped at start");
        // Silent after its first sample: an error while measuring.
        let p = stand_in(
            dir.path(),
            r#"
while [ $# -gt 0 ]; do
  case "$1" in -o) out=$2; shift ;; esac
  shift
done
trap 'exit 0' INT
printf '<?xml version="1.0"?><plist version="1.0"><dict><key>elapsed_ns</key><integer>50000000</integer><key>processor</key><dict><key>ane_energy</key><integer>1</integer></dict></dict></plist>\n' > "$out"
while :; do sleep 0.05; done
"#,
        );
        let mut pm = PowerMetrics::start_program(&p, 50, FIRST).unwrap();
        let idle = Power {
            ane_mw: 0.0,
            cpu_mw: None,
            gpu_mw: None,
            seconds: 1.0,
            samples: 1,
        };
        let e = pm
            .measure(idle, 1, 1, || {
                std::thread::sleep(Duration::from_millis(5));
                Ok(())
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("wrote no sample"), "{e}");
        let pid = pm.pid().unwrap();
        drop(pm);
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::kill(pid as i32, 0) },
            -1,
            "dropping stopped the sampler"
        );
    }
}
