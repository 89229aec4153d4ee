//! What the text encoders' families share: the sentence-transformers
//! configuration of a checkpoint directory (its pooling, its
//! `max_seq_length`), and the host inputs of one text (embedding rows and
//! the additive key mask).

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::family::{SentenceMode, SentencePooling};
use crate::host::{HostError, HostInputs};
use crate::preprocess::TokenBatch;

/// The smallest LayerNorm epsilon the text encoders' programs carry (the
/// builders' `MIN_LN_EPS`): BERT's 1e-12 is 0 in fp16, where a LayerNorm of
/// a constant column divides by zero (ANE-RULES R5); 1e-7, as Apple's ANE
/// port of DistilBERT uses (ml-ane-transformers, `huggingface/distilbert.py`).
pub const MIN_PROGRAM_EPS: f64 = 1e-7;

/// The additive mask of a pad column (the builders' `MASK_VALUE`; never
/// -inf: ANE-RULES R5).
pub const MASK_VALUE: f32 = -1e4;

/// The inputs of one text in a bucket of `bucket` tokens, for a family
/// whose host gives the program each token's embedding row: `embeddings
/// [1, D, 1, N]` (column j the row `row(j, id_j, type_j)` writes into its
/// `D` values, pad columns 0) and `mask [1, 1, N]` (0 for the real tokens,
/// [`MASK_VALUE`] for the pad columns, the same for every query). `row`
/// says why a token cannot be embedded.
pub fn token_inputs(
    d: usize,
    t: &TokenBatch,
    bucket: usize,
    mut row: impl FnMut(usize, u32, u32, &mut [f32]) -> std::result::Result<(), HostError>,
) -> std::result::Result<HostInputs, HostError> {
    let n = t.len();
    if n == 0 || n > bucket || t.type_ids.len() != n {
        return Err(HostError::Batch(format!(
            "a bucket of {bucket} tokens takes one text of 1 to {bucket} tokens (and as many token \
             type ids), got {n} tokens and {} type ids",
            t.type_ids.len()
        )));
    }
    let mut emb = vec![0f32; d * bucket];
    let mut r = vec![0f32; d];
    for (j, (&id, &ty)) in t.ids.iter().zip(&t.type_ids).enumerate() {
        row(j, id, ty, &mut r)?;
        for (k, v) in r.iter().enumerate() {
            emb[k * bucket + j] = *v;
        }
    }
    let mask: Vec<f32> = (0..bucket)
        .map(|j| if j < n { 0.0 } else { MASK_VALUE })
        .collect();
    Ok(HostInputs {
        tensors: vec![
            ("embeddings".into(), vec![1, d, 1, bucket], emb),
            ("mask".into(), vec![1, 1, bucket], mask),
        ],
        real: n,
        bucket,
        slots: None,
    })
}

/// The sentence embedding a checkpoint directory's sentence-transformers
/// configuration asks for: `modules.json` lists a `Pooling` module (its
/// `config.json` in the module's `path`: `pooling_mode_mean_tokens` or
/// `pooling_mode_cls_token`) and perhaps a `Normalize` one. `None` without
/// `modules.json`; an error for a pooling this version does not compute
/// (max, weighted mean, last token) or a module it does not know after the
/// pooling (a `Dense` projection), rather than an embedding other than the
/// one the checkpoint's users get.
pub fn sentence_pooling(dir: &Path) -> Result<Option<SentencePooling>> {
    let modules = dir.join("modules.json");
    if !modules.is_file() {
        return Ok(None);
    }
    let read = |p: &Path| -> Result<Value> {
        let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
        serde_json::from_str(&text).map_err(|e| Error::config(p, format!("not JSON: {e}")))
    };
    let list = read(&modules)?;
    let Some(list) = list.as_array() else {
        return Err(Error::config(&modules, "expected a list of modules"));
    };
    let mut pooling = None;
    let mut normalize = false;
    for (i, m) in list.iter().enumerate() {
        let kind = m["type"].as_str().unwrap_or("");
        let kind = kind.rsplit('.').next().unwrap_or(kind);
        match kind {
            "Transformer" => {}
            "Pooling" => {
                let path = m["path"].as_str().unwrap_or("");
                let cfg_path = dir.join(path).join("config.json");
                let cfg = read(&cfg_path)?;
                let on = |k: &str| cfg[k].as_bool() == Some(true);
                let modes = [
                    "pooling_mode_max_tokens",
                    "pooling_mode_mean_sqrt_len_tokens",
                    "pooling_mode_weightedmean_tokens",
                    "pooling_mode_lasttoken",
                ];
                if let Some(k) = modes.iter().find(|k| on(k)) {
                    return Err(Error::config(
                        &cfg_path,
                        format!(
                            "`{k}`: only mean (pooling_mode_mean_tokens) or CLS pooling is supported"
                        ),
                    ));
                }
                pooling = Some(
                    match (on("pooling_mode_mean_tokens"), on("pooling_mode_cls_token")) {
                        (true, false) => SentenceMode::Mean,
                        (false, true) => SentenceMode::Cls,
                        _ => {
                            return Err(Error::config(
                                &cfg_path,
                                "expected exactly one of pooling_mode_mean_tokens and pooling_mode_cls_token",
                            ));
                        }
                    },
                );
            }
            "Normalize" if pooling.is_some() => normalize = true,
            other => {
                return Err(Error::config(
                    &modules,
                    format!(
                        "module {i} `{other}`: the sentence embedding supports Transformer, Pooling and \
                         Normalize modules"
                    ),
                ));
            }
        }
    }
    Ok(pooling.map(|mode| SentencePooling { mode, normalize }))
}

/// `max_seq_length` of a checkpoint directory's `sentence_bert_config.json`,
/// if it has one.
pub fn max_seq_length(dir: &Path) -> Result<Option<usize>> {
    let p = dir.join("sentence_bert_config.json");
    if !p.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| Error::config(&p, format!("not JSON: {e}")))?;
    match v.get("max_seq_length") {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_u64() {
            Some(n) if n > 0 => Ok(Some(n as usize)),
            _ => Err(Error::config(
                &p,
                format!("field `max_seq_length`: expected a positive count, got {x}"),
            )),
        },
    }
}

/// [`crate::family::Tokens`] and [`crate::family::Host`] for a text
/// encoder's config whose folder's `host.rs` has `inputs`, `input_shapes`,
/// `table_shapes` and `read_tables`, and whose config has `max_tokens()`
/// and a `sentence` field: the host of every text encoder, which computes
/// nothing from a recipe.
macro_rules! text_encoder_host {
    ($config:ty) => {
        impl $crate::family::Tokens for $config {
            fn max_tokens(&self) -> usize {
                <$config>::max_tokens(self)
            }
            fn sentence_pooling(&self) -> Option<$crate::family::SentencePooling> {
                self.sentence
            }
            fn host_inputs(
                &self,
                _recipe: &$crate::host::HostRecipe,
                tables: &$crate::host::HostTables,
                batch: &$crate::preprocess::TokenBatch,
                bucket: usize,
            ) -> std::result::Result<$crate::host::HostInputs, $crate::host::HostError> {
                host::inputs(self, tables, batch, bucket)
            }
        }

        impl $crate::family::Host for $config {
            fn input_shapes(&self, tokens: usize) -> Vec<$crate::family::NamedShape> {
                host::input_shapes(self, tokens)
            }
            fn host_recipe(&self) -> $crate::host::HostRecipe {
                $crate::host::HostRecipe::default()
            }
            fn host_table_shapes(&self) -> Vec<$crate::family::NamedShape> {
                host::table_shapes(self)
            }
            fn host_tables(
                &self,
                ck: &$crate::checkpoint::Checkpoint,
            ) -> $crate::error::Result<Vec<$crate::host::HostTable>> {
                host::read_tables(self, ck)
            }
        }
    };
}
pub(crate) use text_encoder_host;

/// What every text encoder's config must satisfy besides its own fields:
/// heads that divide the width, a positive normalisation epsilon (`eps`:
/// its field and value), a pad token inside the vocabulary. The message
/// names the field.
pub fn check_text_encoder(
    (hidden, heads): (usize, usize),
    (eps_field, eps): (&str, f64),
    (pad, vocab): (usize, usize),
) -> std::result::Result<(), crate::error::FieldError> {
    use crate::error::FieldError;
    if !hidden.is_multiple_of(heads) {
        return Err(FieldError::invalid(
            "num_attention_heads",
            format!("{heads} does not divide hidden_size {hidden}"),
        ));
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Err(FieldError::range(eps_field, "a positive number", eps));
    }
    if pad >= vocab {
        return Err(FieldError::invalid(
            "pad_token_id",
            format!("{pad} is not below vocab_size {vocab}"),
        ));
    }
    Ok(())
}
