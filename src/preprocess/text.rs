//! Text preprocessing for the text encoders: the checkpoint's own
//! `tokenizer.json`, run by the `tokenizers` crate (the library
//! transformers' fast tokenizers wrap), as transformers' `tokenizer(text,
//! truncation=True, max_length=L)` does: the special tokens the file's
//! post-processor adds, the sequence truncated from the right so that it
//! and its special tokens fit `L` (the special tokens kept), token type ids
//! as the post-processor assigns them. Checked against transformers' ids on
//! varied texts (`golden/text/tokens`, `tests/it/text.rs`).
//!
//! The file's own `padding` and `truncation` sections are ignored: the
//! bucket decides both.

use std::path::{Path, PathBuf};

use tokenizers::{PostProcessor, Tokenizer, TruncationDirection};

use crate::error::{Error, Result};

/// One text's tokens as a call takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBatch {
    /// The token ids, special tokens included, at most the bucket's length.
    pub ids: Vec<u32>,
    /// The token type ids (all 0 for one sequence).
    pub type_ids: Vec<u32>,
    /// The length before truncation (special tokens included); more than
    /// `ids.len()` when the text was truncated.
    pub full_len: usize,
}

impl TokenBatch {
    /// Real tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether tokens were cut to fit.
    pub fn truncated(&self) -> bool {
        self.full_len > self.ids.len()
    }
}

/// A checkpoint's (or an artifact's) tokenizer.
#[derive(Clone)]
pub struct TextProcessor {
    tokenizer: Tokenizer,
    /// The file, for messages.
    pub path: PathBuf,
}

impl std::fmt::Debug for TextProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TextProcessor({})", self.path.display())
    }
}

impl TextProcessor {
    /// `tokenizer.json` of a checkpoint directory, or an error naming it.
    pub fn open_dir(dir: &Path) -> Result<TextProcessor> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::checkpoint(
                dir,
                "no tokenizer: a text encoder needs tokenizer.json (transformers' fast tokenizer file) \
                 beside config.json",
            ));
        }
        TextProcessor::open(&path)
    }

    /// A `tokenizer.json` file.
    pub fn open(path: &Path) -> Result<TextProcessor> {
        let mut tokenizer = Tokenizer::from_file(path)
            .map_err(|e| Error::config(path, format!("not a tokenizers file: {e}")))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| Error::config(path, e.to_string()))?;
        Ok(TextProcessor {
            tokenizer,
            path: path.to_path_buf(),
        })
    }

    /// The tokens of `text` truncated to at most `max_len` (special tokens
    /// included), as transformers' `truncation=True, max_length=max_len`:
    /// the text encoded once without special tokens, cut from the right to
    /// leave room for those the post-processor adds, then post-processed
    /// (what the `tokenizers` crate's own truncation does, without a
    /// tokenizer configured per length).
    pub fn encode(&self, text: &str, max_len: usize) -> Result<TokenBatch> {
        let failed =
            |e: tokenizers::Error| Error::config(&self.path, format!("tokenizing failed: {e}"));
        let mut enc = self.tokenizer.encode(text, false).map_err(failed)?;
        let added = self
            .tokenizer
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false));
        let full_len = enc.len() + added;
        if full_len > max_len {
            if added >= max_len {
                return Err(Error::config(
                    &self.path,
                    format!(
                        "cannot truncate to {max_len} tokens: the special tokens alone take {added}"
                    ),
                ));
            }
            enc.truncate(max_len - added, 0, TruncationDirection::Right);
        }
        let enc = self
            .tokenizer
            .post_process(enc, None, true)
            .map_err(failed)?;
        Ok(TokenBatch {
            ids: enc.get_ids().to_vec(),
            type_ids: enc.get_type_ids().to_vec(),
            full_len,
        })
    }

    /// The id of a token, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// The size of the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }
}
