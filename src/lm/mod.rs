//! The Qwen3-VL language model: answers a question about an image from the
//! tower's visual tokens (merged embeddings and deepstack features).
//!
//! [`Vlm::load`] opens a checkpoint's `config.json`, `tokenizer.json`,
//! optional `generation_config.json` and the decoder's weights
//! (`model.language_model.*`, `lm_head.weight` unless tied).
//! [`Vlm::answer`] builds the chat prompt for one image and one question,
//! replaces the image-pad tokens by the visual tokens, and decodes greedily
//! until a stop token or the token limit.
//!
//! The decoder is written here rather than taken from candle-transformers'
//! `qwen3_vl` module (0.11): that module's text side does not give image
//! tokens transformers' interleaved M-RoPE positions (t, row, col on the
//! merged grid, then text resuming after the image's largest side), so its
//! logits cannot match on a prompt with an image. The tests in
//! `tests/it/lm.rs` hold this decoder to transformers: the same prompt ids,
//! every prompt logit within 1e-4 (relative to the largest), and the same
//! greedy tokens, for the trained tiny VLM (tied embeddings, grouped K/V) and
//! a random model with an untied `lm_head`.

pub mod config;
pub mod model;

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Device, Tensor};
use serde::Serialize;

pub use config::{Decoder, TextConfig};
pub use model::{KvCache, TextModel, Visual, mrope_positions};

use crate::checkpoint::{WeightStore, read_json, weight_files};
use crate::error::{Error, LmError, Result};

/// Longest accepted question, in characters and in tokens.
pub const MAX_QUESTION_CHARS: usize = 2000;
pub const MAX_QUESTION_TOKENS: usize = 512;

/// The visual tokens of one image, as the tower produced them.
pub struct ImageFeatures {
    /// `[tokens, hidden]` f32: what replaces the image-pad tokens.
    pub embeds: Tensor,
    /// One `[tokens, hidden]` per deepstack output, in order.
    pub deepstack: Vec<Tensor>,
    /// Patch grid `(t, h, w)` before merging.
    pub grid_thw: [usize; 3],
}

/// Why decoding stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    StopToken,
    TokenLimit,
}

/// One generated answer.
#[derive(Clone, Debug, Serialize)]
pub struct Answer {
    pub text: String,
    /// Generated token ids, the stop token included when one was produced.
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    pub stop: Stop,
    pub prefill_s: f64,
    pub decode_s: f64,
}

/// A Qwen3-VL language model with its tokenizer.
pub struct Vlm {
    pub dir: PathBuf,
    pub model: TextModel,
    tokenizer: tokenizers::Tokenizer,
    stop_ids: Vec<u32>,
}

impl Vlm {
    /// Open the language model of the checkpoint in `dir`; `decoder` says
    /// which decoder a `model_type` has (its family's; an error for a family
    /// without a language model), given the path of `config.json`.
    pub fn load(dir: &Path, decoder: impl FnOnce(&Path, &str) -> Result<Decoder>) -> Result<Vlm> {
        let cfg_path = dir.join("config.json");
        if !cfg_path.is_file() {
            return Err(Error::checkpoint(
                dir,
                "config.json is missing: not a Hugging Face model directory",
            ));
        }
        let json = read_json(&cfg_path)?;
        let model_type = json
            .get("model_type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("");
        let cfg = TextConfig::from_json(&cfg_path, &json, decoder(&cfg_path, model_type)?)?;
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(Error::checkpoint(
                dir,
                "no tokenizer: expected tokenizer.json beside config.json",
            ));
        }
        let tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| Error::config(&tok_path, format!("not a tokenizers file: {e}")))?;
        let mut weights = WeightStore::open(&weight_files(dir)?)?;
        let Some(prefix) = model::PREFIXES
            .iter()
            .find(|p| weights.contains(&format!("{p}embed_tokens.weight")))
        else {
            return Err(Error::checkpoint(
                dir,
                "no language model: expected `model.language_model.embed_tokens.weight` \
                 (or `model.embed_tokens.weight`) and the decoder layers beside it",
            ));
        };
        let layers = format!("{prefix}layers.");
        let kept = [
            format!("{prefix}embed_tokens.weight"),
            format!("{prefix}norm.weight"),
        ];
        weights.retain(|n| {
            n.starts_with(&layers) || kept.iter().any(|k| k == n) || n == "lm_head.weight"
        });
        let model = TextModel::load(&cfg, &weights, prefix, dir)?;

        // Stop at <|im_end|>, <|endoftext|> and generation_config's eos ids.
        let mut stop_ids: Vec<u32> = ["<|im_end|>", "<|endoftext|>"]
            .iter()
            .filter_map(|t| tokenizer.token_to_id(t))
            .collect();
        let gen_path = dir.join("generation_config.json");
        if gen_path.is_file() {
            let g = read_json(&gen_path)?;
            match &g["eos_token_id"] {
                serde_json::Value::Number(n) => stop_ids.extend(n.as_u64().map(|n| n as u32)),
                serde_json::Value::Array(a) => {
                    stop_ids.extend(a.iter().filter_map(|n| n.as_u64().map(|n| n as u32)))
                }
                _ => {}
            }
        }
        stop_ids.sort();
        stop_ids.dedup();
        if stop_ids.is_empty() {
            return Err(Error::config(
                &tok_path,
                "no stop token: expected <|im_end|> in the vocabulary",
            ));
        }
        for (name, id) in [
            ("image_token_id", cfg.image_token_id),
            ("vision_start_token_id", cfg.vision_start_token_id),
            ("vision_end_token_id", cfg.vision_end_token_id),
        ] {
            if tokenizer.id_to_token(id).is_none() {
                return Err(Error::config(
                    &tok_path,
                    format!("config.json's {name} {id} is not in the tokenizer's vocabulary"),
                ));
            }
        }
        Ok(Vlm {
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            stop_ids,
        })
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode(text, false)
            .map_err(|e| LmError::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec())
    }

    /// The chat prompt for one image of `image_tokens` visual tokens and one
    /// question, ending with the assistant's turn:
    /// `<|im_start|>user\n<|vision_start|><|image_pad|>…<|vision_end|>{question}<|im_end|>\n<|im_start|>assistant\n`,
    /// after `<|im_start|>system\n{prompt}<|im_end|>\n` for families whose
    /// chat template adds a default system turn.
    pub fn prompt(&self, image_tokens: usize, question: &str) -> Result<Vec<u32>> {
        let q = question.trim();
        if q.is_empty() {
            return Err(LmError::EmptyQuestion.into());
        }
        if q.chars().count() > MAX_QUESTION_CHARS {
            return Err(LmError::QuestionChars {
                chars: q.chars().count(),
                max: MAX_QUESTION_CHARS,
            }
            .into());
        }
        let n = self.encode(q)?.len();
        if n > MAX_QUESTION_TOKENS {
            return Err(LmError::QuestionTokens {
                tokens: n,
                max: MAX_QUESTION_TOKENS,
            }
            .into());
        }
        let system = match self.model.cfg.decoder.system_prompt {
            Some(p) => format!("<|im_start|>system\n{p}<|im_end|>\n"),
            None => String::new(),
        };
        let mut ids = self.encode(&format!("{system}<|im_start|>user\n<|vision_start|>"))?;
        ids.extend(std::iter::repeat_n(
            self.model.cfg.image_token_id,
            image_tokens,
        ));
        ids.extend(self.encode(&format!(
            "<|vision_end|>{q}<|im_end|>\n<|im_start|>assistant\n"
        ))?);
        Ok(ids)
    }

    /// Check the features against the config: width, deepstack count, tokens.
    fn check(&self, img: &ImageFeatures) -> Result<usize> {
        let cfg = &self.model.cfg;
        let (n, d) = img.embeds.dims2()?;
        let m = cfg.spatial_merge_size;
        let [t, h, w] = img.grid_thw;
        if d != cfg.hidden_size || h % m != 0 || w % m != 0 || t * (h / m) * (w / m) != n {
            return Err(LmError::Features {
                tokens: n,
                width: d,
                grid: img.grid_thw,
                hidden: cfg.hidden_size,
                merge: m,
            }
            .into());
        }
        if img.deepstack.len() != cfg.deepstack_layers {
            return Err(LmError::Deepstack {
                given: img.deepstack.len(),
                want: cfg.deepstack_layers,
            }
            .into());
        }
        Ok(n)
    }

    /// Run a prompt with the image's features: final hidden states of every
    /// position, and the decoding state after it.
    pub fn prefill(
        &self,
        ids: &[u32],
        img: &ImageFeatures,
        cache: &mut KvCache,
    ) -> Result<(Tensor, i64)> {
        self.check(img)?;
        let cfg = &self.model.cfg;
        let (pos, delta) = mrope_positions(
            ids,
            cfg.image_token_id,
            &[img.grid_thw],
            cfg.spatial_merge_size,
        )
        .map_err(Error::Invalid)?;
        let visual: Vec<u32> = (0..ids.len() as u32)
            .filter(|&i| ids[i as usize] == cfg.image_token_id)
            .collect();
        // Token embeddings with the image-pad rows replaced by the visual tokens.
        let x = self.model.embed(ids)?;
        let (len, d) = x.dims2()?;
        let mut rows = x.flatten_all()?.to_vec1::<f32>()?;
        let vis = img.embeds.flatten_all()?.to_vec1::<f32>()?;
        for (k, &p) in visual.iter().enumerate() {
            let p = p as usize;
            rows[p * d..(p + 1) * d].copy_from_slice(&vis[k * d..(k + 1) * d]);
        }
        let x = Tensor::from_vec(rows, (len, d), &Device::Cpu)?;
        let v = Visual {
            positions: &visual,
            deepstack: &img.deepstack,
        };
        let h = self.model.forward(x, &pos, Some(&v), cache)?;
        Ok((h, delta))
    }

    /// Logits `[len, vocab]` of every position of a prompt (for parity checks).
    pub fn prompt_logits(&self, ids: &[u32], img: &ImageFeatures) -> Result<Tensor> {
        let (h, _) = self.prefill(ids, img, &mut KvCache::default())?;
        self.model.logits(&h)
    }

    /// Answer `question` about the image: greedy decoding of at most
    /// `max_tokens` tokens, stopping at a stop token.
    pub fn answer(&self, img: &ImageFeatures, question: &str, max_tokens: usize) -> Result<Answer> {
        let n = self.check(img)?;
        let ids = self.prompt(n, question)?;
        self.generate(&ids, img, max_tokens)
    }

    /// Greedy decoding from prompt ids.
    pub fn generate(&self, ids: &[u32], img: &ImageFeatures, max_tokens: usize) -> Result<Answer> {
        let t0 = Instant::now();
        let mut cache = KvCache::default();
        let (h, delta) = self.prefill(ids, img, &mut cache)?;
        let last = h.narrow(0, h.dim(0)? - 1, 1)?;
        let mut next = argmax(&self.model.logits(&last)?)?;
        let prefill_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut tokens = Vec::new();
        let mut stop = Stop::TokenLimit;
        while tokens.len() < max_tokens {
            tokens.push(next);
            if self.stop_ids.contains(&next) {
                stop = Stop::StopToken;
                break;
            }
            if tokens.len() == max_tokens {
                break;
            }
            let p = cache.len() as i64 + delta;
            let x = self.model.embed(&[next])?;
            let h = self.model.forward(x, &[[p; 3]], None, &mut cache)?;
            next = argmax(&self.model.logits(&h)?)?;
        }
        let text = self
            .tokenizer
            .decode(&tokens, true)
            .map_err(|e| LmError::Tokenizer(e.to_string()))?
            .trim()
            .to_string();
        Ok(Answer {
            text,
            tokens,
            prompt_tokens: ids.len(),
            stop,
            prefill_s,
            decode_s: t1.elapsed().as_secs_f64(),
        })
    }
}

/// Index of the largest logit of a `[1, vocab]` row (the first on ties).
fn argmax(logits: &Tensor) -> Result<u32> {
    let v = logits.flatten_all()?.to_vec1::<f32>()?;
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    Ok(best as u32)
}
