//! ModernBERT's host inputs of one call (see [`crate::family::text`]); its
//! tensors in the ANE layout are in [`super::layout`].
//!
//! A bucket is N tokens; a call is one text padded at the end. ModernBERT
//! has no position table (rotary, whose tables the builder makes per
//! bucket: a call's positions are always `0..N`), so the host gives the
//! program each token's row of `tok_embeddings` (`tok_embeddings` in
//! `host.safetensors`), before the embedding norm:
//! * `embeddings [1, D, 1, N]`, pad columns 0;
//! * `mask [1, 1, N]`: 0 for the real tokens, -1e4 for the pad columns.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::family::NamedShape;
use crate::family::modernbert::ModernBertConfig;
use crate::host::{HostError, HostInputs, HostTable, HostTables};
use crate::preprocess::TokenBatch;

pub fn table_shapes(c: &ModernBertConfig) -> Vec<NamedShape> {
    vec![("tok_embeddings".into(), vec![c.vocab_size, c.hidden_size])]
}

pub fn read_tables(c: &ModernBertConfig, ck: &Checkpoint) -> Result<Vec<HostTable>> {
    let shape = vec![c.vocab_size, c.hidden_size];
    let v = ck
        .tensor("embeddings.tok_embeddings.weight", &shape)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok(vec![("tok_embeddings".into(), shape, v)])
}

pub fn input_shapes(c: &ModernBertConfig, n: usize) -> Vec<NamedShape> {
    vec![
        ("embeddings".into(), vec![1, c.hidden_size, 1, n]),
        ("mask".into(), vec![1, 1, n]),
    ]
}

/// The inputs of one text in a bucket of `bucket` tokens.
pub fn inputs(
    c: &ModernBertConfig,
    tables: &HostTables,
    t: &TokenBatch,
    bucket: usize,
) -> std::result::Result<HostInputs, HostError> {
    let d = c.hidden_size;
    let tok = tables.get("tok_embeddings")?;
    crate::family::text::token_inputs(d, t, bucket, |j, id, _, out| {
        let id = id as usize;
        if id >= c.vocab_size {
            return Err(HostError::Batch(format!(
                "token {j}: id {id} is not below vocab_size {}",
                c.vocab_size
            )));
        }
        out.copy_from_slice(&tok[id * d..][..d]);
        Ok(())
    })
}
