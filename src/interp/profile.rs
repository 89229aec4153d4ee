//! The profile of a run (`Settings::profile`): seconds per op kind, the
//! bytes its values held at most, and malloc's heap. The run returns it as
//! data ([`Profile`]); its `Display` gives the lines the CLI prints.

use std::collections::BTreeMap;
use std::time::Instant;

use candle_core::Tensor;

use super::{Map, Set, V};
use crate::mlpackage::Function;

/// What a profiled run measured.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Per op kind, and per part of the run between ops (setup, attention
    /// chains, fp16 rounding and checks, between ops): (name, count,
    /// seconds), the most seconds first.
    pub kinds: Vec<(String, usize, f64)>,
    /// The most bytes the run's inputs, intermediates, unpacked and
    /// captured values held at once after an op (each storage counted once;
    /// the program's constants excluded).
    pub peak_live: usize,
    /// The bytes of the constants the package has decoded so far.
    pub decoded_constants: usize,
    /// glibc malloc's heap, where it can be read.
    pub heap: Option<Heap>,
}

/// glibc malloc's bytes (in use, and the heap's size) over a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Heap {
    /// In use as the run started.
    pub at_start: usize,
    /// The most in use between ops.
    pub peak_between_ops: usize,
    /// In use as the run ended.
    pub at_end: usize,
    /// The heap's size as the run ended: the most it held at once,
    /// transients within ops included, as freed memory is kept.
    pub size: usize,
}

impl std::fmt::Display for Profile {
    /// One line per measure, each starting `profile: `.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mb = |b: usize| b as f64 / 1048576.0;
        writeln!(
            f,
            "profile: live values at most {:.1} MB (inputs, intermediates, unpacked and captured values; the program's constants excluded); decoded constants {:.1} MB",
            mb(self.peak_live),
            mb(self.decoded_constants)
        )?;
        if let Some(h) = &self.heap {
            writeln!(
                f,
                "profile: malloc's heap: {:.1} MB in use as the run started, at most {:.1} MB between ops, {:.1} MB now, {:.1} MB its size (the most it held at once, transients within ops included, as freed memory is kept)",
                mb(h.at_start),
                mb(h.peak_between_ops),
                mb(h.at_end),
                mb(h.size)
            )?;
        }
        for (k, n, s) in &self.kinds {
            writeln!(f, "profile: {k:<32} {n:>6} ops {s:>9.3} s")?;
        }
        Ok(())
    }
}

/// A profile being taken, op by op.
pub(super) struct Profiler<'f> {
    kinds: BTreeMap<String, (usize, f64)>,
    /// The program's constants, whose bytes the live count leaves out.
    constants: Set<&'f str>,
    peak_live: usize,
    peak_heap_used: usize,
    heap_at_start: usize,
    t_loop: Instant,
}

impl<'f> Profiler<'f> {
    /// Start the profile of a run of `func` whose setup started at `t_setup`.
    pub(super) fn new(func: &'f Function, t_setup: Instant) -> Self {
        let constants = func
            .ops
            .iter()
            .filter(|o| o.kind == "const" || o.kind.starts_with("constexpr_"))
            .flat_map(|o| o.outputs.iter().map(|d| d.name.as_str()))
            .collect();
        let mut kinds = BTreeMap::new();
        kinds.insert(
            "(setup: inputs, schedule)".into(),
            (1, t_setup.elapsed().as_secs_f64()),
        );
        Profiler {
            kinds,
            constants,
            peak_live: 0,
            peak_heap_used: 0,
            t_loop: Instant::now(),
            heap_at_start: heap_bytes().map_or(0, |h| h.0),
        }
    }

    /// Count the seconds since `since` once more under `kind`.
    pub(super) fn add(&mut self, kind: String, since: Instant) {
        let e = self.kinds.entry(kind).or_default();
        e.0 += 1;
        e.1 += since.elapsed().as_secs_f64();
    }

    /// After an op: the bytes the run's values hold, and malloc's.
    pub(super) fn after_op<'t>(
        &mut self,
        env: &Map<String, V>,
        others: impl Iterator<Item = &'t Tensor>,
    ) {
        let live = live_bytes(env.iter().filter_map(|(n, v)| match v {
            V::T(t) if !self.constants.contains(n.as_str()) => Some(t),
            _ => None,
        }))
        .saturating_add(live_bytes(others));
        self.peak_live = self.peak_live.max(live);
        if let Some((used, _)) = heap_bytes() {
            self.peak_heap_used = self.peak_heap_used.max(used);
        }
    }

    /// The profile, once the last op has run; `decoded_constants` is the
    /// package's count.
    pub(super) fn finish(mut self, decoded_constants: usize) -> Profile {
        let heap = heap_bytes().map(|(used, size)| Heap {
            at_start: self.heap_at_start,
            peak_between_ops: self.peak_heap_used,
            at_end: used,
            size,
        });
        let in_ops: f64 = self
            .kinds
            .iter()
            .filter(|(k, _)| !k.starts_with("(setup"))
            .map(|(_, v)| v.1)
            .sum();
        self.kinds.insert(
            "(between ops, profile included)".into(),
            (1, self.t_loop.elapsed().as_secs_f64() - in_ops),
        );
        let mut kinds: Vec<_> = self
            .kinds
            .into_iter()
            .map(|(k, (n, s))| (k, n, s))
            .collect();
        kinds.sort_by(|a, b| b.2.total_cmp(&a.2));
        Profile {
            kinds,
            peak_live: self.peak_live,
            decoded_constants,
            heap,
        }
    }
}

/// glibc malloc's bytes in use and the size of its heap (every arena and
/// mapped chunk), for the profile; `None` elsewhere.
fn heap_bytes() -> Option<(usize, usize)> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd, m.arena + m.hblkhd))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Bytes of the storages behind `tensors`, each storage counted once (views
/// share their tensor's).
fn live_bytes<'a>(tensors: impl Iterator<Item = &'a Tensor>) -> usize {
    let mut seen = Set::default();
    let mut bytes = 0usize;
    for t in tensors {
        let (s, _) = t.storage_and_layout();
        let (addr, n) = match &*s {
            candle_core::Storage::Cpu(c) => match c {
                candle_core::CpuStorage::F32(v) => (v.as_ptr() as usize, v.len() * 4),
                candle_core::CpuStorage::F16(v) => (v.as_ptr() as usize, v.len() * 2),
                candle_core::CpuStorage::I64(v) => (v.as_ptr() as usize, v.len() * 8),
                other => (
                    other as *const _ as usize,
                    t.elem_count() * t.dtype().size_in_bytes(),
                ),
            },
            _ => continue,
        };
        if seen.insert(addr) {
            bytes = bytes.saturating_add(n);
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType as CDType, Device};

    #[test]
    fn live_bytes_counts_each_storage_once() {
        let a = Tensor::zeros((4, 8), CDType::F32, &Device::Cpu).unwrap();
        let view = a.narrow(1, 2, 3).unwrap();
        let h = Tensor::zeros(10, CDType::F16, &Device::Cpu).unwrap();
        let i = Tensor::zeros(3, CDType::I64, &Device::Cpu).unwrap();
        assert_eq!(live_bytes([&a, &view, &a.clone()].into_iter()), 4 * 8 * 4);
        assert_eq!(live_bytes([&a, &h, &i].into_iter()), 128 + 20 + 24);
        assert_eq!(live_bytes(std::iter::empty()), 0);
    }
}
