//! ModernBERT's tensors in the ANE layout, for its builder
//! (`python/ane_export/modernbert.py`); the token embedding table stays on
//! the host ([`super::host`]).

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::modernbert::ModernBertConfig;

/// A Linear `from` `[o, i]` as the 1x1 conv `to`, with its bias when `bias`.
fn linear(
    w: &mut Writer,
    from: &str,
    to: &str,
    (o, i): (usize, usize),
    bias: bool,
    meaning: &str,
) -> Result<()> {
    if bias {
        return w.linear_as(from, to, (o, i), meaning);
    }
    let v = w.read(&format!("{from}.weight"), &[o, i])?;
    w.push(
        &format!("{to}.weight"),
        vec![o, i, 1, 1],
        v,
        &format!("{meaning} (Linear without bias as 1x1 conv, R2)"),
    )
}

/// A LayerNorm `from` as `to`, with its bias when `bias`.
fn norm(w: &mut Writer, from: &str, to: &str, d: usize, bias: bool, meaning: &str) -> Result<()> {
    if bias {
        return w.layer_norm_as(from, to, d, meaning);
    }
    let v = w.read(&format!("{from}.weight"), &[d])?;
    w.push(
        &format!("{to}.weight"),
        vec![d],
        v,
        &format!("{meaning} (no bias)"),
    )
}

/// The encoder's weights under the names the builder reads:
/// `embeddings.norm`, per layer `blocks.<i>.attn_norm` (from layer 1),
/// `.attn.qkv`, `.attn.proj`, `.mlp_norm`, `.mlp.wi` (rows `[0, I)` the
/// activation's input, `[I, 2I)` the gate), `.mlp.wo`, then `final_norm`.
pub fn layout(
    ck: &Checkpoint,
    c: &ModernBertConfig,
    storage: Storage,
) -> Result<Vec<LayoutTensor>> {
    let (d, m, nb) = (c.hidden_size, c.intermediate_size, c.norm_bias);
    let mut w = Writer::new(ck, storage);
    norm(
        &mut w,
        "embeddings.norm",
        "embeddings.norm",
        d,
        nb,
        "norm of the token embeddings",
    )?;
    for i in 0..c.num_hidden_layers {
        let (l, b) = (format!("layers.{i}"), format!("blocks.{i}"));
        if i > 0 {
            norm(
                &mut w,
                &format!("{l}.attn_norm"),
                &format!("{b}.attn_norm"),
                d,
                nb,
                "pre-attention norm",
            )?;
        }
        linear(
            &mut w,
            &format!("{l}.attn.Wqkv"),
            &format!("{b}.attn.qkv"),
            (3 * d, d),
            c.attention_bias,
            "q, k, v fused: rows [0,D) Q, [D,2D) K, [2D,3D) V, head-major",
        )?;
        linear(
            &mut w,
            &format!("{l}.attn.Wo"),
            &format!("{b}.attn.proj"),
            (d, d),
            c.attention_bias,
            "attention output projection",
        )?;
        norm(
            &mut w,
            &format!("{l}.mlp_norm"),
            &format!("{b}.mlp_norm"),
            d,
            nb,
            "pre-MLP norm",
        )?;
        linear(
            &mut w,
            &format!("{l}.mlp.Wi"),
            &format!("{b}.mlp.wi"),
            (2 * m, d),
            c.mlp_bias,
            "GeGLU in: rows [0,I) the activation's input, [I,2I) the gate",
        )?;
        linear(
            &mut w,
            &format!("{l}.mlp.Wo"),
            &format!("{b}.mlp.wo"),
            (d, m),
            c.mlp_bias,
            "GeGLU out",
        )?;
    }
    norm(
        &mut w,
        "final_norm",
        "final_norm",
        d,
        nb,
        "final norm (last_hidden_state)",
    )?;
    Ok(w.finish())
}
