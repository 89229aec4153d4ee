//! CPU kernels for the reference's hot spots, as candle custom ops.
//!
//! candle runs element-wise ops on one thread and materialises every
//! intermediate; these fuse the few places where that dominates the run time
//! (attention, the linear layers' bias, the MLP activation, residual adds)
//! and spread them over all cores with rayon. The maths is the same f32
//! maths: the only approximation is [`exp_f32`], within 2 ulp of `expf`.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

/// A raw pointer that rayon tasks may share. Every use writes disjoint ranges.
#[derive(Clone, Copy)]
pub struct SendPtr(pub *mut f32);
// SAFETY: only used to write disjoint regions of one buffer from parallel tasks
// that all finish before the buffer is read.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the whole `SendPtr`).
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

/// `e^x` in f32 (Cephes `expf`: range reduction by ln 2, degree-6 polynomial),
/// branch-free so that loops over it vectorise. Inputs are clamped to
/// [-87.3, 88.7]; below -87.3 the result is 0, so that it is never subnormal.
/// A subnormal operand or result costs x86 cores a microcode assist of about
/// a hundred cycles: the probabilities of masked keys, once subnormal,
/// slowed a padded attention chain in fp32 more than tenfold.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let below = x < -87.3;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let shifted = x * LOG2E + ROUND;
    // The low mantissa bits of `shifted` hold round(x / ln 2) in two's complement.
    let ni = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5e-1;
    let y = p * r * r + r + 1.0;
    let e = y * f32::from_bits(((ni + 127) as u32) << 23);
    if below { 0.0 } else { e }
}

/// PyTorch's `gelu(approximate="tanh")`, with `tanh(u) = 1 - 2 / (e^{2u} + 1)`.
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    const BETA: f32 = 0.797_884_6; // sqrt(2 / pi)
    const KAPPA: f32 = 0.044_715;
    let u = BETA * (x + KAPPA * x * x * x);
    let t = 1.0 - 2.0 / (exp_f32(2.0 * u) + 1.0);
    0.5 * x * (1.0 + t)
}

#[inline(always)]
fn gelu_tanh_slice(o: &mut [f32], i: &[f32]) {
    for (o, &x) in o.iter_mut().zip(i) {
        *o = gelu_tanh(x);
    }
}

/// `$slice` over a slice in the widest vectors the CPU has: `$avx2` and
/// `$avx512` are it compiled for AVX2 and AVX-512F (the same f32 operations
/// in the same order, without fused multiply-adds: the same bits on every
/// path, which `gelus_match_closed_forms` checks), `$dispatch` takes the
/// widest.
macro_rules! widest_paths {
    ($slice:ident, $avx2:ident, $avx512:ident, $dispatch:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        unsafe fn $avx2(o: &mut [f32], i: &[f32]) {
            $slice(o, i)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f")]
        unsafe fn $avx512(o: &mut [f32], i: &[f32]) {
            $slice(o, i)
        }

        fn $dispatch(o: &mut [f32], i: &[f32]) {
            #[cfg(target_arch = "x86_64")]
            {
                if crate::blas::avx512() {
                    // SAFETY: the CPU supports AVX-512F (checked just above).
                    return unsafe { $avx512(o, i) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2 (checked just above).
                    return unsafe { $avx2(o, i) };
                }
            }
            $slice(o, i)
        }
    };
}

widest_paths!(
    gelu_tanh_slice,
    gelu_tanh_avx2,
    gelu_tanh_avx512,
    gelu_tanh_dispatch
);

/// `erfc(z)` for `z >= 0`: Numerical Recipes' Chebyshev fit (`erfcc`,
/// fractional error below 1.2e-7 for every `z`), in f32 with [`exp_f32`],
/// without branches, so that loops over it vectorise.
#[inline(always)]
fn erfc_nonneg(z: f32) -> f32 {
    const C: [f32; 10] = [
        -1.265_512_2,
        1.000_023_7,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_204,
        1.488_515_9,
        -0.822_152_2,
        0.170_872_77,
    ];
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = C[9];
    for &c in C[..9].iter().rev() {
        p = p * t + c;
    }
    t * exp_f32(p - z * z)
}

/// `0.5 x (1 + erf(x / sqrt 2))` (nn.GELU()), as `x - 0.5 x erfc(x / sqrt 2)`
/// for `x >= 0` and `0.5 x erfc(|x| / sqrt 2)` below, so that the far
/// negative side keeps its relative accuracy (where `1 + erf` would cancel).
/// In f32 over whole slices: in f64 with a scalar erf, this activation took
/// 6% of a DINOv2-L-shaped forward.
#[inline(always)]
fn gelu_erf(x: f32) -> f32 {
    let e = erfc_nonneg(x.abs() * std::f32::consts::FRAC_1_SQRT_2);
    // e is 0 far out, where 0.5 x e would be inf * 0.
    let h = if e == 0.0 { 0.0 } else { 0.5 * x * e };
    if x >= 0.0 { x - h } else { h }
}

#[inline(always)]
fn gelu_erf_slice(o: &mut [f32], i: &[f32]) {
    for (o, &x) in o.iter_mut().zip(i) {
        *o = gelu_erf(x);
    }
}

widest_paths!(
    gelu_erf_slice,
    gelu_erf_avx2,
    gelu_erf_avx512,
    gelu_erf_dispatch
);

fn contiguous<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(d) = s else {
        candle_core::bail!("{what}: expected f32");
    };
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what}: expected a contiguous tensor");
    };
    Ok(&d[a..b])
}

const CHUNK: usize = 1 << 14;

/// `x * sigmoid(a x)`: `a = 1` is SiLU, `a = 1.702` is quick GELU. In f32
/// as `x / (1 + e^(-a x))` with [`exp_f32`], so that loops over it
/// vectorise (in f64 with libm's `exp` everywhere, this took 5% of a
/// CLIP-L-shaped forward), except where `e^(-a x)` leaves [`exp_f32`]'s
/// range (`a x < -80`): there in f64, whose tiny (subnormal) results are
/// PyTorch's. The scalar form of what [`x_sigmoid_slice`] computes.
#[cfg(test)]
fn x_sigmoid(x: f32, a: f32) -> f32 {
    if a * x < -80.0 {
        x_sigmoid_f64(x, a)
    } else {
        x / (1.0 + exp_f32(-(a * x)))
    }
}

#[inline(never)]
fn x_sigmoid_f64(x: f32, a: f32) -> f32 {
    let x = f64::from(x);
    (x / (1.0 + (-f64::from(a) * x).exp())) as f32
}

/// `x * sigmoid(a x)` of every value (see `x_sigmoid` in the tests): the
/// f32 form over all of them (one vectorised loop), then the few far below
/// 0 again in f64.
#[inline(always)]
fn x_sigmoid_slice(o: &mut [f32], i: &[f32], a: f32) {
    for (o, &x) in o.iter_mut().zip(i) {
        *o = x / (1.0 + exp_f32(-(a * x)));
    }
    for (o, &x) in o.iter_mut().zip(i) {
        if a * x < -80.0 {
            *o = x_sigmoid_f64(x, a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn x_sigmoid_avx2(o: &mut [f32], i: &[f32], a: f32) {
    x_sigmoid_slice(o, i, a)
}

fn x_sigmoid_dispatch(o: &mut [f32], i: &[f32], a: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { x_sigmoid_avx2(o, i, a) };
    }
    x_sigmoid_slice(o, i, a)
}

/// The MLP activation.
#[derive(Clone, Copy, Debug)]
pub enum Gelu {
    Tanh,
    Erf,
    /// `x * sigmoid(1.702 x)` (`quick_gelu`).
    Quick,
    /// `x * sigmoid(x)` (`silu`).
    Silu,
    /// `max(x, 0)` (`relu`).
    Relu,
}

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "par-gelu"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let src = contiguous(s, l, "gelu")?;
        let mut out = vec![0f32; src.len()];
        // One loop per variant, so the activation inlines and vectorises.
        let parts = out.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK));
        match self {
            Gelu::Tanh => parts.for_each(|(o, i)| gelu_tanh_dispatch(o, i)),
            Gelu::Erf => parts.for_each(|(o, i)| gelu_erf_dispatch(o, i)),
            Gelu::Quick => parts.for_each(|(o, i)| x_sigmoid_dispatch(o, i, 1.702)),
            Gelu::Silu => parts.for_each(|(o, i)| x_sigmoid_dispatch(o, i, 1.0)),
            Gelu::Relu => parts.for_each(|(o, i)| {
                o.iter_mut().zip(i).for_each(|(o, &x)| *o = x.max(0.0));
            }),
        }
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }
}

/// `a + b` for two tensors of the same shape, over all cores.
pub struct ParAdd;

impl CustomOp2 for ParAdd {
    fn name(&self) -> &'static str {
        "par-add"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (a, b) = (contiguous(s1, l1, "add")?, contiguous(s2, l2, "add")?);
        if l1.shape() != l2.shape() {
            candle_core::bail!("add: shapes {:?} and {:?} differ", l1.shape(), l2.shape());
        }
        let mut out = vec![0f32; a.len()];
        out.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
            .for_each(|(o, (a, b))| {
                for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
                    *o = x + y;
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// `x W^T + b` for `x [n, in]`, `W^T [in, out]` (pre-transposed: gemm packs a
/// contiguous right operand about 15% faster than a strided one), `b [out]`.
/// The output starts as the broadcast bias and gemm accumulates into it (no
/// separate bias pass). `W^T` may be held in bf16 or f16 ([`compact`]): it is
/// then widened to f32 for the product, which is exact, so the result is the
/// one of an f32 `W^T`.
pub struct LinearOp;

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        "linear"
    }
    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, b) = (
            contiguous(sx, lx, "linear x")?,
            contiguous(sb, lb, "linear b")?,
        );
        let (n, inp) = lx.shape().dims2()?;
        let (inp_w, out) = lw.shape().dims2()?;
        if inp != inp_w || b.len() != out {
            candle_core::bail!(
                "linear: x {:?}, w {:?}, b {:?} do not fit",
                lx.shape(),
                lw.shape(),
                lb.shape()
            );
        }
        let Some((lo, hi)) = lw.contiguous_offsets() else {
            candle_core::bail!("linear w: expected a contiguous tensor");
        };
        let mut dst = vec![0f32; n * out];
        dst.par_chunks_mut(out)
            .for_each(|row| row.copy_from_slice(b));
        // Fewer tokens than output channels: split the product by columns,
        // so that each task packs its part of the weight, not all of it.
        let sgemm = if n < out {
            crate::blas::sgemm_by_columns
        } else {
            crate::blas::sgemm
        };
        let product = |w: &[f32], dst: &mut [f32]| {
            // SAFETY: dst is [n, out], x [n, inp] and W^T [inp, out], all
            // row-major and contiguous, with the dimensions checked above.
            unsafe {
                sgemm(
                    (n, out, inp),
                    (x.as_ptr(), inp),
                    (w.as_ptr(), out),
                    (dst.as_mut_ptr(), out),
                    true,
                );
            }
        };
        match sw {
            CpuStorage::F32(d) => product(&d[lo..hi], &mut dst),
            CpuStorage::BF16(d) => widened(&d[lo..hi], |w| product(w, &mut dst)),
            CpuStorage::F16(d) => widened(&d[lo..hi], |w| product(w, &mut dst)),
            _ => candle_core::bail!("linear w: expected f32, bf16 or f16"),
        }
        Ok((CpuStorage::F32(dst), Shape::from((n, out))))
    }
}

/// A half-precision value widened to f32 (exactly).
trait Widen: Copy + Sync {
    fn widen(v: &[Self], out: &mut [f32]);
}

impl Widen for half::bf16 {
    fn widen(v: &[Self], out: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(v, out)
    }
}

impl Widen for half::f16 {
    fn widen(v: &[Self], out: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(v, out)
    }
}

thread_local! {
    /// The calling thread's widened weights, reused from product to product:
    /// a fresh allocation per product would fault in tens of megabytes of
    /// new pages for every block.
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` on `v` widened to f32 (over all cores), in the calling thread's
/// reused buffer (a fresh one if that buffer is in use).
fn widened<T: Widen>(v: &[T], f: impl FnOnce(&[f32])) {
    let fill = |out: &mut [f32]| {
        out.par_chunks_mut(CHUNK)
            .zip(v.par_chunks(CHUNK))
            .for_each(|(o, v)| T::widen(v, o));
    };
    WIDENED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < v.len() {
                buf.resize(v.len(), 0.0);
            }
            fill(&mut buf[..v.len()]);
            f(&buf[..v.len()]);
        }
        Err(_) => {
            let mut buf = vec![0f32; v.len()];
            fill(&mut buf);
            f(&buf);
        }
    });
}

/// A weight matrix in the narrowest of f32, bf16 and f16 that holds every
/// one of its values exactly: a checkpoint's bf16 or f16 weights, read as
/// f32, go back to half their memory with no value changed.
pub fn compact(w: Vec<f32>, shape: (usize, usize)) -> candle_core::Result<Tensor> {
    let dev = &candle_core::Device::Cpu;
    if w.par_iter().all(|v| v.to_bits() & 0xffff == 0) {
        let h: Vec<half::bf16> = w
            .par_iter()
            .map(|v| half::bf16::from_bits((v.to_bits() >> 16) as u16))
            .collect();
        return Tensor::from_vec(h, shape, dev);
    }
    if w.par_iter()
        .all(|v| half::f16::from_f32(*v).to_f32().to_bits() == v.to_bits())
    {
        let h: Vec<half::f16> = w.par_iter().map(|v| half::f16::from_f32(*v)).collect();
        return Tensor::from_vec(h, shape, dev);
    }
    Tensor::from_vec(w, shape, dev)
}

/// Non-causal multi-head attention with 2D rotary embeddings, straight from
/// the fused `qkv [n, 3D]` projection (rows `[0, D)` Q head-major, `[D, 2D)`
/// K, `[2D, 3D)` V) to `[n, D]` in token-major order.
///
/// Each `(start, len)` segment (one frame of one image) attends only to
/// itself. Work is split over (segment, head, block of queries), each task
/// holding one score block of at most `QUERY_BLOCK x len`.
pub struct Attention {
    pub heads: usize,
    pub head_dim: usize,
    /// `[n, head_dim / 2]` each: the rotary angle's cos and sin per token;
    /// both empty for a tower without rotary embeddings.
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub segments: Vec<(usize, usize)>,
}

const QUERY_BLOCK: usize = 256;

impl Attention {
    /// Rotate one head vector in place: NeoX halves, `x*cos + rotate_half(x)*sin`.
    #[inline(always)]
    fn rope(v: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = v.len() / 2;
        for i in 0..half {
            let (x1, x2) = (v[i], v[i + half]);
            v[i] = x1 * cos[i] - x2 * sin[i];
            v[i + half] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

impl CustomOp1 for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let qkv = contiguous(s, l, "attention")?;
        let (n, three_d) = l.shape().dims2()?;
        let (h, hd) = (self.heads, self.head_dim);
        let d = h * hd;
        let rotary = !(self.cos.is_empty() && self.sin.is_empty());
        if three_d != 3 * d
            || (rotary && (self.cos.len() != n * hd / 2 || self.sin.len() != n * hd / 2))
        {
            candle_core::bail!(
                "attention: qkv {:?} does not fit {h} heads of {hd}",
                l.shape()
            );
        }
        // Q and K with rotary applied, head-major [h, n, hd] for contiguous gemm operands.
        let mut q = vec![0f32; n * d];
        let mut k = vec![0f32; n * d];
        for (dst, off) in [(&mut q, 0usize), (&mut k, d)] {
            dst.par_chunks_mut(n * hd)
                .enumerate()
                .for_each(|(head, block)| {
                    for t in 0..n {
                        let v = &mut block[t * hd..(t + 1) * hd];
                        let src = t * three_d + off + head * hd;
                        v.copy_from_slice(&qkv[src..src + hd]);
                        if !rotary {
                            continue;
                        }
                        let c = &self.cos[t * hd / 2..(t + 1) * hd / 2];
                        let sn = &self.sin[t * hd / 2..(t + 1) * hd / 2];
                        Self::rope(v, c, sn);
                    }
                });
        }
        let scale = (hd as f32).powf(-0.5);
        let mut out = vec![0f32; n * d];
        let out_ptr = SendPtr(out.as_mut_ptr());
        let mut jobs = Vec::new();
        for &(start, len) in &self.segments {
            if start + len > n {
                candle_core::bail!("attention: segment {start}+{len} exceeds {n} tokens");
            }
            for head in 0..h {
                for q0 in (0..len).step_by(QUERY_BLOCK) {
                    jobs.push((start, len, head, q0, QUERY_BLOCK.min(len - q0)));
                }
            }
        }
        // Score blocks are reused per worker: a fresh multi-MB allocation per
        // task costs page faults comparable to the softmax itself.
        let product = attention_product();
        jobs.par_iter()
            .for_each_init(Vec::new, |scores, &(start, len, head, q0, qn)| {
                scores.resize(qn * len, 0.0);
                let qp = &q[(head * n + start + q0) * hd..];
                let kp = &k[(head * n + start) * hd..];
                // SAFETY: all operands lie inside their buffers: Q rows start+q0..+qn,
                // K and V rows start..start+len (checked against n above), hd columns.
                // Each task writes rows start+q0..+qn, columns head*hd..+hd of `out`,
                // disjoint from every other task's.
                unsafe {
                    // scores [qn, len] = scale * Q [qn, hd] . K^T [hd, len]
                    product(
                        (qn, len, hd),
                        scale,
                        (qp.as_ptr(), hd),
                        ((kp.as_ptr(), hd), true),
                        (scores.as_mut_ptr(), len),
                    );
                }
                let inv_sums: Vec<f32> =
                    scores.chunks_exact_mut(len).map(exp_row_dispatch).collect();
                unsafe {
                    // out [qn, hd] = exp-scores [qn, len] . V [len, hd], V read from qkv.
                    let v = qkv.as_ptr().add(start * three_d + 2 * d + head * hd);
                    let o = out_ptr.get().add((start + q0) * d + head * hd);
                    product(
                        (qn, hd, len),
                        1.0,
                        (scores.as_ptr(), len),
                        ((v, three_d), false),
                        (o, d),
                    );
                    // Normalise the softmax on the [qn, hd] product.
                    for (i, inv) in inv_sums.iter().enumerate() {
                        for c in 0..hd {
                            *o.add(i * d + c) *= inv;
                        }
                    }
                }
            });
        Ok((CpuStorage::F32(out), Shape::from((n, d))))
    }
}

/// What runs the attention's two products (per head and block of
/// [`QUERY_BLOCK`] queries, on the calling thread): the `gemm` crate, not
/// the matrix products' library. At these shapes (a `k` of 64 for the
/// scores, an `n` of 64 for the product with V) it ran the op 1.09x to
/// 1.22x faster than OpenBLAS's SkylakeX kernels on a Zen 4, each product
/// faster on its own (BENCHMARKS.md, "The AVX-512 exponentials four
/// registers a turn, and the fp32 reference's attention products on the
/// gemm crate"); with AVX2 kernels on both sides on the same CPU (the
/// crate built without AVX-512 against OpenBLAS's Haswell kernels, under
/// `ANE_EXPORT_CPU=avx2`) the two took the same time within the host's
/// noise (BENCHMARKS.md, "The AVX2 paths measured on an AVX-512 host"); not
/// yet on an AVX2 CPU itself. `ANE_EXPORT_REFERENCE_ATTENTION=blas` puts
/// them on the library (read once).
fn attention_product() -> SerialProduct {
    static P: std::sync::OnceLock<SerialProduct> = std::sync::OnceLock::new();
    *P.get_or_init(|| {
        if std::env::var_os("ANE_EXPORT_REFERENCE_ATTENTION").is_some_and(|v| v == "blas") {
            crate::blas::sgemm_serial
        } else {
            crate::blas::gemm_crate_serial
        }
    })
}

/// [`crate::blas::sgemm_serial`]'s signature.
type SerialProduct = unsafe fn(
    (usize, usize, usize),
    f32,
    crate::blas::Rows,
    (crate::blas::Rows, bool),
    (*mut f32, usize),
);

/// Softmax numerator of one row in place, `exp(x - max)`; returns `1 / sum`
/// so the caller can normalise the (much smaller) product with V instead.
/// Reductions run in 8 lanes so that every pass vectorises.
#[inline(always)]
fn exp_row(row: &mut [f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            lanes[i] = lanes[i].max(c[i]);
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sums = [0f32; 8];
    let mut chunks = row.chunks_exact_mut(8);
    for c in &mut chunks {
        for i in 0..8 {
            c[i] = exp_f32(c[i] - max);
            sums[i] += c[i];
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for v in chunks.into_remainder() {
        *v = exp_f32(*v - max);
        sum += *v;
    }
    1.0 / sum
}

/// [`exp_f32`] on 8 lanes: the same operations in the same order (no FMA),
/// so the same bits. Operand order keeps NaN inputs NaN, as `clamp` does.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp8_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    let [e] = exp8n_avx2([x]);
    e
}

/// [`exp8_avx2`] on `N` registers, step by step across them, so that `N`
/// polynomials are in flight at once (one alone waits on its chain's
/// latency): the same operations per lane, so the same bits.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn exp8n_avx2<const N: usize>(x: [std::arch::x86_64::__m256; N]) -> [std::arch::x86_64::__m256; N] {
    use std::arch::x86_64::*;
    let c = _mm256_set1_ps;
    const ROUND: f32 = 12_582_912.0;
    // Below -87.3 the result is 0 (NaN compares false and stays NaN).
    let below = x.map(|x| _mm256_cmp_ps::<_CMP_LT_OQ>(x, c(-87.3)));
    // max/min return their second operand when either is NaN.
    let x = x.map(|x| _mm256_min_ps(c(88.7), _mm256_max_ps(c(-87.3), x)));
    let mut ni = [_mm256_setzero_si256(); N];
    let mut r = [_mm256_setzero_ps(); N];
    for j in 0..N {
        let shifted = _mm256_add_ps(_mm256_mul_ps(x[j], c(std::f32::consts::LOG2_E)), c(ROUND));
        ni[j] = _mm256_sub_epi32(
            _mm256_castps_si256(shifted),
            _mm256_set1_epi32(ROUND.to_bits() as i32),
        );
        let n = _mm256_sub_ps(shifted, c(ROUND));
        r[j] = _mm256_sub_ps(
            _mm256_sub_ps(x[j], _mm256_mul_ps(n, c(0.693_359_4))),
            _mm256_mul_ps(n, c(-2.121_944_4e-4)),
        );
    }
    let mut p = [c(1.987_569_1e-4); N];
    for k in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        5e-1,
    ] {
        for j in 0..N {
            p[j] = _mm256_add_ps(_mm256_mul_ps(p[j], r[j]), c(k));
        }
    }
    let mut e = [_mm256_setzero_ps(); N];
    for j in 0..N {
        let y = _mm256_add_ps(
            _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p[j], r[j]), r[j]), r[j]),
            c(1.0),
        );
        let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(ni[j], _mm256_set1_epi32(127)));
        e[j] = _mm256_andnot_ps(below[j], _mm256_mul_ps(y, _mm256_castsi256_ps(scale)));
    }
    e
}

/// [`exp8_avx2`] on 16 lanes: the same operations per lane, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp16_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    let [e] = exp16n_avx512([x]);
    e
}

/// [`exp16_avx512`] on `N` registers, step by step across them, as
/// [`exp8n_avx2`] takes its registers: the same bits.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16n_avx512<const N: usize>(
    x: [std::arch::x86_64::__m512; N],
) -> [std::arch::x86_64::__m512; N] {
    use std::arch::x86_64::*;
    let c = _mm512_set1_ps;
    const ROUND: f32 = 12_582_912.0;
    let keep = x.map(|x| _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, c(-87.3)));
    let x = x.map(|x| _mm512_min_ps(c(88.7), _mm512_max_ps(c(-87.3), x)));
    let mut ni = [_mm512_setzero_si512(); N];
    let mut r = [_mm512_setzero_ps(); N];
    for j in 0..N {
        let shifted = _mm512_add_ps(_mm512_mul_ps(x[j], c(std::f32::consts::LOG2_E)), c(ROUND));
        ni[j] = _mm512_sub_epi32(
            _mm512_castps_si512(shifted),
            _mm512_set1_epi32(ROUND.to_bits() as i32),
        );
        let n = _mm512_sub_ps(shifted, c(ROUND));
        r[j] = _mm512_sub_ps(
            _mm512_sub_ps(x[j], _mm512_mul_ps(n, c(0.693_359_4))),
            _mm512_mul_ps(n, c(-2.121_944_4e-4)),
        );
    }
    let mut p = [c(1.987_569_1e-4); N];
    for k in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        5e-1,
    ] {
        for j in 0..N {
            p[j] = _mm512_add_ps(_mm512_mul_ps(p[j], r[j]), c(k));
        }
    }
    let mut e = [_mm512_setzero_ps(); N];
    for j in 0..N {
        let y = _mm512_add_ps(
            _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p[j], r[j]), r[j]), r[j]),
            c(1.0),
        );
        let scale = _mm512_slli_epi32::<23>(_mm512_add_epi32(ni[j], _mm512_set1_epi32(127)));
        e[j] = _mm512_maskz_mov_ps(keep[j], _mm512_mul_ps(y, _mm512_castsi512_ps(scale)));
    }
    e
}

/// [`exp_sum_avx2`] with the exponentials taken 16 at a time; the sum is
/// still kept in 8 lanes, added in the same order, so the bits are the same.
///
/// # Safety
/// The CPU must support AVX-512F and AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn exp_sum_avx512(row: &mut [f32], max: f32) -> f32 {
    use std::arch::x86_64::*;
    let whole = row.len() / 16 * 16;
    let mut sums = _mm256_setzero_ps();
    let m = _mm512_set1_ps(max);
    let p = row.as_mut_ptr();
    // Each register's halves in turn into the 8 lane sums.
    let add = |sums: __m256, e: __m512| {
        let sums = _mm256_add_ps(sums, _mm512_castps512_ps256(e));
        _mm256_add_ps(
            sums,
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e))),
        )
    };
    // Four registers a turn (added in order), then one.
    let quads = row.len() / 64 * 64;
    for i in (0..quads).step_by(64) {
        // SAFETY: i + 64 <= row.len().
        unsafe {
            let x = [0, 16, 32, 48].map(|o| _mm512_sub_ps(_mm512_loadu_ps(p.add(i + o)), m));
            for (j, e) in exp16n_avx512(x).into_iter().enumerate() {
                _mm512_storeu_ps(p.add(i + 16 * j), e);
                sums = add(sums, e);
            }
        }
    }
    for i in (quads..whole).step_by(16) {
        // SAFETY: i + 16 <= row.len().
        unsafe {
            let e = exp16_avx512(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), m));
            _mm512_storeu_ps(p.add(i), e);
            sums = add(sums, e);
        }
    }
    // SAFETY: the CPU supports AVX2 (this function's own requirement).
    unsafe { exp_sum_avx2_from(row, max, whole, sums) }
}

/// [`exp_row`] with explicit AVX2 (the compiler does not vectorise
/// [`exp_f32`] on its own): the same lanes, order and bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_row_avx2(row: &mut [f32]) -> f32 {
    use std::arch::x86_64::*;
    let whole = row.len() / 8 * 8;
    let (body, tail) = row.split_at_mut(whole);
    let mut lanes = _mm256_set1_ps(f32::NEG_INFINITY);
    for c in body.chunks_exact(8) {
        // SAFETY: `c` holds 8 values.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        // Returns `lanes` when `v` is NaN, as f32::max does.
        lanes = _mm256_max_ps(v, lanes);
    }
    let max = fold_max(lanes, tail);
    // SAFETY: the CPU supports AVX2 (this function's own requirement).
    unsafe { exp_sum_avx2(row, max) }
}

/// The maximum of eight lanes and a slice, as `f32::max` folds it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn fold_max(lanes: std::arch::x86_64::__m256, tail: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut l = [0f32; 8];
    // SAFETY: `l` holds 8 values.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes) };
    tail.iter()
        .chain(&l)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// The second half of [`exp_row_avx2`] once the row's maximum is known:
/// `row = exp(row - max)` in place; returns `1 / sum(row)`.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn exp_sum_avx2(row: &mut [f32], max: f32) -> f32 {
    if crate::blas::avx512() {
        // SAFETY: the CPU has AVX-512F (just checked) and AVX2 (the caller's promise).
        return unsafe { exp_sum_avx512(row, max) };
    }
    // SAFETY: the CPU supports AVX2 (the caller's promise).
    unsafe { exp_sum_avx2_from(row, max, 0, std::arch::x86_64::_mm256_setzero_ps()) }
}

/// [`exp_sum_avx2`] from index `start` (a multiple of 8), with the 8 lane
/// sums so far.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_sum_avx2_from(
    row: &mut [f32],
    max: f32,
    start: usize,
    mut sums: std::arch::x86_64::__m256,
) -> f32 {
    use std::arch::x86_64::*;
    let whole = row.len() / 8 * 8;
    let (body, tail) = row[start..].split_at_mut(whole - start);
    let m = _mm256_set1_ps(max);
    // Four registers a turn (added to the sums in order), then one.
    let mut quads = body.chunks_exact_mut(32);
    for c in &mut quads {
        // SAFETY: `c` holds 32 values.
        unsafe {
            let p = c.as_mut_ptr();
            let x = [0, 8, 16, 24].map(|o| _mm256_sub_ps(_mm256_loadu_ps(p.add(o)), m));
            for (j, e) in exp8n_avx2(x).into_iter().enumerate() {
                _mm256_storeu_ps(p.add(8 * j), e);
                sums = _mm256_add_ps(sums, e);
            }
        }
    }
    for c in quads.into_remainder().chunks_exact_mut(8) {
        // SAFETY: `c` holds 8 values.
        unsafe {
            let e = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            sums = _mm256_add_ps(sums, e);
        }
    }
    let mut l = [0f32; 8];
    // SAFETY: `l` holds 8 values.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), sums) };
    let mut sum: f32 = l.iter().sum();
    for v in tail {
        *v = exp_f32(*v - max);
        sum += *v;
    }
    1.0 / sum
}

/// [`exp_row`] with the widest instruction set the CPU has.
fn exp_row_dispatch(row: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { exp_row_avx2(row) };
    }
    exp_row(row)
}

/// Softmax of one row in place: `exp(x - max) / sum`.
pub fn softmax_in_place(row: &mut [f32]) {
    let inv = exp_row_dispatch(row);
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// Transpose a row-major `[rows, cols]` matrix, in parallel, a tile at a
/// time through a buffer: the tile's rows are read whole, transposed in
/// the buffer (which stays in L1) and written as whole rows. Reading or
/// writing a tile's columns in place instead touches one cache line per
/// value at a stride of a power-of-two row, lines the cache cannot hold at
/// once (it took a third of loading a 2B-shaped Qwen3-VL tower).
pub fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const TILE: usize = 64;
    assert_eq!(
        src.len(),
        rows * cols,
        "matrix buffer does not match its shape"
    );
    let mut out = vec![0f32; rows * cols];
    // Each task owns TILE output rows (= TILE source columns).
    out.par_chunks_mut(TILE * rows)
        .enumerate()
        .for_each(|(t, block)| {
            let c0 = t * TILE;
            let cn = block.len() / rows.max(1);
            let mut tile = [0f32; TILE * TILE];
            for r0 in (0..rows).step_by(TILE) {
                let rn = TILE.min(rows - r0);
                // tile[c * TILE + r] = src[(r0 + r) * cols + c0 + c]
                for r in 0..rn {
                    let row = &src[(r0 + r) * cols + c0..][..cn];
                    for (c, &v) in row.iter().enumerate() {
                        tile[c * TILE + r] = v;
                    }
                }
                for c in 0..cn {
                    block[c * rows + r0..][..rn].copy_from_slice(&tile[c * TILE..][..rn]);
                }
            }
        });
    out
}

/// Apply a custom op to a contiguous tensor.
pub fn apply1(x: &Tensor, op: &impl CustomOp1) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp_f32(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 2.5e-7, "relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-1e4) >= 0.0 && exp_f32(-1e4) < 1e-37);
    }

    #[test]
    fn gelus_match_closed_forms() {
        for i in -800..800 {
            let x = i as f32 / 100.0;
            let tanh = 0.5 * x * (1.0 + (0.797_884_6f32 * (x + 0.044_715 * x * x * x)).tanh());
            assert!((gelu_tanh(x) - tanh).abs() < 2e-6, "{x}");
            let erf =
                0.5 * f64::from(x) * (1.0 + libm_like_erf(f64::from(x) / std::f64::consts::SQRT_2));
            assert!((f64::from(gelu_erf(x)) - erf).abs() < 1e-6, "{x}");
        }
        // Relative accuracy on the negative side, where `1 + erf` would
        // cancel: against erfc in f64.
        // The exponent `-z^2` carries f32's rounding (an ulp of 72 is 8e-6
        // at x = -12): about 1e-6 down to x = -5, 1e-5 beyond, where GELU
        // is below 2e-6 in size (PyTorch's f32 `1 + erf` there is 0).
        for i in 100..1300 {
            let x = -(i as f32) / 100.0;
            let want = 0.5
                * f64::from(x)
                * candle_core::cpu::erf::erfc_f64(-f64::from(x) / std::f64::consts::SQRT_2);
            let got = f64::from(gelu_erf(x));
            let bound = if x >= -5.0 { 2.5e-6 } else { 1.5e-5 };
            assert!(
                (got - want).abs() <= bound * want.abs(),
                "{x}: {got} vs {want}"
            );
        }
        assert_eq!(gelu_erf(0.0), 0.0);
        assert_eq!(gelu_erf(f32::INFINITY), f32::INFINITY);
        assert_eq!(gelu_erf(f32::NEG_INFINITY), 0.0);
        assert!(gelu_erf(f32::NAN).is_nan());
        // Every vector path this CPU has gives the scalar's bits, for
        // both forms.
        let xs: Vec<f32> = (-3000..3000).map(|i| i as f32 / 97.0).collect();
        type Path = fn(&mut [f32], &[f32]);
        /// A form's name, its scalar, and its slice paths.
        type Form = (&'static str, fn(f32) -> f32, Vec<Path>);
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut forms: Vec<Form> = vec![
            ("erf", gelu_erf, vec![gelu_erf_dispatch, gelu_erf_slice]),
            ("tanh", gelu_tanh, vec![gelu_tanh_dispatch, gelu_tanh_slice]),
        ];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2.
                forms[0].2.push(|o, i| unsafe { gelu_erf_avx2(o, i) });
                // SAFETY: as above.
                forms[1].2.push(|o, i| unsafe { gelu_tanh_avx2(o, i) });
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports AVX-512F.
                forms[0].2.push(|o, i| unsafe { gelu_erf_avx512(o, i) });
                // SAFETY: as above.
                forms[1].2.push(|o, i| unsafe { gelu_tanh_avx512(o, i) });
            }
        }
        for (name, scalar, paths) in forms {
            for (k, path) in paths.into_iter().enumerate() {
                let mut o = vec![0f32; xs.len()];
                path(&mut o, &xs);
                for (&x, &y) in xs.iter().zip(&o) {
                    assert_eq!(y.to_bits(), scalar(x).to_bits(), "{name} path {k} at {x}");
                }
            }
        }
    }

    #[test]
    fn sigmoid_activations_match_closed_forms() {
        for i in -2000..2000 {
            let x = i as f32 / 100.0;
            let s = |a: f32| x / (1.0 + (-a * x).exp());
            assert!(
                (x_sigmoid(x, 1.0) - s(1.0)).abs() <= 2e-6 * x.abs().max(1.0),
                "{x}"
            );
            assert!(
                (x_sigmoid(x, 1.702) - s(1.702)).abs() <= 2e-6 * x.abs().max(1.0),
                "{x}"
            );
        }
        // -100 sigmoid(-100) is a subnormal f32, as torch computes it.
        assert!(x_sigmoid(-100.0, 1.0) < 0.0 && x_sigmoid(-100.0, 1.0) > -1e-40);
        assert_eq!(x_sigmoid(100.0, 1.702), 100.0);
        // The slice (the parallel op's path) gives the scalar's values on
        // both sides of the f64 fallback.
        let xs: Vec<f32> = (-20000..2000).map(|i| i as f32 / 100.0).collect();
        for a in [1.0, 1.702] {
            let mut o = vec![0f32; xs.len()];
            x_sigmoid_dispatch(&mut o, &xs, a);
            for (&x, &y) in xs.iter().zip(&o) {
                assert_eq!(y.to_bits(), x_sigmoid(x, a).to_bits(), "{a} {x}");
            }
        }
    }

    /// erf by its series / continued fraction is overkill; use the identity
    /// with the complementary error function from candle's f64 implementation.
    fn libm_like_erf(x: f64) -> f64 {
        1.0 - candle_core::cpu::erf::erfc_f64(x)
    }

    #[test]
    fn transpose_round_trips() {
        let (r, c) = (70, 131);
        let m: Vec<f32> = (0..r * c).map(|i| i as f32).collect();
        let t = transpose(&m, r, c);
        for i in 0..r {
            for j in 0..c {
                assert_eq!(t[j * r + i], m[i * c + j], "({i}, {j})");
            }
        }
        assert_eq!(transpose(&t, c, r), m);
        // Whole tiles only, and one row.
        let m: Vec<f32> = (0..128 * 64).map(|i| i as f32).collect();
        assert_eq!(transpose(&transpose(&m, 128, 64), 64, 128), m);
        assert_eq!(transpose(&m[..64], 1, 64), m[..64]);
    }

    /// The AVX2 row kernel (with its AVX-512 exponentials where the CPU has
    /// them) and the AVX2-only one give the portable one's bits, NaN included.
    #[test]
    fn exp_row_avx2_matches_portable() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            for len in [1, 7, 8, 9, 16, 24, 31, 100, 4099] {
                let src: Vec<f32> = (0..len)
                    .map(|i| ((i * 7919) % 2000) as f32 * 0.07 - 90.0)
                    .collect();
                let (mut a, mut b, mut c) = (src.clone(), src.clone(), src.clone());
                let (sa, sb) = (exp_row(&mut a), unsafe { exp_row_avx2(&mut b) });
                let max = src.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                let zero = unsafe { std::arch::x86_64::_mm256_setzero_ps() };
                let sc = unsafe { exp_sum_avx2_from(&mut c, max, 0, zero) };
                assert_eq!(sa.to_bits(), sb.to_bits(), "len {len}");
                assert_eq!(sa.to_bits(), sc.to_bits(), "len {len}");
                for ((x, y), z) in a.iter().zip(&b).zip(&c) {
                    assert_eq!(x.to_bits(), y.to_bits(), "len {len}");
                    assert_eq!(x.to_bits(), z.to_bits(), "len {len}");
                }
                assert!(a.iter().all(|&x| x == 0.0 || x >= f32::MIN_POSITIVE));
            }
            let mut n = vec![1.0, f32::NAN, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
            unsafe { exp_row_avx2(&mut n) };
            assert!(n[1].is_nan() && !n[0].is_nan());
        }
    }

    #[test]
    fn softmax_sums_to_one_and_orders() {
        let mut r: Vec<f32> = (0..37).map(|i| (i as f32 * 0.7).sin() * 30.0).collect();
        let orig = r.clone();
        softmax_in_place(&mut r);
        let s: f32 = r.iter().sum();
        assert!((s - 1.0).abs() < 1e-5);
        let (imax, _) = orig
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |a, (i, &v)| if v > a.1 { (i, v) } else { a });
        assert!(r.iter().all(|&v| v <= r[imax]));
    }
}
