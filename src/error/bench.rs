//! Why `ane-run bench` could not read the Mac's tools: their property
//! lists ([`PlistError`], `bench::plist` raises it) and `powermetrics` or
//! `system_profiler` as processes ([`BenchError`], `bench::powermetrics`).

use std::path::PathBuf;
use std::process::ExitStatus;

/// Why a property list of `system_profiler` or `powermetrics` cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlistError {
    /// `system_profiler`'s output is not a property list (the parser's message).
    #[error("system_profiler output is not a property list: {0}")]
    HardwareNotPlist(String),
    #[error("system_profiler output has no SPHardwareDataType item")]
    NoHardware,
    #[error("SPHardwareDataType has neither chip_type nor cpu_type")]
    NoChip,
    /// Sample `index` of the stream is not a property list (the parser's message).
    #[error("powermetrics sample {index}: not a property list: {error}")]
    SampleNotPlist { index: usize, error: String },
    #[error("powermetrics sample {0}: expected a dictionary")]
    SampleNotDictionary(usize),
    #[error("powermetrics sample {0}: no positive elapsed_ns")]
    NoElapsed(usize),
    /// A sample without the Neural Engine's energy.
    #[error(
        "powermetrics sample {0}: no processor.ane_energy or ane_power (it needs --samplers ane_power on Apple silicon)"
    )]
    NoAneEnergy(usize),
}

/// What a process printed on stderr, as an error says it.
fn printed(stderr: &str) -> String {
    if stderr.is_empty() {
        "it printed nothing".into()
    } else {
        format!("it printed: {stderr}")
    }
}

/// Why `powermetrics` (or `system_profiler`) could not be run or read.
/// `stderr` is the end of what the process printed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// `system_profiler` could not be run.
    #[error("system_profiler: {0}")]
    SystemProfiler(std::io::Error),
    /// What `system_profiler` or `powermetrics` wrote cannot be read.
    #[error(transparent)]
    Plist(#[from] PlistError),
    /// The energy counters need root.
    #[error(
        "--energy needs root: powermetrics reads the energy counters only as root \
             (run `sudo ane-run bench --energy ...`)"
    )]
    NeedsRoot,
    /// No temporary directory for the samples.
    #[error("a temporary directory for powermetrics: {0}")]
    TempDir(std::io::Error),
    /// The program could not be started.
    #[error("{}: {error} (energy needs macOS's powermetrics, run as root)", program.display())]
    Spawn {
        program: PathBuf,
        error: std::io::Error,
    },
    /// The program was already stopped.
    #[error("{} was stopped", .0.display())]
    Stopped(PathBuf),
    /// The program exited, before its first sample or during the measurement.
    #[error("{} exited ({status}) {}; {}", program.display(),
        if *before_first { "before its first sample" } else { "during the measurement" },
        printed(stderr))]
    Exited {
        program: PathBuf,
        status: ExitStatus,
        before_first: bool,
        stderr: String,
    },
    /// Its status could not be read.
    #[error("{}: {error}", program.display())]
    Wait {
        program: PathBuf,
        error: std::io::Error,
    },
    /// Its samples file holds what is not a sample.
    #[error("{}: {error}", file.display())]
    Samples { file: PathBuf, error: PlistError },
    /// Fewer samples than waited for within the time allowed.
    #[error("{} wrote {got} of {want} samples in {:.1} s; {}", program.display(), seconds, printed(stderr))]
    TooFewSamples {
        program: PathBuf,
        got: usize,
        want: usize,
        seconds: f64,
        stderr: String,
    },
    /// No new sample for a while during a measurement.
    #[error("{} wrote no sample in {:.1} s ({got} of {need} so far); {}", program.display(), seconds, printed(stderr))]
    Stalled {
        program: PathBuf,
        seconds: f64,
        got: usize,
        need: usize,
        stderr: String,
    },
    /// The samples inside the measurement last no time.
    #[error("powermetrics samples of zero length")]
    ZeroLength,
}
