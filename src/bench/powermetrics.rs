//! Running the Mac's tools for `ane-run bench` (macOS; root for
//! `powermetrics`): the chip's name, and [`PowerMetrics`], which samples
//! for as long as it lives and stops its process when dropped.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::energy::{EnergyPerImage, Power, energy_per_image, mean_power};
use super::plist::{EnergySample, Stream, StreamReader, chip_name};
pub use crate::error::BenchError;
use crate::error::{Error, Result};

/// The Mac's chip, from `system_profiler` (macOS only).
pub fn this_chip() -> Result<String, BenchError> {
    let o = Command::new("system_profiler")
        .args(["-xml", "SPHardwareDataType"])
        .output()
        .map_err(BenchError::SystemProfiler)?;
    Ok(chip_name(&o.stdout)?)
}

/// `powermetrics` reads the energy counters only as root: say so before
/// anything runs.
pub fn require_root() -> Result<()> {
    #[cfg(unix)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(BenchError::NeedsRoot.into());
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
pub(super) fn unrecognized_sampler(stderr: &str) -> Option<&str> {
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
    /// What the caller should tell the user: a sampler this Mac lacks,
    /// dropped (the library does not print).
    pub warnings: Vec<String>,
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
        let mut warnings = Vec::new();
        loop {
            let mut pm = PowerMetrics::spawn(program, interval_ms, &samplers)?;
            let Err(e) = pm.wait_for(1, first_within) else {
                pm.warnings = warnings;
                return Ok(pm);
            };
            let printed = crate::exec::child::text_tail(&pm.stderr, 2000);
            match unrecognized_sampler(&printed) {
                Some(x) if x != "cpu_power" && samplers.iter().any(|s| s == x) => {
                    samplers.retain(|s| s != x);
                    warnings.push(format!(
                        "warning: {} has no `{x}` sampler on this Mac; sampling {} instead",
                        program.display(),
                        samplers.join(",")
                    ));
                }
                _ => return Err(e),
            }
        }
    }

    fn spawn(program: &Path, interval_ms: u32, samplers: &[String]) -> Result<PowerMetrics> {
        let dir = tempfile::tempdir().map_err(BenchError::TempDir)?;
        let file = dir.path().join("samples.plist");
        let stderr = dir.path().join("stderr.txt");
        let err = std::fs::File::create(&stderr).map_err(|e| Error::io(&stderr, e))?;
        let mut command = Command::new(program);
        command
            .arg("--samplers")
            .arg(samplers.join(","))
            .args(["-f", "plist", "-b", "0"])
            .arg("-i")
            .arg(interval_ms.max(1).to_string())
            .arg("-o")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err);
        let child = spawn_unless_busy(&mut command).map_err(|error| BenchError::Spawn {
            program: program.to_path_buf(),
            error,
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
            warnings: Vec::new(),
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

    /// The end of what the process printed on stderr.
    fn stderr_text(&self) -> String {
        crate::exec::child::text_tail(&self.stderr, 2000)
    }

    /// An error naming the exit status and what the process printed, if it
    /// has exited.
    fn check_alive(&mut self) -> Result<()> {
        let program = self.program.clone();
        let Some(c) = self.child.as_mut() else {
            return Err(BenchError::Stopped(program).into());
        };
        match c.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                self.child = None;
                Err(BenchError::Exited {
                    program,
                    status,
                    before_first: self.len() == 0,
                    stderr: self.stderr_text(),
                }
                .into())
            }
            Err(error) => Err(BenchError::Wait { program, error }.into()),
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
            .map_err(|error| BenchError::Samples {
                file: self.file.clone(),
                error,
            })?;
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
                return Err(BenchError::TooFewSamples {
                    program: self.program.clone(),
                    got: self.len(),
                    want: n,
                    seconds: timeout.as_secs_f64(),
                    stderr: self.stderr_text(),
                }
                .into());
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
                let busy = mean_power(&self.samples()[first..n]).ok_or(BenchError::ZeroLength)?;
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
                return Err(BenchError::Stalled {
                    program: self.program.clone(),
                    seconds: (now - last_new).as_secs_f64(),
                    got: n,
                    need,
                    stderr: self.stderr_text(),
                }
                .into());
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

/// `command` spawned; while its program's file is busy (ETXTBSY), again
/// after a moment, for up to a second. A program file just written (a
/// stand-in for powermetrics in the tests, or any script) can still be open
/// for writing in a child that another thread forked and that has not yet
/// run its own program.
fn spawn_unless_busy(command: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            spawned => return spawned,
        }
    }
}
