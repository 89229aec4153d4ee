//! What the families' vision configs share: the MLP activations, and a
//! reader of `config.json`'s `vision_config` whose errors name the field.
//! Each family's typed config lives in its own module beside this one.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::error::FieldError;
use crate::error::{Error, Result};

/// The MLP activation inside the vision blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Activation {
    /// `gelu_pytorch_tanh` / `gelu_new`: tanh approximation.
    GeluTanh,
    /// `gelu`: exact erf form.
    GeluErf,
    /// `quick_gelu`: `x * sigmoid(1.702 x)`.
    QuickGelu,
    /// `silu`: `x * sigmoid(x)`.
    Silu,
    /// `relu`: `max(x, 0)` (some BERT checkpoints).
    Relu,
}

impl Activation {
    /// transformers' name (`hidden_act`), as the Python builders take it.
    pub fn hf_name(self) -> &'static str {
        match self {
            Activation::GeluTanh => "gelu_pytorch_tanh",
            Activation::GeluErf => "gelu",
            Activation::QuickGelu => "quick_gelu",
            Activation::Silu => "silu",
            Activation::Relu => "relu",
        }
    }
}

/// The `vision_config` object of a `config.json`, read field by field; every
/// error names `vision_config.<field>` and the file.
pub struct VisionFields<'a> {
    path: &'a Path,
    vc: &'a Map<String, Value>,
    /// How messages name a field: `vision_config.` before its key, or
    /// nothing for a config that is the tower's alone ([`VisionFields::flat`]).
    prefix: &'static str,
}

impl<'a> VisionFields<'a> {
    pub fn of(path: &'a Path, v: &'a Value) -> Result<Self> {
        // A checkpoint of the tower alone (`model_type` `<family>_vision`,
        // or `<family>_vision_model`) is its vision config.
        let bare = v
            .get("model_type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with("_vision") || t.ends_with("_vision_model"));
        let vc = if bare {
            Some(v)
        } else {
            v.get("vision_config")
        }
        .and_then(Value::as_object)
        .ok_or_else(|| Error::field(path, FieldError::MissingObject("vision_config".into())))?;
        Ok(VisionFields {
            path,
            vc,
            prefix: "vision_config.",
        })
    }

    /// The fields of a config that is the vision model's own, top level
    /// (DINOv2's `config.json`); messages name the keys alone.
    pub fn flat(path: &'a Path, v: &'a Value) -> Result<Self> {
        let vc = v
            .as_object()
            .ok_or_else(|| Error::field(path, FieldError::NotAnObject))?;
        Ok(VisionFields {
            path,
            vc,
            prefix: "",
        })
    }

    /// The field `key` as messages name it.
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// An error about this file.
    fn err(&self, e: FieldError) -> Error {
        Error::field(self.path, e)
    }

    /// The field `key` holds `x`, not `expected`.
    fn wrong_type(&self, key: &str, expected: &'static str, x: &Value) -> Error {
        self.err(FieldError::Type {
            field: self.name(key),
            expected,
            got: x.to_string(),
        })
    }

    /// A boolean; `default` when absent.
    pub fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.vc.get(key) {
            None => Ok(default),
            Some(x) => x
                .as_bool()
                .ok_or_else(|| self.wrong_type(key, "true or false", x)),
        }
    }

    pub fn path(&self) -> &Path {
        self.path
    }

    /// A non-negative integer; `default` when absent (`None`: required).
    pub fn uint(&self, key: &str, default: Option<usize>) -> Result<usize> {
        match self.vc.get(key) {
            Some(x) => x
                .as_u64()
                .map(|u| u as usize)
                .ok_or_else(|| self.wrong_type(key, "a non-negative integer", x)),
            None => default.ok_or_else(|| self.err(FieldError::Missing(self.name(key)))),
        }
    }

    /// A number; `default` when absent (`None`: required).
    pub fn number(&self, key: &str, default: Option<f64>) -> Result<f64> {
        match self.vc.get(key) {
            Some(x) => x
                .as_f64()
                .ok_or_else(|| self.wrong_type(key, "a number", x)),
            None => default.ok_or_else(|| self.err(FieldError::Missing(self.name(key)))),
        }
    }

    /// A list of block indexes; `default` when absent.
    pub fn indexes(&self, key: &str, default: &[usize]) -> Result<Vec<usize>> {
        match self.vc.get(key) {
            None => Ok(default.to_vec()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|u| u as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.err(FieldError::NotIndexes(self.name(key)))),
            Some(x) => Err(self.wrong_type(key, "a list", x)),
        }
    }

    /// `hidden_act` (default `default`), one of `allowed`.
    pub fn activation(&self, default: &str, allowed: &[Activation]) -> Result<Activation> {
        let name = self
            .vc
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or(default);
        let act = match name {
            "gelu_pytorch_tanh" | "gelu_new" => Some(Activation::GeluTanh),
            "gelu" => Some(Activation::GeluErf),
            "quick_gelu" => Some(Activation::QuickGelu),
            "silu" => Some(Activation::Silu),
            "relu" => Some(Activation::Relu),
            _ => None,
        };
        act.filter(|a| allowed.contains(a)).ok_or_else(|| {
            self.err(FieldError::Unsupported {
                field: self.name("hidden_act"),
                value: name.to_string(),
                expected: allowed
                    .iter()
                    .map(|a| a.hf_name())
                    .collect::<Vec<_>>()
                    .join(" or "),
            })
        })
    }

    /// The rotary base: `rope_parameters.rope_theta`, else `rope_theta`,
    /// else 10000.
    pub fn rope_theta(&self) -> Result<f64> {
        Ok(self
            .vc
            .get("rope_parameters")
            .and_then(|r| r.get("rope_theta"))
            .or_else(|| self.vc.get("rope_theta"))
            .map(|x| {
                x.as_f64().ok_or_else(|| {
                    self.err(FieldError::Type {
                        field: "vision_config.rope_theta".into(),
                        expected: "a number",
                        got: x.to_string(),
                    })
                })
            })
            .transpose()?
            .unwrap_or(10_000.0))
    }
}

/// What the plain ViT encoders' configs (CLIP, SigLIP, DINOv2) share:
/// positive sizes, RGB input, heads that divide the width, a positive
/// LayerNorm epsilon; the error names the field (after `prefix`,
/// `vision_config.` or nothing for a top-level config).
pub fn check_encoder(
    prefix: &str,
    sizes: &[(&str, usize)],
    (hidden, heads): (usize, usize),
    channels: usize,
    eps: f64,
) -> std::result::Result<(), FieldError> {
    check_sizes_in(prefix, sizes)?;
    if channels != 3 {
        return Err(FieldError::invalid(
            format!("{prefix}num_channels"),
            format!("only 3 (RGB) is supported, got {channels}"),
        ));
    }
    if !hidden.is_multiple_of(heads) {
        return Err(FieldError::invalid(
            format!("{prefix}num_attention_heads"),
            format!("{heads} does not divide hidden_size {hidden}"),
        ));
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Err(FieldError::range(
            format!("{prefix}layer_norm_eps"),
            "a positive number",
            eps,
        ));
    }
    Ok(())
}

/// What the Qwen-VL families' vision configs share, for [`check_vit`].
pub struct VitChecks<'a> {
    /// The field that holds the blocks' width (`hidden_size`, or Qwen2-VL's
    /// `embed_dim`), and its value.
    pub width: (&'a str, usize),
    pub num_heads: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    pub rope_theta: f64,
}

/// The checks the Qwen-VL families' vision configs share, after
/// [`check_sizes`]: three input channels; patch, temporal and merge sizes in
/// range; `num_heads` dividing the width into heads whose size is a multiple
/// of 4 (2-D rotary); a positive `rope_theta`. The error names the field.
pub fn check_vit(c: &VitChecks) -> std::result::Result<(), FieldError> {
    if c.in_channels != 3 {
        return Err(FieldError::range(
            "vision_config.in_channels",
            "3",
            c.in_channels,
        ));
    }
    if c.patch_size > 64 || c.temporal_patch_size > 16 || c.spatial_merge_size > 8 {
        return Err(FieldError::invalid(
            "vision_config",
            "patch, temporal or merge size out of range",
        ));
    }
    let (field, width) = c.width;
    if !width.is_multiple_of(c.num_heads) {
        return Err(FieldError::invalid(
            "vision_config.num_heads",
            format!("{} does not divide {field} {width}", c.num_heads),
        ));
    }
    if !(width / c.num_heads).is_multiple_of(4) {
        return Err(FieldError::invalid(
            "vision_config.num_heads",
            format!(
                "head_dim {} must be a multiple of 4 for 2D rotary embeddings",
                width / c.num_heads
            ),
        ));
    }
    if !(c.rope_theta.is_finite() && c.rope_theta > 0.0) {
        return Err(FieldError::range(
            "vision_config.rope_theta",
            "a positive number",
            c.rope_theta,
        ));
    }
    Ok(())
}

/// Every block index in `indexes` (field `vision_config.{field}`) below `depth`.
pub fn check_block_indexes(
    field: &str,
    indexes: &[usize],
    depth: usize,
) -> std::result::Result<(), FieldError> {
    match indexes.iter().find(|&&i| i >= depth) {
        Some(i) => Err(FieldError::invalid(
            format!("vision_config.{field}"),
            format!("block {i} does not exist (depth {depth})"),
        )),
        None => Ok(()),
    }
}

/// Each `(field, value)` in 1..=2^20; the error names the first that is not.
pub fn check_sizes(sizes: &[(&str, usize)]) -> std::result::Result<(), FieldError> {
    check_sizes_in("vision_config.", sizes)
}

/// [`check_sizes`] for fields named after `prefix`.
pub fn check_sizes_in(
    prefix: &str,
    sizes: &[(&str, usize)],
) -> std::result::Result<(), FieldError> {
    const MAX_DIM: usize = 1 << 20;
    for &(k, v) in sizes {
        if v == 0 || v > MAX_DIM {
            return Err(FieldError::range(
                format!("{prefix}{k}"),
                format!("1..={MAX_DIM}"),
                v,
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn readers_name_the_field() {
        let p = Path::new("config.json");
        let v = json!({"vision_config": {"depth": -1, "flag": 1, "act": "x", "hidden_act": "relu",
            "idx": [1, "a"], "list": 3}});
        let f = VisionFields::of(p, &v).unwrap();
        let field = |r: Result<usize>| match r {
            Err(Error::Field { path, error }) => {
                assert_eq!(path, p);
                error
            }
            other => panic!("{:?}", other.err()),
        };
        assert_eq!(
            field(f.uint("depth", None)),
            FieldError::Type {
                field: "vision_config.depth".into(),
                expected: "a non-negative integer",
                got: "-1".into()
            }
        );
        assert_eq!(
            field(f.uint("width", None)),
            FieldError::Missing("vision_config.width".into())
        );
        assert_eq!(f.uint("width", Some(7)).unwrap(), 7);
        let e = f.activation("gelu", &[Activation::GeluErf]).unwrap_err();
        assert!(
            matches!(&e, Error::Field { error: FieldError::Unsupported { field, value, .. }, .. }
                if field == "vision_config.hidden_act" && value == "relu"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "config.json: field `vision_config.hidden_act`: `relu` is not supported, expected gelu"
        );
        let e = f.indexes("idx", &[]).unwrap_err();
        assert!(
            matches!(&e, Error::Field { error: FieldError::NotIndexes(k), .. } if k == "vision_config.idx"),
            "{e:?}"
        );
        let e = f.indexes("list", &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "config.json: field `vision_config.list`: expected a list, got 3"
        );
        assert!(matches!(
            VisionFields::of(p, &json!({})),
            Err(Error::Field {
                error: FieldError::MissingObject(_),
                ..
            })
        ));
        assert!(matches!(
            VisionFields::flat(p, &json!([])),
            Err(Error::Field {
                error: FieldError::NotAnObject,
                ..
            })
        ));
    }

    #[test]
    fn checks_name_the_field() {
        let e = check_sizes(&[("depth", 4), ("hidden_size", 0)]).unwrap_err();
        assert_eq!(e.field(), Some("vision_config.hidden_size"));
        assert_eq!(
            e.to_string(),
            "field `vision_config.hidden_size`: expected 1..=1048576, got 0"
        );
        let e = check_encoder("", &[("hidden_size", 8)], (8, 3), 3, 1e-6).unwrap_err();
        assert!(
            matches!(&e, FieldError::Invalid { field, .. } if field == "num_attention_heads"),
            "{e:?}"
        );
        assert_eq!(
            check_encoder("vision_config.", &[], (8, 2), 4, 1e-6)
                .unwrap_err()
                .field(),
            Some("vision_config.num_channels")
        );
        assert_eq!(
            check_block_indexes("deepstack_visual_indexes", &[1, 9], 4)
                .unwrap_err()
                .to_string(),
            "field `vision_config.deepstack_visual_indexes`: block 9 does not exist (depth 4)"
        );
        let vit = VitChecks {
            width: ("embed_dim", 24),
            num_heads: 4,
            in_channels: 3,
            patch_size: 14,
            temporal_patch_size: 2,
            spatial_merge_size: 2,
            rope_theta: 10_000.0,
        };
        assert_eq!(
            check_vit(&vit).unwrap_err().to_string(),
            "field `vision_config.num_heads`: head_dim 6 must be a multiple of 4 for 2D rotary embeddings"
        );
        assert!(
            check_vit(&VitChecks {
                num_heads: 2,
                ..vit
            })
            .is_ok()
        );
        assert_eq!(
            check_vit(&VitChecks {
                num_heads: 2,
                rope_theta: 0.0,
                ..vit
            })
            .unwrap_err(),
            FieldError::Range {
                field: "vision_config.rope_theta".into(),
                expected: "a positive number".into(),
                got: "0".into()
            }
        );
    }
}
