//! What the profile of a run measures besides time: the bytes its values
//! hold, and malloc's heap.

use candle_core::Tensor;

use super::Set;

/// glibc malloc's bytes in use and the size of its heap (every arena and
/// mapped chunk), for the profile; `None` elsewhere.
pub(super) fn heap_bytes() -> Option<(usize, usize)> {
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
pub(super) fn live_bytes<'a>(tensors: impl Iterator<Item = &'a Tensor>) -> usize {
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
