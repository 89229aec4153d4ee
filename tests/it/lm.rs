//! The Rust language models (Qwen3-VL's decoder and the Qwen2 decoders of
//! Qwen2-VL and Qwen2.5-VL) against transformers
//! (`golden/lm/`, written by `make golden-vlm`): the same prompt ids from the
//! chat template, every prompt logit within tolerance, the same greedy tokens.

use ane_export::family;
use ane_export::lm::{ImageFeatures, Vlm};
use candle_core::{Device, Tensor};

use crate::common::{golden, read_all};

fn features(t: &std::collections::HashMap<String, crate::common::T>) -> ImageFeatures {
    let tensor = |n: &str| {
        let x = &t[n];
        Tensor::from_vec(x.f32.clone(), (x.shape[0], x.shape[1]), &Device::Cpu).unwrap()
    };
    let g = &t["grid_thw"].i64;
    let deepstack = (0..)
        .map(|k| format!("deepstack.{k}"))
        .take_while(|n| t.contains_key(n))
        .map(|n| tensor(&n))
        .collect();
    ImageFeatures {
        embeds: tensor("embeds"),
        deepstack,
        grid_thw: [g[0] as usize, g[1] as usize, g[2] as usize],
    }
}

/// The largest |logit - transformers' logit| over a prompt, and the largest |logit|.
fn logit_error(vlm: &Vlm, ids: &[u32], img: &ImageFeatures, want: &[f32]) -> (f32, f32) {
    let got: Vec<f32> = vlm
        .prompt_logits(ids, img)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    (err, scale)
}

/// Each parity case of one model: prompt ids, logits, greedy tokens.
fn check_model(model: &str, dir: &std::path::Path) {
    let vlm = Vlm::load(dir, family::decoder).unwrap();
    let mut cases = 0;
    for k in 0.. {
        let path = golden(&format!("lm/{model}-{k}.safetensors"));
        if !path.exists() {
            break;
        }
        cases += 1;
        let (t, meta) = read_all(&path);
        let img = features(&t);
        let want_ids: Vec<u32> = t["input_ids"].i64.iter().map(|&i| i as u32).collect();
        // The chat template gives the ids transformers ran.
        let ids = vlm
            .prompt(img.embeds.dims2().unwrap().0, &meta["question"])
            .unwrap();
        assert_eq!(ids, want_ids, "{}: prompt ids", path.display());

        let (err, scale) = logit_error(&vlm, &ids, &img, &t["logits"].f32);
        assert!(
            err <= 1e-4 * scale.max(1.0),
            "{}: max |logit error| {err} (logits up to {scale})",
            path.display()
        );

        let want_gen: Vec<u32> = t["generated"].i64.iter().map(|&i| i as u32).collect();
        let ans = vlm.generate(&ids, &img, want_gen.len()).unwrap();
        assert_eq!(ans.tokens, want_gen, "{}: greedy tokens", path.display());
    }
    assert!(cases >= 2, "{model}: no parity cases under golden/lm");
}

#[test]
fn trained_tiny_vlm_matches_transformers() {
    check_model("tiny-vlm", &golden("tiny-vlm"));
}

/// An untied `lm_head` and as many K/V heads as query heads: the structure of
/// the larger released checkpoints, at tiny size.
#[test]
fn untied_random_model_matches_transformers() {
    check_model("tiny-lm-untied", &golden("models/tiny-lm-untied"));
}

#[test]
fn models_without_a_language_model_or_tokenizer_are_refused() {
    // tiny-a has a (random) language model but no tokenizer.json
    let e = Vlm::load(&golden("models/tiny-a"), family::decoder)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("tokenizer.json"), "{e}");

    // a vision-only checkpoint: the tower's tensors and no decoder
    let dir = tempfile::tempdir().unwrap();
    let src = golden("tiny-vlm");
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let keep: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n.starts_with("model.visual."))
        .collect();
    safetensors::serialize_to_file(keep, None, &dir.path().join("model.safetensors")).unwrap();
    let e = Vlm::load(dir.path(), family::decoder)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no language model"), "{e}");
}

#[test]
fn questions_are_checked() {
    let vlm = Vlm::load(&golden("tiny-vlm"), family::decoder).unwrap();
    for (q, words) in [
        ("   ", "empty"),
        (&"what ".repeat(1000)[..], "characters"),
        (&"? ".repeat(600)[..], "tokens"),
    ] {
        let e = vlm.prompt(16, q).unwrap_err().to_string();
        assert!(e.contains(words), "{e}");
    }
}

/// Weights stored in bf16 (as the released checkpoints are) stay bf16 in
/// memory and are widened per product: the answers hold, the logits move by
/// bf16 rounding only.
#[test]
fn bf16_checkpoints_load_and_answer_alike() {
    let dir = tempfile::tempdir().unwrap();
    let src = golden("tiny-vlm");
    for f in ["config.json", "tokenizer.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut bf: Vec<(String, Vec<u8>, Vec<usize>)> = vec![];
    for (name, v) in st.tensors() {
        assert_eq!(v.dtype(), safetensors::Dtype::F32);
        let data = v
            .data()
            .chunks_exact(4)
            .flat_map(|c| {
                half::bf16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_le_bytes()
            })
            .collect();
        bf.push((name, data, v.shape().to_vec()));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = bf
        .iter()
        .map(|(n, d, s)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), d)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();

    let vlm = Vlm::load(dir.path(), family::decoder).unwrap();
    let (t, meta) = read_all(&golden("lm/tiny-vlm-0.safetensors"));
    let img = features(&t);
    let ids = vlm
        .prompt(img.embeds.dims2().unwrap().0, &meta["question"])
        .unwrap();
    let (err, scale) = logit_error(&vlm, &ids, &img, &t["logits"].f32);
    assert!(
        err > 0.0,
        "bf16 weights gave the f32 logits exactly: not widened from bf16?"
    );
    assert!(
        err <= 0.05 * scale,
        "max |logit error| {err} (logits up to {scale})"
    );
    let want_gen: Vec<u32> = t["generated"].i64.iter().map(|&i| i as u32).collect();
    assert_eq!(
        vlm.generate(&ids, &img, want_gen.len()).unwrap().tokens,
        want_gen
    );
}

/// The Qwen2 decoders of Qwen2.5-VL (tied embeddings, grouped K/V) and
/// Qwen2-VL (untied `lm_head`): M-RoPE in three sections, q/k/v biases, no
/// q/k norms, the chat template's default system turn; random bf16 weights
/// kept under `model.` as the released checkpoints keep them.
#[test]
fn qwen2_decoders_match_transformers() {
    check_model("tiny-q25", &golden("models/tiny-q25"));
    check_model("tiny-q2", &golden("models/tiny-q2"));
}

/// The trained tiny Qwen2.5-VL VLM's Qwen2 decoder (`make golden-vlm-q25`).
#[test]
fn trained_tiny_qwen2_5_vl_vlm_matches_transformers() {
    check_model("tiny-vlm-q25", &golden("tiny-vlm-q25"));
}
