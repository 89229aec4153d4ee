//! The BERT family's host inputs of one call (see [`crate::host`] for what
//! all families share); its tensors in the ANE layout are in
//! [`super::layout`].
//!
//! A bucket is N tokens; a call is one text of at most N tokens (special
//! tokens included), padded at the end. The host looks up and sums its
//! embedding rows, which keeps the vocabulary's table (the largest tensor
//! of an XLM-R checkpoint) out of the program and a gather off the Neural
//! Engine (ANE-RULES R8). The inputs:
//! * `embeddings [1, D, 1, N]`: per real token j `word[id_j] +
//!   position[offset + j] + token_type[type_j]` from the checkpoint's tables
//!   (`word_embeddings`, `position_embeddings`, `token_type_embeddings` in
//!   `host.safetensors`), channels first; pad columns 0;
//! * `mask [1, 1, N]`: the additive key mask, 0 for the real tokens and
//!   -1e4 for the pad columns (never -inf: ANE-RULES R5), the same for
//!   every query.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::family::NamedShape;
use crate::family::bert::BertConfig;
use crate::host::{HostError, HostInputs, HostTable, HostTables};
use crate::preprocess::TokenBatch;

/// The tables: (name in `host.safetensors`, checkpoint tensor, rows).
fn tables(c: &BertConfig) -> [(&'static str, &'static str, usize); 3] {
    [
        (
            "word_embeddings",
            "embeddings.word_embeddings.weight",
            c.vocab_size,
        ),
        (
            "position_embeddings",
            "embeddings.position_embeddings.weight",
            c.max_position_embeddings,
        ),
        (
            "token_type_embeddings",
            "embeddings.token_type_embeddings.weight",
            c.type_vocab_size,
        ),
    ]
}

pub fn table_shapes(c: &BertConfig) -> Vec<NamedShape> {
    tables(c)
        .iter()
        .map(|(n, _, rows)| (n.to_string(), vec![*rows, c.hidden_size]))
        .collect()
}

pub fn read_tables(c: &BertConfig, ck: &Checkpoint) -> Result<Vec<HostTable>> {
    tables(c)
        .iter()
        .map(|(n, t, rows)| {
            let shape = vec![*rows, c.hidden_size];
            let v = ck.tensor(t, &shape)?.flatten_all()?.to_vec1::<f32>()?;
            Ok((n.to_string(), shape, v))
        })
        .collect()
}

pub fn input_shapes(c: &BertConfig, n: usize) -> Vec<NamedShape> {
    vec![
        ("embeddings".into(), vec![1, c.hidden_size, 1, n]),
        ("mask".into(), vec![1, 1, n]),
    ]
}

/// The inputs of one text in a bucket of `bucket` tokens
/// ([`crate::family::text::token_inputs`]): each real token's word,
/// position and token type rows summed.
pub fn inputs(
    c: &BertConfig,
    tables: &HostTables,
    t: &TokenBatch,
    bucket: usize,
) -> std::result::Result<HostInputs, HostError> {
    let d = c.hidden_size;
    if c.position_offset + t.len() > c.max_position_embeddings {
        return Err(HostError::Batch(format!(
            "{} tokens: the position table holds {}",
            t.len(),
            c.max_tokens()
        )));
    }
    let word = tables.get("word_embeddings")?;
    let position = tables.get("position_embeddings")?;
    let token_type = tables.get("token_type_embeddings")?;
    crate::family::text::token_inputs(d, t, bucket, |j, id, ty, out| {
        let (id, ty) = (id as usize, ty as usize);
        if id >= c.vocab_size || ty >= c.type_vocab_size {
            return Err(HostError::Batch(format!(
                "token {j}: id {id} (vocab_size {}) or type id {ty} (type_vocab_size {}) out of range",
                c.vocab_size, c.type_vocab_size
            )));
        }
        let w = &word[id * d..][..d];
        let p = &position[(c.position_offset + j) * d..][..d];
        let y = &token_type[ty * d..][..d];
        for (k, o) in out.iter_mut().enumerate() {
            *o = w[k] + p[k] + y[k];
        }
        Ok(())
    })
}
