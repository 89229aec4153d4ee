//! The MIL operations the interpreter executes, with MIL's semantics
//! (coremltools' `mil/ops/defs`): broadcasting binaries, reductions over
//! `axes` with `keep_dims`, `layer_norm` over `axes`, `conv` with
//! `pad_type` valid/same/same_lower/custom, exact int32 arithmetic, and the
//! constexpr ops that dequantise compressed weights.
//!
//! [`Interpreter::exec`] sends each op to its family: `elementwise.rs`,
//! `norms.rs` (softmax, layer norm, reductions), `layout.rs` (the moves),
//! `matmul.rs`, `conv.rs` and `constexpr.rs`. This file resolves an op's
//! inputs ([`Inputs`]) and reads their integers and scalars.

mod constexpr;
mod conv;
mod elementwise;
mod layout;
mod matmul;
mod norms;

pub(super) use layout::{SliceArgs, reshape_dims};

use candle_core::{DType as CDType, Tensor};

use super::{Interpreter, Map, Tally, V};
use crate::error::InterpError;
use crate::mlpackage::{Arg, Op};

/// Every op type the interpreter runs.
pub const SUPPORTED_OPS: &[&str] = &[
    "const",
    "add",
    "sub",
    "mul",
    "real_div",
    "maximum",
    "minimum",
    "pow",
    "sqrt",
    "rsqrt",
    "exp",
    "tanh",
    "sigmoid",
    "relu",
    "silu",
    "gelu",
    "abs",
    "log",
    "square",
    "erf",
    "inverse",
    "clip",
    "softmax",
    "layer_norm",
    "reduce_mean",
    "reduce_sum",
    "reduce_max",
    "reshape",
    "transpose",
    "expand_dims",
    "squeeze",
    "concat",
    "split",
    "slice_by_index",
    "gather",
    "cast",
    "conv",
    "linear",
    "matmul",
    "identity",
    "constexpr_affine_dequantize",
    "constexpr_blockwise_shift_scale",
    "constexpr_lut_to_dense",
];

type R<T> = Result<T, InterpError>;

fn ce(e: candle_core::Error) -> InterpError {
    InterpError::Candle(e)
}

fn ints(v: &V) -> R<Vec<i64>> {
    let t = v.tensor()?;
    let t = if t.dtype() == CDType::I64 {
        t.clone()
    } else {
        t.to_dtype(CDType::F32)
            .map_err(ce)?
            .to_dtype(CDType::I64)
            .map_err(ce)?
    };
    t.flatten_all().and_then(|f| f.to_vec1::<i64>()).map_err(ce)
}

fn scalar_f(v: &V) -> R<f32> {
    let t = v.tensor()?.to_dtype(CDType::F32).map_err(ce)?;
    t.flatten_all()
        .and_then(|f| f.to_vec1::<f32>())
        .map_err(ce)?
        .first()
        .copied()
        .ok_or_else(|| invalid!("empty scalar"))
}

fn boolean(v: &V) -> R<bool> {
    Ok(ints(v)?.first().copied().unwrap_or(0) != 0)
}

/// Normalise a possibly negative axis.
fn axis(a: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if (0..r.max(1)).contains(&x) {
        Ok(x as usize)
    } else {
        Err(invalid!("axis {a} out of range for rank {rank}"))
    }
}

fn f32t(v: &V) -> R<Tensor> {
    v.tensor()?.to_dtype(CDType::F32).map_err(ce)
}

/// An op's one output.
fn one(t: Tensor) -> R<Vec<V>> {
    Ok(vec![V::T(t)])
}

/// An op's inputs as the interpreter resolves them in a run's values.
struct Inputs<'a, 'p> {
    it: &'a Interpreter<'p>,
    op: &'a Op,
    env: &'a Map<String, V>,
}

impl Inputs<'_, '_> {
    /// Input `k`, which the op must have.
    fn get(&self, k: &str) -> R<V> {
        self.it
            .arg(self.op, self.env, k)?
            .ok_or_else(|| InterpError::MissingArg(k.to_string()))
    }

    /// Input `k`, if the op has it.
    fn opt(&self, k: &str) -> R<Option<V>> {
        self.it.arg(self.op, self.env, k)
    }

    /// The float input `x` of an op Core ML defines on floats only; the
    /// ops that also take int32 (abs, square, reductions) look first
    /// ([`Inputs::int_x`]).
    fn x(&self) -> R<Tensor> {
        let v = self.get("x")?;
        if v.tensor()?.dtype().is_int() {
            return Err(invalid!(
                "an integer `x`: Core ML defines `{}` on fp16 and fp32 only",
                self.op.kind
            ));
        }
        f32t(&v)
    }

    /// The input `x` if it is an integer tensor.
    fn int_x(&self) -> R<Option<Tensor>> {
        let v = self.get("x")?;
        let t = v.tensor()?;
        Ok(t.dtype().is_int().then(|| t.clone()))
    }
}

impl Interpreter<'_> {
    /// Run one op on the run's values `env`, adding what its shortcuts
    /// computed to the run's `tally`.
    pub(super) fn exec(&self, op: &Op, env: &Map<String, V>, tally: &Tally) -> R<Vec<V>> {
        let ins = Inputs { it: self, op, env };
        match op.kind.as_str() {
            "const" => self.const_value(op).map(|v| vec![v]),
            "identity" => Ok(vec![ins.get("x")?]),
            "add" | "sub" | "mul" | "real_div" | "maximum" | "minimum" | "pow" => {
                elementwise::binary(&ins)
            }
            "sqrt" | "rsqrt" | "exp" | "abs" | "square" | "log" | "erf" | "inverse" | "clip"
            | "tanh" | "sigmoid" | "relu" | "silu" | "gelu" => elementwise::unary(&ins),
            "cast" => elementwise::cast(&ins),
            "softmax" | "layer_norm" | "reduce_mean" | "reduce_sum" | "reduce_max" => {
                norms::exec(&ins)
            }
            "reshape" | "transpose" | "expand_dims" | "squeeze" | "concat" | "gather" | "split"
            | "slice_by_index" => layout::exec(&ins),
            "linear" | "matmul" => matmul::exec(&ins),
            "conv" => self.conv(op, env, tally).map(|t| vec![V::T(t)]),
            "constexpr_affine_dequantize"
            | "constexpr_blockwise_shift_scale"
            | "constexpr_lut_to_dense" => constexpr::exec(&ins),
            other => Err(internal!("op `{other}` is not supported")),
        }
    }

    /// A `const` op's value: kept in fp16 as stored where it is one of the
    /// 1x1 convolutions' weights ([`super::fp16_conv_weights`]).
    fn const_value(&self, op: &Op) -> R<V> {
        let v = op
            .attributes
            .get("val")
            .ok_or_else(|| invalid!("const without `val`"))?;
        let stored = op
            .outputs
            .first()
            .is_some_and(|o| self.fp16_weights.contains(o.name.as_str()));
        if stored {
            self.stored_fp16(v)
        } else {
            self.constant(v)
        }
    }

    /// Whether a `slice_by_index` of an operand of `dims` reads its last
    /// axis from a nonzero begin ([`super::AneRule::slice_clamp`]).
    pub(super) fn slice_offset_last(
        &self,
        op: &Op,
        env: &Map<String, V>,
        dims: &[usize],
    ) -> R<bool> {
        let (r, n) = (dims.len(), dims.last().copied().unwrap_or(0) as i64);
        let a = SliceArgs::read(&|k| self.arg(op, env, k)?.map(|v| ints(&v)).transpose(), r)?;
        Ok(a.last_begin(n).is_some_and(|b| b != 0))
    }

    /// `reduce_sum` of the float `x` as the Neural Engine sums ([`norms::narrow_sum`]).
    pub(super) fn narrow_sum(&self, op: &Op, env: &Map<String, V>, x: &Tensor) -> R<Tensor> {
        let ins = Inputs { it: self, op, env };
        norms::narrow_sum(&ins, x)
    }

    /// Resolve an op's input `key` (single argument).
    pub(super) fn arg<'a>(&self, op: &'a Op, env: &'a Map<String, V>, key: &str) -> R<Option<V>> {
        match op.inputs.get(key).map(Vec::as_slice) {
            // iOS16's constexpr ops hold their operands as attributes.
            None | Some([]) if op.kind.starts_with("constexpr_") => {
                op.attributes.get(key).map(|v| self.constant(v)).transpose()
            }
            None | Some([]) => Ok(None),
            Some([a]) => self.resolve(a, env).map(Some),
            Some(_) => Err(invalid!("input `{key}` takes one argument")),
        }
    }

    /// An argument's value: a variable of the run, or a constant.
    pub(super) fn resolve(&self, a: &Arg, env: &Map<String, V>) -> R<V> {
        match a {
            Arg::Var(n) => env
                .get(n)
                .cloned()
                .ok_or_else(|| InterpError::Undefined(n.clone())),
            Arg::Const(v) => self.constant(v),
        }
    }
}
