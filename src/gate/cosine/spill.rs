//! The reference side's outputs kept out of memory while the artifact side
//! runs: written once to an unnamed temporary file, read back exactly.

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::tensor_file::f32_values as to_vec;

/// Where [`Spill::put`] wrote a run of f32 values.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spilled {
    offset: u64,
    len: usize,
}

/// The reference's outputs, written to an unnamed temporary file as they
/// are computed and read back one tensor at a time: the gate runs the
/// reference over every case first and drops it before the artifact runs,
/// so the two towers' weights are never resident together, and a case's
/// per-block outputs (`depth x n x hidden` values) need not stay in memory.
pub(super) struct Spill {
    file: std::fs::File,
    end: u64,
}

impl Spill {
    pub(super) fn new() -> Result<Spill> {
        let file = tempfile::tempfile().map_err(|e| Error::io(&std::env::temp_dir(), e))?;
        Ok(Spill { file, end: 0 })
    }

    /// A run that panicked while holding the file (a bug, never input).
    pub(super) fn poisoned() -> Error {
        Error::Invalid(
            "the cosine gate's temporary file of reference outputs: a case failed while reading it"
                .into(),
        )
    }

    /// The values [`Spill::put`] wrote at `s`, from the file `spill` locks.
    pub(super) fn read(spill: &std::sync::Mutex<Spill>, s: Spilled) -> Result<Vec<f32>> {
        spill.lock().map_err(|_| Spill::poisoned())?.get(s)
    }

    pub(super) fn io(e: std::io::Error) -> Error {
        Error::Invalid(format!(
            "the cosine gate's temporary file of reference outputs (in {}): {e}",
            std::env::temp_dir().display()
        ))
    }

    /// Append `t`'s values (any float dtype, read as f32).
    pub(super) fn put(&mut self, t: &Tensor) -> Result<Spilled> {
        self.put_values(&to_vec(t)?)
    }

    /// Append `v`.
    pub(super) fn put_values(&mut self, v: &[f32]) -> Result<Spilled> {
        use std::io::{Seek, SeekFrom, Write};
        self.file
            .seek(SeekFrom::Start(self.end))
            .map_err(Spill::io)?;
        for chunk in v.chunks(1 << 18) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.file.write_all(&bytes).map_err(Spill::io)?;
        }
        let s = Spilled {
            offset: self.end,
            len: v.len(),
        };
        self.end += 4 * v.len() as u64;
        Ok(s)
    }

    /// The values [`Spill::put`] wrote at `s`.
    pub(super) fn get(&mut self, s: Spilled) -> Result<Vec<f32>> {
        use std::io::{Read, Seek, SeekFrom};
        self.file
            .seek(SeekFrom::Start(s.offset))
            .map_err(Spill::io)?;
        let mut bytes = vec![0u8; 4 * s.len];
        self.file.read_exact(&mut bytes).map_err(Spill::io)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// What the reference side spills reads back exactly, in any order,
    /// whatever the tensor's float dtype.
    #[test]
    fn spilled_reference_outputs_read_back_exactly() {
        let mut spill = Spill::new().unwrap();
        let a: Vec<f32> = (0..1000).map(|i| (i as f32).sin() * 1e3).collect();
        let b = vec![f32::MIN_POSITIVE, -0.0, 65504.0, f32::NAN];
        let ta = Tensor::from_slice(&a, (10, 100), &Device::Cpu).unwrap();
        let tb = Tensor::from_slice(&b, 4, &Device::Cpu).unwrap();
        let th = ta.to_dtype(candle_core::DType::F16).unwrap();
        let (sa, sb, sh) = (
            spill.put(&ta).unwrap(),
            spill.put(&tb).unwrap(),
            spill.put(&th).unwrap(),
        );
        let got_b = spill.get(sb).unwrap();
        assert_eq!(got_b[..3], b[..3]);
        assert!(got_b[3].is_nan() && got_b[1].is_sign_negative());
        assert_eq!(spill.get(sa).unwrap(), a);
        assert_eq!(spill.get(sh).unwrap(), to_vec(&th).unwrap());
    }
}
