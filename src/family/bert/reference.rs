//! fp32 reference of the BERT family's encoder (BERT, RoBERTa, XLM-R), in
//! the checkpoint's own layout `(tokens, channels)`.
//!
//! The maths follows transformers' `models/bert/modeling_bert.py` (and
//! `models/roberta/modeling_roberta.py`, `models/xlm_roberta/`, copies of
//! it but for the position ids). It shares no code with the export path
//! (the host's embedding sums included).
//!
//! Forward, for each text's token ids `t_0 .. t_{T-1}` (special tokens
//! included, never padded) and token type ids: the embeddings
//! `word[t_j] + position[offset + j] + token_type[type_j]` (`offset` 0 for
//! BERT; `pad_token_id + 1` for RoBERTa and XLM-R, what
//! `create_position_ids_from_input_ids` gives a text without pad tokens),
//! `embeddings.LayerNorm`, then `num_hidden_layers` post-norm layers:
//! `x = LN1(x + dense(attn(x)))`, `x = LN2(x + out(act(inter(x))))`, the
//! attention with q, k, v biases over the text's own tokens, no mask (no
//! token is padding). `last_hidden_state` is the last layer's output;
//! `pooler_output` `tanh(dense(x_0))` where the checkpoint has a pooler.

use candle_core::{Device, Tensor};

use crate::checkpoint::{Activation, Checkpoint};
use crate::error::{Error, Result};
use crate::family::bert::BertConfig;
use crate::preprocess::TokenBatch;
use crate::reference::kernels;
use crate::reference::vit::{
    Linear, Norm, Pass, TowerOutput, activation, add, run_in_passes, segments,
};

/// One `encoder.layer.<i>`.
struct Layer {
    /// q, k and v fused: rows `[0, D)` Q, `[D, 2D)` K, `[2D, 3D)` V.
    qkv: Linear,
    dense: Linear,
    norm1: Norm,
    inter: Linear,
    out: Linear,
    norm2: Norm,
}

impl Layer {
    fn load(ck: &Checkpoint, i: usize, c: &BertConfig) -> Result<Layer> {
        let (d, m, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps);
        let l = format!("encoder.layer.{i}");
        let (mut ws, mut bs) = (Vec::new(), Vec::new());
        for part in ["query", "key", "value"] {
            let n = format!("{l}.attention.self.{part}");
            ws.push(ck.tensor(&format!("{n}.weight"), &[d, d])?);
            bs.push(ck.tensor(&format!("{n}.bias"), &[d])?);
        }
        Ok(Layer {
            qkv: Linear::new(&Tensor::cat(&ws, 0)?, Tensor::cat(&bs, 0)?)?,
            dense: Linear::load(ck, &format!("{l}.attention.output.dense"), d, d)?,
            norm1: Norm::layer(ck, &format!("{l}.attention.output.LayerNorm"), d, eps)?,
            inter: Linear::load(ck, &format!("{l}.intermediate.dense"), m, d)?,
            out: Linear::load(ck, &format!("{l}.output.dense"), d, m)?,
            norm2: Norm::layer(ck, &format!("{l}.output.LayerNorm"), d, eps)?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        attn: &kernels::Attention,
        act: Activation,
    ) -> candle_core::Result<Tensor> {
        Ok(self.forward_sums(x, attn, act)?.0)
    }

    /// The layer's output and the two sums its norms read (`x + attn`,
    /// then `x + mlp`): where a post-norm stream holds its largest values.
    fn forward_sums(
        &self,
        x: &Tensor,
        attn: &kernels::Attention,
        act: Activation,
    ) -> candle_core::Result<(Tensor, [Tensor; 2])> {
        let a = kernels::apply1(&self.qkv.forward(x)?, attn)?;
        let s1 = add(x, &self.dense.forward(&a)?)?;
        let x = self.norm1.forward(&s1)?;
        let h = self
            .out
            .forward(&activation(&self.inter.forward(&x)?, act)?)?;
        let s2 = add(&x, &h)?;
        Ok((self.norm2.forward(&s2)?, [s1, s2]))
    }
}

/// The loaded encoder.
pub struct BertEncoder {
    cfg: BertConfig,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    norm: Norm,
    layers: Vec<Layer>,
    pooler: Option<Linear>,
}

impl BertEncoder {
    pub fn load(ck: &Checkpoint, cfg: &BertConfig) -> Result<BertEncoder> {
        let d = cfg.hidden_size;
        let rows = |name: &str, n: usize| -> Result<Vec<f32>> {
            Ok(ck.tensor(name, &[n, d])?.flatten_all()?.to_vec1::<f32>()?)
        };
        let layers =
            crate::reference::vit::load_blocks(cfg.num_hidden_layers, |i| Layer::load(ck, i, cfg))?;
        Ok(BertEncoder {
            word: rows("embeddings.word_embeddings.weight", cfg.vocab_size)?,
            position: rows(
                "embeddings.position_embeddings.weight",
                cfg.max_position_embeddings,
            )?,
            token_type: rows(
                "embeddings.token_type_embeddings.weight",
                cfg.type_vocab_size,
            )?,
            norm: Norm::layer(ck, "embeddings.LayerNorm", d, cfg.layer_norm_eps)?,
            layers,
            pooler: if cfg.pooler {
                Some(Linear::load(ck, "pooler.dense", d, d)?)
            } else {
                None
            },
            cfg: cfg.clone(),
        })
    }

    /// Check a text's ids against the tables; the message names what is wrong.
    fn check(&self, i: usize, t: &TokenBatch) -> Result<()> {
        let c = &self.cfg;
        let bad = |msg: String| Err(Error::Invalid(format!("text {i}: {msg}")));
        if t.ids.is_empty() {
            return bad("no tokens".into());
        }
        if t.ids.len() != t.type_ids.len() {
            return bad(format!(
                "{} token ids but {} token type ids",
                t.ids.len(),
                t.type_ids.len()
            ));
        }
        if t.ids.len() > c.max_tokens() {
            return bad(format!(
                "{} tokens: the position table holds {}",
                t.ids.len(),
                c.max_tokens()
            ));
        }
        if let Some(id) = t.ids.iter().find(|&&id| id as usize >= c.vocab_size) {
            return bad(format!(
                "token id {id} is not below vocab_size {}",
                c.vocab_size
            ));
        }
        if let Some(ty) = t
            .type_ids
            .iter()
            .find(|&&ty| ty as usize >= c.type_vocab_size)
        {
            return bad(format!(
                "token type id {ty} is not below type_vocab_size {}",
                c.type_vocab_size
            ));
        }
        Ok(())
    }

    /// Text `t`'s embeddings before the LayerNorm, `[T, D]`.
    fn embed(&self, t: &TokenBatch) -> candle_core::Result<Tensor> {
        let d = self.cfg.hidden_size;
        let mut x = Vec::with_capacity(t.ids.len() * d);
        for (j, (&id, &ty)) in t.ids.iter().zip(&t.type_ids).enumerate() {
            let w = &self.word[id as usize * d..][..d];
            let p = &self.position[(self.cfg.position_offset + j) * d..][..d];
            let y = &self.token_type[ty as usize * d..][..d];
            x.extend((0..d).map(|k| w[k] + p[k] + y[k]));
        }
        Tensor::from_vec(x, (t.ids.len(), d), &Device::Cpu)
    }

    pub fn forward(&self, texts: &[TokenBatch], keep_blocks: bool) -> Result<TowerOutput> {
        if texts.is_empty() {
            return Err(Error::Invalid("no text".into()));
        }
        for (i, t) in texts.iter().enumerate() {
            self.check(i, t)?;
        }
        let cfg = &self.cfg;
        let seqs: Vec<usize> = texts.iter().map(TokenBatch::len).collect();
        let (passes, block_outputs) = run_in_passes(
            &seqs,
            (cfg.num_attention_heads, cfg.head_dim()),
            cfg.num_hidden_layers,
            keep_blocks,
            |i| self.norm.forward(&self.embed(&texts[i])?),
            |b, x, attn| self.layers[b].forward(x, attn, cfg.hidden_act),
        )?;
        let (mut hidden, mut pooled) = (Vec::new(), Vec::new());
        for Pass { x, images } in passes {
            if let Some(p) = &self.pooler {
                for (first, _) in segments(&seqs[images]) {
                    pooled.push(p.forward(&x.narrow(0, first, 1)?)?.tanh()?);
                }
            }
            hidden.push(x);
        }
        let mut outputs = vec![Tensor::cat(&hidden, 0)?];
        if !pooled.is_empty() {
            outputs.push(Tensor::cat(&pooled, 0)?);
        }
        Ok(TowerOutput {
            outputs,
            block_outputs,
        })
    }
}

impl crate::reference::TextEncoder for BertEncoder {
    fn forward(&self, texts: &[TokenBatch], keep_blocks: bool) -> Result<TowerOutput> {
        BertEncoder::forward(self, texts, keep_blocks)
    }

    /// Each layer's largest sum before its norms: the program's residual
    /// scale divides exactly those sums.
    fn stream_peaks(&self, text: &TokenBatch) -> Result<Vec<f32>> {
        self.check(0, text)?;
        let c = &self.cfg;
        let attn = crate::reference::vit::plain_attention(
            c.num_attention_heads,
            c.head_dim(),
            &[text.len()],
        );
        let mut x = self.norm.forward(&self.embed(text)?)?;
        let mut peaks = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let (y, sums) = l.forward_sums(&x, &attn, c.hidden_act)?;
            let mut peak = 0f32;
            for s in &sums {
                peak = peak.max(crate::interp::max_abs(&s.flatten_all()?.to_vec1::<f32>()?));
            }
            peaks.push(peak);
            x = y;
        }
        Ok(peaks)
    }
}
