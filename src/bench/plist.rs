//! Parsers of the property lists `ane-run bench` reads on a Mac: the chip
//! from `system_profiler -xml SPHardwareDataType`, and energy samples from
//! `powermetrics -f plist`, also a stream still being written. Pure
//! functions of bytes: they run anywhere.

use plist::Value;

pub use crate::error::PlistError;

/// The chip (or CPU) and model named by `system_profiler -xml SPHardwareDataType`.
pub fn chip_name(xml: &[u8]) -> Result<String, PlistError> {
    let v = Value::from_reader(std::io::Cursor::new(xml))
        .map_err(|e| PlistError::HardwareNotPlist(e.to_string()))?;
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
        .ok_or(PlistError::NoHardware)?;
    let s = |k: &str| items.get(k).and_then(Value::as_string);
    let chip = s("chip_type")
        .or_else(|| s("cpu_type"))
        .ok_or(PlistError::NoChip)?;
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
fn sample(i: usize, chunk: &[u8]) -> Result<EnergySample, PlistError> {
    let v = Value::from_reader(std::io::Cursor::new(chunk)).map_err(|e| {
        PlistError::SampleNotPlist {
            index: i,
            error: e.to_string(),
        }
    })?;
    let d = v
        .as_dictionary()
        .ok_or(PlistError::SampleNotDictionary(i))?;
    let elapsed_ns = number(d.get("elapsed_ns"))
        .filter(|&x| x > 0.0)
        .ok_or(PlistError::NoElapsed(i))? as u64;
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
        ane_mj: from(p, "ane").ok_or(PlistError::NoAneEnergy(i))?,
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

pub fn powermetrics_stream(bytes: &[u8]) -> Result<Stream, PlistError> {
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
pub(crate) struct StreamReader {
    /// Bytes consumed up to and including the last NUL seen.
    pub(crate) consumed: u64,
    done: Vec<EnergySample>,
    /// The last chunk, when it is a whole sample.
    tail: Option<EnergySample>,
    /// The last chunk is a sample still being written.
    incomplete: bool,
}

impl StreamReader {
    /// `bytes`: everything from `consumed` to the current end of the stream.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<(), PlistError> {
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
    pub(crate) fn visible(&self) -> (Vec<EnergySample>, bool) {
        let mut v = self.done.clone();
        v.extend(self.tail);
        (v, self.incomplete)
    }

    pub(crate) fn len(&self) -> usize {
        self.done.len() + usize::from(self.tail.is_some())
    }
}

fn blank(b: &[u8]) -> bool {
    b.iter().all(|b| b.is_ascii_whitespace())
}
