//! A validated, owned view of an ML program: functions, their inputs and
//! outputs, and operations with their arguments.
//!
//! Built from Core ML's protobuf (`coreml-proto`'s prost types). Only static
//! tensor types are accepted; every count, rank and size is bounded so that a
//! hostile file cannot ask for an unbounded allocation.

use std::collections::BTreeMap;

use coreml_proto::proto::mil_spec;
use coreml_proto::proto::{self, model};

use crate::error::{PackageError, ProgramError};

/// Upper bounds on what a program may declare.
pub mod limits {
    /// Operations per function.
    pub const MAX_OPS: usize = 1 << 20;
    /// Tensor rank.
    pub const MAX_RANK: usize = 8;
    /// Elements in one tensor (2^31).
    pub const MAX_ELEMENTS: u64 = 1 << 31;
}

/// Element types of program values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bool,
    Str,
    F16,
    F32,
    F64,
    Bf16,
    I4,
    I8,
    I16,
    I32,
    I64,
    U1,
    U2,
    U3,
    U4,
    U6,
    U8,
    U16,
    U32,
    U64,
}

impl DType {
    fn from_proto(code: i32) -> Option<DType> {
        use mil_spec::DataType as P;
        let p = P::try_from(code).ok()?;
        Some(match p {
            P::Bool => DType::Bool,
            P::String => DType::Str,
            P::Float16 => DType::F16,
            P::Float32 => DType::F32,
            P::Float64 => DType::F64,
            P::Bfloat16 => DType::Bf16,
            P::Int4 => DType::I4,
            P::Int8 => DType::I8,
            P::Int16 => DType::I16,
            P::Int32 => DType::I32,
            P::Int64 => DType::I64,
            P::Uint1 => DType::U1,
            P::Uint2 => DType::U2,
            P::Uint3 => DType::U3,
            P::Uint4 => DType::U4,
            P::Uint6 => DType::U6,
            P::Uint8 => DType::U8,
            P::Uint16 => DType::U16,
            P::Uint32 => DType::U32,
            P::Uint64 => DType::U64,
            _ => return None,
        })
    }

    /// Whether values of this type are floating point.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::F32 | DType::F64 | DType::Bf16)
    }
}

/// A static tensor type.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A named, typed value (function input or op output).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Named {
    pub name: String,
    pub ty: TensorType,
}

/// Host data of an immediate value.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    /// Raw bytes (fp16 and sub-byte immediates are stored this way).
    Bytes(Vec<u8>),
}

/// A constant: inline data, or a reference into the weight file.
#[derive(Clone, Debug)]
pub enum Value {
    Immediate {
        ty: TensorType,
        data: HostData,
    },
    Blob {
        ty: TensorType,
        file: String,
        offset: u64,
    },
}

impl Value {
    pub fn ty(&self) -> &TensorType {
        match self {
            Value::Immediate { ty, .. } | Value::Blob { ty, .. } => ty,
        }
    }
}

/// An argument: a variable by name, or a constant.
#[derive(Clone, Debug)]
pub enum Arg {
    Var(String),
    Const(Value),
}

/// An op's inputs or attributes: a few entries by name, in name order.
///
/// A vector of exactly its entries rather than a `BTreeMap`, whose every
/// node holds room for eleven: an op has one to five, and a 2B tower's two
/// functions have about 60,000 ops, whose parsed form is held while the
/// package is open (by `exec`, the gate and `ane-run`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fields<V>(Vec<(String, V)>);

impl<V> Fields<V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Set `key` (kept in name order); the value it had, if any.
    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        match self.0.binary_search_by(|(k, _)| k.as_str().cmp(&key)) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<V> FromIterator<(String, V)> for Fields<V> {
    /// The entries in name order, the last of equal names kept (as a map's
    /// inserts would), holding no spare capacity.
    fn from_iter<I: IntoIterator<Item = (String, V)>>(entries: I) -> Self {
        let mut f = Fields(Vec::new());
        for (k, v) in entries {
            f.insert(k, v);
        }
        f.0.shrink_to_fit();
        f
    }
}

impl<V> std::ops::Index<&str> for Fields<V> {
    type Output = V;

    /// The entry named `key`; panics without one, as a map's index does.
    fn index(&self, key: &str) -> &V {
        self.get(key)
            .unwrap_or_else(|| panic!("no entry named `{key}`"))
    }
}

impl<'a, V> IntoIterator for &'a Fields<V> {
    type Item = (&'a String, &'a V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, V)>,
        fn(&'a (String, V)) -> (&'a String, &'a V),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

/// One operation.
#[derive(Clone, Debug)]
pub struct Op {
    pub kind: String,
    pub inputs: Fields<Vec<Arg>>,
    pub outputs: Vec<Named>,
    pub attributes: Fields<Value>,
}

impl Op {
    /// The name used in messages: the first output's name.
    pub fn label(&self) -> &str {
        self.outputs
            .first()
            .map_or("<no output>", |o| o.name.as_str())
    }
}

/// One function of the program.
#[derive(Clone, Debug)]
pub struct Function {
    pub name: String,
    pub opset: String,
    pub inputs: Vec<Named>,
    pub ops: Vec<Op>,
    pub outputs: Vec<Named>,
}

/// Model-level description: metadata and the default function.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Description {
    pub default_function: String,
    pub author: String,
    pub license: String,
    pub version: String,
    pub short_description: String,
    pub user_defined: BTreeMap<String, String>,
}

/// A parsed ML program.
#[derive(Clone, Debug)]
pub struct Program {
    pub specification_version: i32,
    pub functions: BTreeMap<String, Function>,
    pub description: Description,
}

impl Program {
    /// The function to run by default: the named one, else the model's
    /// default, else the only one.
    pub fn select(&self, name: Option<&str>) -> Result<&Function, PackageError> {
        let names = || self.functions.keys().cloned().collect::<Vec<_>>();
        match name {
            Some(n) => self
                .functions
                .get(n)
                .ok_or_else(|| PackageError::NoSuchFunction {
                    name: n.to_string(),
                    available: names(),
                }),
            None => {
                if let Some(f) = self.functions.get(&self.description.default_function) {
                    return Ok(f);
                }
                if self.functions.len() == 1 {
                    return Ok(self.functions.values().next().expect("one function"));
                }
                Err(PackageError::SeveralFunctions { available: names() })
            }
        }
    }

    /// [`Program::select`] with its error as a message, for the callers
    /// that still take one (`build`, the gates; they move to `select` when
    /// their own errors are typed).
    pub fn function(&self, name: Option<&str>) -> Result<&Function, String> {
        self.select(name).map_err(|e| e.to_string())
    }
}

/// Decode `model.mlmodel` bytes into a validated [`Program`].
pub fn parse_model(bytes: &[u8]) -> Result<Program, PackageError> {
    use prost::Message;
    let m = proto::Model::decode(bytes).map_err(PackageError::NotAModel)?;
    let Some(model::Type::MlProgram(p)) = m.r#type else {
        return Err(PackageError::NotAnMlProgram);
    };
    let mut description = Description::default();
    if let Some(d) = &m.description {
        description.default_function = d.default_function_name.clone();
        if let Some(md) = &d.metadata {
            description.author = md.author.clone();
            description.license = md.license.clone();
            description.version = md.version_string.clone();
            description.short_description = md.short_description.clone();
            description.user_defined = md
                .user_defined
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
        }
    }
    if p.functions.is_empty() {
        return Err(PackageError::NoFunctions);
    }
    let mut functions = BTreeMap::new();
    for (name, f) in &p.functions {
        functions.insert(name.clone(), function(name, f)?);
    }
    Ok(Program {
        specification_version: m.specification_version,
        functions,
        description,
    })
}

/// A failure inside an op: where in the op (an output or attribute; `None`
/// for its inputs), and what.
type OpError = (Option<String>, ProgramError);

fn function(name: &str, f: &mil_spec::Function) -> Result<Function, PackageError> {
    let at = |at: Vec<String>, problem| PackageError::program(name, at, problem);
    let block = f
        .block_specializations
        .get(&f.opset)
        .ok_or_else(|| at(vec![], ProgramError::NoBlock(f.opset.clone())))?;
    if block.operations.len() > limits::MAX_OPS {
        return Err(at(
            vec![],
            ProgramError::TooManyOps {
                ops: block.operations.len(),
                limit: limits::MAX_OPS,
            },
        ));
    }
    let inputs = f
        .inputs
        .iter()
        .map(|i| named(i).map_err(|e| at(vec![format!("input `{}`", i.name)], e)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut types: BTreeMap<&str, &TensorType> = BTreeMap::new();
    let mut ops = Vec::with_capacity(block.operations.len());
    for (i, o) in block.operations.iter().enumerate() {
        ops.push(operation(o).map_err(|(inner, e)| {
            let mut path = vec![format!("op #{i} ({})", o.r#type)];
            path.extend(inner);
            at(path, e)
        })?);
    }
    for i in &inputs {
        types.insert(&i.name, &i.ty);
    }
    for o in &ops {
        for out in &o.outputs {
            types.insert(&out.name, &out.ty);
        }
    }
    let outputs = block
        .outputs
        .iter()
        .map(|n| {
            types
                .get(n.as_str())
                .map(|t| Named {
                    name: n.clone(),
                    ty: (*t).clone(),
                })
                .ok_or_else(|| at(vec![], ProgramError::NoProducer(n.clone())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Function {
        name: name.to_string(),
        opset: f.opset.clone(),
        inputs,
        ops,
        outputs,
    })
}

fn operation(o: &mil_spec::Operation) -> Result<Op, OpError> {
    if !o.blocks.is_empty() {
        return Err((None, ProgramError::ControlFlow));
    }
    let inputs = o
        .inputs
        .iter()
        .map(|(k, a)| {
            let args = a
                .arguments
                .iter()
                .map(|b| match &b.binding {
                    Some(mil_spec::argument::binding::Binding::Name(n)) => Ok(Arg::Var(n.clone())),
                    Some(mil_spec::argument::binding::Binding::Value(v)) => {
                        value(v).map(Arg::Const)
                    }
                    None => Err(ProgramError::EmptyBinding(k.clone())),
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| (None, e))?;
            Ok((k.clone(), args))
        })
        .collect::<Result<Fields<_>, OpError>>()?;
    let outputs = o
        .outputs
        .iter()
        .map(|n| named(n).map_err(|e| (Some(format!("output `{}`", n.name)), e)))
        .collect::<Result<Vec<_>, _>>()?;
    // `name` and similar string attributes are kept like any other value.
    let attributes = o
        .attributes
        .iter()
        .map(|(k, v)| {
            Ok((
                k.clone(),
                value(v).map_err(|e| (Some(format!("attribute `{k}`")), e))?,
            ))
        })
        .collect::<Result<Fields<_>, OpError>>()?;
    Ok(Op {
        kind: o.r#type.clone(),
        inputs,
        outputs,
        attributes,
    })
}

fn named(n: &mil_spec::NamedValueType) -> Result<Named, ProgramError> {
    let t = n.r#type.as_ref().ok_or(ProgramError::MissingType)?;
    Ok(Named {
        name: n.name.clone(),
        ty: value_type(t)?,
    })
}

fn value_type(t: &mil_spec::ValueType) -> Result<TensorType, ProgramError> {
    match &t.r#type {
        Some(mil_spec::value_type::Type::TensorType(tt)) => tensor_type(tt),
        _ => Err(ProgramError::NotATensorType),
    }
}

fn tensor_type(tt: &mil_spec::TensorType) -> Result<TensorType, ProgramError> {
    let dtype =
        DType::from_proto(tt.data_type).ok_or(ProgramError::UnknownDataType(tt.data_type))?;
    if tt.dimensions.len() > limits::MAX_RANK {
        return Err(ProgramError::RankTooHigh {
            rank: tt.dimensions.len(),
            limit: limits::MAX_RANK,
        });
    }
    let mut shape = Vec::with_capacity(tt.dimensions.len());
    let mut elements = 1u64;
    for d in &tt.dimensions {
        match &d.dimension {
            Some(mil_spec::dimension::Dimension::Constant(c)) => {
                elements = elements.saturating_mul(c.size);
                shape.push(usize::try_from(c.size).map_err(|_| ProgramError::DimensionOutOfRange)?);
            }
            _ => return Err(ProgramError::DynamicShape),
        }
    }
    if elements > limits::MAX_ELEMENTS {
        return Err(ProgramError::TooManyElements {
            elements,
            limit: limits::MAX_ELEMENTS,
        });
    }
    Ok(TensorType { dtype, shape })
}

fn value(v: &mil_spec::Value) -> Result<Value, ProgramError> {
    let ty = value_type(v.r#type.as_ref().ok_or(ProgramError::ValueWithoutType)?)?;
    match &v.value {
        Some(mil_spec::value::Value::BlobFileValue(b)) => Ok(Value::Blob {
            ty,
            file: b.file_name.clone(),
            offset: b.offset,
        }),
        Some(mil_spec::value::Value::ImmediateValue(iv)) => {
            use mil_spec::tensor_value::Value as T;
            let Some(mil_spec::value::immediate_value::Value::Tensor(tv)) = &iv.value else {
                return Err(ProgramError::NotATensorImmediate);
            };
            let n = ty.elements();
            let data = match &tv.value {
                Some(T::Floats(f)) => HostData::F32(f.values.clone()),
                Some(T::Doubles(f)) => HostData::F64(f.values.clone()),
                Some(T::Ints(i)) => HostData::I64(i.values.iter().map(|&v| i64::from(v)).collect()),
                Some(T::LongInts(i)) => HostData::I64(i.values.clone()),
                Some(T::Bools(b)) => HostData::Bool(b.values.clone()),
                Some(T::Strings(s)) => HostData::Str(s.values.clone()),
                Some(T::Bytes(b)) => HostData::Bytes(b.values.clone()),
                None => return Err(ProgramError::ImmediateWithoutData),
            };
            let len = match &data {
                HostData::F32(v) => v.len(),
                HostData::F64(v) => v.len(),
                HostData::I64(v) => v.len(),
                HostData::Bool(v) => v.len(),
                HostData::Str(v) => v.len(),
                HostData::Bytes(v) => {
                    let bits = match ty.dtype {
                        DType::F16 | DType::Bf16 | DType::I16 | DType::U16 => 16,
                        DType::I8 | DType::U8 => 8,
                        DType::I4 | DType::U4 => 4,
                        DType::U1 => 1,
                        DType::U2 => 2,
                        DType::U3 => 3,
                        DType::U6 => 6,
                        DType::F32 | DType::I32 | DType::U32 => 32,
                        _ => 64,
                    };
                    if v.len() * 8 < n * bits {
                        return Err(ProgramError::TooFewBytes {
                            bytes: v.len(),
                            n,
                            dtype: format!("{:?}", ty.dtype),
                        });
                    }
                    n
                }
            };
            if len != n {
                return Err(ProgramError::ValueCount {
                    len,
                    shape: ty.shape.clone(),
                });
            }
            Ok(Value::Immediate { ty, data })
        }
        None => Err(ProgramError::ValueWithoutData),
    }
}

#[cfg(test)]
mod fields_tests {
    use super::Fields;

    #[test]
    fn fields_behave_as_a_map_in_name_order() {
        let mut f: Fields<u32> = [("y".to_string(), 1), ("x".into(), 2), ("y".into(), 3)]
            .into_iter()
            .collect();
        // The last of equal names is kept; entries are in name order.
        assert_eq!(
            f.iter().collect::<Vec<_>>(),
            [(&"x".to_string(), &2), (&"y".to_string(), &3)]
        );
        assert_eq!(f.get("y"), Some(&3));
        assert_eq!(f.get("z"), None);
        assert!(f.contains_key("x") && !f.contains_key("w"));
        assert_eq!(f.insert("w".into(), 4), None);
        assert_eq!(f.insert("x".into(), 5), Some(2));
        assert_eq!(f.values().copied().collect::<Vec<_>>(), [4, 5, 3]);
        assert_eq!(
            (&f).into_iter()
                .map(|(k, _)| k.as_str())
                .collect::<String>(),
            "wxy"
        );
        assert_eq!((f.len(), f["w"]), (3, 4));
        assert!(Fields::<u32>::default().is_empty());
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;
    use prost::Message;

    /// The golden attention block's model protobuf.
    fn golden() -> proto::Model {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("golden/mil/attention_block/model.mlpackage/Data/com.apple.CoreML/model.mlmodel");
        proto::Model::decode(std::fs::read(p).unwrap().as_slice()).unwrap()
    }

    fn main_function(m: &mut proto::Model) -> &mut mil_spec::Function {
        match m.r#type.as_mut() {
            Some(model::Type::MlProgram(p)) => p.functions.get_mut("main").unwrap(),
            _ => panic!("not an ML program"),
        }
    }

    fn tensor(t: &mut Option<mil_spec::ValueType>) -> &mut mil_spec::TensorType {
        match t.as_mut().and_then(|v| v.r#type.as_mut()) {
            Some(mil_spec::value_type::Type::TensorType(tt)) => tt,
            _ => panic!("not a tensor type"),
        }
    }

    #[test]
    fn refusals_are_typed_and_say_where() {
        let good = golden();
        let p = parse_model(&good.encode_to_vec()).unwrap();
        assert_eq!(p.select(None).unwrap().name, "main");
        let e = p.select(Some("b4096")).unwrap_err();
        assert!(
            matches!(&e, PackageError::NoSuchFunction { name, available }
                if name == "b4096" && available == &["main"]),
            "{e:?}"
        );
        assert_eq!(p.function(Some("b4096")).unwrap_err(), e.to_string());

        assert!(matches!(
            parse_model(b"\xff\xff\xff"),
            Err(PackageError::NotAModel(_))
        ));
        let mut m = good.clone();
        m.r#type = None;
        assert!(matches!(
            parse_model(&m.encode_to_vec()),
            Err(PackageError::NotAnMlProgram)
        ));

        // A dynamic dimension on an input: the function and the input named.
        let mut m = good.clone();
        let input = &mut main_function(&mut m).inputs[0];
        let name = input.name.clone();
        tensor(&mut input.r#type).dimensions[0].dimension =
            Some(mil_spec::dimension::Dimension::Unknown(
                mil_spec::dimension::UnknownDimension { variadic: false },
            ));
        let e = parse_model(&m.encode_to_vec()).unwrap_err();
        assert!(
            matches!(&e, PackageError::Program { function, at, problem: ProgramError::DynamicShape }
                if function == "main" && at == &[format!("input `{name}`")]),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "function `main`: input `{name}`: dynamic dimensions are not supported (static shapes only)"
            )
        );

        // An unknown data type on an op's output: the op and the output named.
        let mut m = good;
        let f = main_function(&mut m);
        let op = &mut f
            .block_specializations
            .get_mut(&f.opset)
            .unwrap()
            .operations[0];
        let (kind, out) = (op.r#type.clone(), op.outputs[0].name.clone());
        tensor(&mut op.outputs[0].r#type).data_type = 9999;
        let e = parse_model(&m.encode_to_vec()).unwrap_err();
        assert!(
            matches!(&e, PackageError::Program { at, problem: ProgramError::UnknownDataType(9999), .. }
                if at == &[format!("op #0 ({kind})"), format!("output `{out}`")]),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("function `main`: op #0 ({kind}): output `{out}`: unknown data type 9999")
        );
    }
}
