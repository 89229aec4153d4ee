//! Text encoders (the `bert` family: BERT, RoBERTa, XLM-R): tokenization,
//! the fp32 reference, the build and `ane-run embed --text`, against
//! transformers' goldens (`make golden-text`, python/golden/make_golden_text.py;
//! golden/README-text.md).

use std::path::Path;

use ane_export::family::{Model, SentencePooling};
use ane_export::preprocess::{TextProcessor, TokenBatch};

use crate::common::{assert_fails, golden, read_all, run};

/// The text encoders among the goldens: the `bert` family's (BERT, its
/// masked-LM layout, a sentence-transformers MiniLM layout, XLM-R) and
/// ModernBERT.
const TEXT_MODELS: &[&str] = &[
    "tiny-bert",
    "tiny-bert-mlm",
    "tiny-minilm",
    "tiny-xlmr",
    "tiny-modernbert",
    "tiny-bert-massive",
    "tiny-modernbert-massive",
];

/// Every golden tokenizer (ModernBERT's byte-level BPE too: the host's
/// tokenization does not depend on the family).
const TOKENIZERS: &[&str] = &[
    "tiny-bert",
    "tiny-bert-mlm",
    "tiny-minilm",
    "tiny-xlmr",
    "tiny-modernbert",
];

fn texts() -> Vec<(String, String)> {
    std::fs::read_to_string(golden("text/texts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["name"].as_str().unwrap().to_string(),
                v["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Every golden text at every max_length, through the checkpoint's
/// tokenizer.json: the ids, token type ids and untruncated length
/// transformers' fast tokenizer gives (accents, CJK, emoji, empty text,
/// whitespace, special tokens written in the text, truncation).
#[test]
fn tokenization_matches_transformers() {
    let texts: std::collections::HashMap<String, String> = texts().into_iter().collect();
    for m in TOKENIZERS {
        let tok = TextProcessor::open(&golden(&format!("models/{m}/tokenizer.json"))).unwrap();
        let doc = std::fs::read_to_string(golden(&format!("text/tokens/{m}.json"))).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() >= 3 * texts.len(), "{m}: {} cases", cases.len());
        for c in cases {
            let name = c["name"].as_str().unwrap();
            let l = c["max_length"].as_u64().unwrap() as usize;
            let got = tok.encode(&texts[name], l).unwrap();
            let want = ids(&c["input_ids"]);
            assert_eq!(got.ids, want, "{m}: {name} at {l}");
            assert_eq!(
                got.full_len,
                c["length"].as_u64().unwrap() as usize,
                "{m}: {name}"
            );
            assert_eq!(got.truncated(), got.full_len > l);
            match c.get("token_type_ids") {
                Some(t) => assert_eq!(got.type_ids, ids(t), "{m}: {name} at {l}"),
                None => assert!(got.type_ids.iter().all(|&t| t == 0)),
            }
        }
    }
}

/// The tower cases of a golden model: (file stem, path).
fn tower_cases(model: &str) -> Vec<(String, std::path::PathBuf)> {
    let dir = golden(&format!("text/tower/{model}"));
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_stem().unwrap().to_string_lossy().to_string(), p))
        .collect();
    v.sort();
    assert!(v.len() >= 3, "{}: {} cases", dir.display(), v.len());
    v
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb).max(1e-30)
}

/// The reference against transformers on every golden tower case of every
/// text encoder (ModernBERT's sliding window is 8 tokens wide there, so
/// its local layers differ from global ones on every case past 5 tokens): `last_hidden_state`, `pooler_output` (where the
/// checkpoint has a pooler) and the sentence embedding
/// (sentence-transformers' mean and normalisation, tiny-minilm) within
/// 1e-4; the tokens are our tokenizer's (checked equal to transformers').
#[test]
fn reference_matches_transformers() {
    let texts: std::collections::HashMap<String, String> = texts().into_iter().collect();
    for m in TEXT_MODELS {
        let model = Model::open(&golden(&format!("models/{m}"))).unwrap();
        let tok = model.text_processor().unwrap();
        let enc = ane_export::family::text_encoder(&model).unwrap();
        let pooling = model.vision.tokens().unwrap().sentence_pooling();
        assert_eq!(pooling.is_some(), *m == "tiny-minilm", "{m}");
        for (stem, path) in tower_cases(m) {
            let (t, _) = read_all(&path);
            let (name, l) = stem.rsplit_once('-').unwrap();
            let tokens = tok.encode(&texts[name], l.parse().unwrap()).unwrap();
            let want_ids: Vec<u32> = t["input_ids"].i64.iter().map(|&v| v as u32).collect();
            assert_eq!(tokens.ids, want_ids, "{m} {stem}");
            let out = enc.forward(std::slice::from_ref(&tokens), false).unwrap();
            let h = ane_export::reference::to_vec(&out.outputs[0]).unwrap();
            let e = max_abs(&h, &t["last_hidden_state"].f32);
            assert!(e < 1e-4, "{m} {stem}: last_hidden_state off by {e}");
            match t.get("pooler_output") {
                Some(p) => {
                    let got = ane_export::reference::to_vec(&out.outputs[1]).unwrap();
                    let e = max_abs(&got, &p.f32);
                    assert!(e < 1e-4, "{m} {stem}: pooler_output off by {e}");
                }
                None => assert_eq!(out.outputs.len(), 1, "{m}: no pooler"),
            }
            if let Some(s) = t.get("sentence_embedding") {
                let d = s.f32.len();
                let got = pooling.unwrap().pool(&h, d);
                let e = max_abs(&got, &s.f32);
                assert!(e < 1e-4, "{m} {stem}: sentence_embedding off by {e}");
            }
        }
    }
}

/// RoBERTa is XLM-R's architecture under another `model_type` (position
/// ids past `pad_token_id` too): tiny-xlmr's checkpoint read as `roberta`
/// gives transformers' XLM-R outputs; read as `bert` (positions from 0) it
/// does not.
#[test]
fn roberta_counts_positions_past_the_pad_token() {
    let texts: std::collections::HashMap<String, String> = texts().into_iter().collect();
    let (t, _) = read_all(&golden("text/tower/tiny-xlmr/medium-128.safetensors"));
    for (model_type, agrees) in [("roberta", true), ("bert", false)] {
        let m = crate::common::copy_model("tiny-xlmr");
        let cfg = m.path().join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        v["model_type"] = model_type.into();
        std::fs::write(&cfg, v.to_string()).unwrap();
        let model = Model::open(m.path()).unwrap();
        let tokens = model
            .text_processor()
            .unwrap()
            .encode(&texts["medium"], 128)
            .unwrap();
        let enc = ane_export::family::text_encoder(&model).unwrap();
        let out = enc.forward(std::slice::from_ref(&tokens), false).unwrap();
        let h = ane_export::reference::to_vec(&out.outputs[0]).unwrap();
        let e = max_abs(&h, &t["last_hidden_state"].f32);
        assert_eq!(e < 1e-4, agrees, "{model_type}: off by {e}");
    }
}

/// Several texts in one call give each text's rows as a call of it alone
/// (the reference never pads: each text attends to itself).
#[test]
fn the_reference_runs_texts_of_one_call_as_each_alone() {
    let model = Model::open(&golden("models/tiny-xlmr")).unwrap();
    let tok = model.text_processor().unwrap();
    let enc = ane_export::family::text_encoder(&model).unwrap();
    let batch: Vec<TokenBatch> = texts()
        .iter()
        .take(5)
        .map(|(_, t)| tok.encode(t, 128).unwrap())
        .collect();
    let all =
        ane_export::reference::to_vec(&enc.forward(&batch, false).unwrap().outputs[0]).unwrap();
    let mut at = 0;
    for b in &batch {
        let one = ane_export::reference::to_vec(
            &enc.forward(std::slice::from_ref(b), false).unwrap().outputs[0],
        )
        .unwrap();
        let e = max_abs(&all[at..at + one.len()], &one);
        assert!(e < 1e-5, "{e}");
        at += one.len();
    }
    assert_eq!(at, all.len());
}

/// `ane-export reference --text` writes what the library computes, with
/// the sentence embedding of a sentence-transformers checkpoint and the
/// ids; truncation is said.
#[test]
fn reference_cli_writes_text_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.safetensors");
    let long = texts().into_iter().find(|(n, _)| n == "long").unwrap().1;
    let o = run(
        "ane-export",
        &[
            "reference",
            "--model",
            golden("models/tiny-minilm").to_str().unwrap(),
            "--text",
            "what color is the triangle?",
            &long,
            "--max-tokens",
            "16",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("text 1: truncated from"), "{err}");
    let (t, _) = read_all(&out);
    let lengths = &t["lengths"].i64;
    assert_eq!(lengths[1], 16);
    let d = t["sentence_embedding"].shape[1];
    assert_eq!(t["sentence_embedding"].shape, vec![2, d]);
    assert_eq!(
        t["last_hidden_state"].shape,
        vec![(lengths[0] + lengths[1]) as usize, d]
    );
    assert_eq!(t["pooler_output"].shape, vec![2, d]);
    // Each sentence embedding is the normalised mean of its own rows.
    let h = &t["last_hidden_state"].f32;
    let first = &h[..lengths[0] as usize * d];
    let pool = SentencePooling {
        mode: ane_export::family::SentenceMode::Mean,
        normalize: true,
    };
    assert!(max_abs(&pool.pool(first, d), &t["sentence_embedding"].f32[..d]) < 1e-6);
}

/// `ane-export build` of `model` with the buckets file `buckets` into `out`.
fn build_cmd(model: &Path, buckets: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "build",
        "--model",
        model.to_str().unwrap(),
        "--buckets",
        buckets.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    run("ane-export", &args)
}

/// `ane-export reference --text hello` on `model`, written to `out`.
fn reference_hello(model: &Path, out: &Path) -> std::process::Output {
    run(
        "ane-export",
        &[
            "reference",
            "--model",
            model.to_str().unwrap(),
            "--text",
            "hello",
            "--out",
            out.to_str().unwrap(),
        ],
    )
}

/// A buckets file of token buckets.
fn token_buckets(dir: &Path, sizes: &[usize]) -> std::path::PathBuf {
    let p = dir.join("buckets.yaml");
    let mut s = String::from("buckets:\n");
    for n in sizes {
        s.push_str(&format!("  - name: b{n}\n    tokens: {n}\n"));
    }
    std::fs::write(&p, s).unwrap();
    p
}

/// Build a golden text encoder with token buckets.
fn build(model: &str, dir: &Path, sizes: &[usize]) -> std::path::PathBuf {
    let buckets = token_buckets(dir, sizes);
    let out = dir.join(model);
    let o = build_cmd(&golden(&format!("models/{model}")), &buckets, &out, &[]);
    assert!(
        o.status.success(),
        "build: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The three gates on a text encoder's artifact (golden texts, the text
/// task set): a good build of each model of the family is accepted and
/// `ane-run embed --text` then runs it without `--allow-unaccepted`; builds
/// with a program fault (the key mask dropped, heads swapped) fail the
/// cosine and task gates; a text encoder refuses `--images` and an image
/// tower `--texts`; `ane-run bench` times each bucket.
#[test]
fn text_encoder_gates_accept_good_artifacts_and_reject_faulty_ones() {
    let dir = tempfile::tempdir().unwrap();
    for m in [
        "tiny-minilm",
        "tiny-xlmr",
        "tiny-bert-mlm",
        "tiny-modernbert",
    ] {
        let art = build(m, dir.path(), &[80, 128]);
        let o = run("ane-export", &["gate", art.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "{m}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = crate::common::gate_report(&art);
        crate::common::assert_schema("report", &r);
        assert_eq!(r["accepted"], true, "{m}");
        for g in ["residency", "cosine", "task"] {
            assert_eq!(r["gates"][g]["status"], "pass", "{m}: {g}");
        }
        assert_eq!(r["gates"]["vqa"]["status"], "not_applicable");
        let cases = r["gates"]["cosine"]["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 2 * texts().len(), "{m}");
        // Block taps sit after each post-norm block and agree.
        assert!(
            cases
                .iter()
                .all(|c| c["blocks"].as_array().unwrap().len() >= 2)
        );
        if m == "tiny-minilm" {
            assert!(
                cases[0]["outputs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|o| o["name"] == "sentence_embedding")
            );
            assert_eq!(r["gates"]["task"]["pooled"], "sentence_embedding");
        }
        let out = dir.path().join(format!("{m}-accepted"));
        let o = run(
            "ane-run",
            &[
                "embed",
                "--artifact",
                art.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--text",
                "hello",
            ],
        );
        assert!(
            o.status.success(),
            "{m}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.join("text-0000.safetensors").is_file());
        // The library: an accepted artifact, opened and run as `ane-run` does.
        let rt = ane_export::runtime::Runtime::open(&art).unwrap();
        let e = rt.embed_text("what color is the triangle?").unwrap();
        assert_eq!(e.outputs[0].name, "last_hidden_state");
        assert_eq!(e.outputs[0].rows, e.tokens);
        assert_eq!(
            e.outputs.iter().any(|o| o.name == "sentence_embedding"),
            m == "tiny-minilm"
        );
        // `ane-run bench`: a row per bucket, each run on tokens that fill it.
        let o = run(
            "ane-run",
            &[
                "bench",
                "--artifact",
                art.to_str().unwrap(),
                "--runs",
                "1",
                "--json",
            ],
        );
        assert!(
            o.status.success(),
            "{m}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let b: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let rows = b["results"].as_array().unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r["bucket"].as_str().unwrap()).collect();
        assert_eq!(names, ["b80", "b128"], "{m}");
        assert!(rows.iter().all(|r| r["median_s"].as_f64().unwrap() > 0.0));
    }
    for fault in ["no-mask", "swap-heads"] {
        let name = format!("faulty-{fault}");
        let buckets = token_buckets(dir.path(), &[80, 128]);
        let art = dir.path().join(&name);
        let o = build_cmd(
            &golden("models/tiny-bert"),
            &buckets,
            &art,
            &["--fault", fault],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = run("ane-export", &["gate", art.to_str().unwrap()]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{fault}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = crate::common::gate_report(&art);
        assert_eq!(r["gates"]["cosine"]["status"], "fail", "{fault}");
        assert_eq!(r["gates"]["task"]["status"], "fail", "{fault}");
    }
    let art = dir.path().join("tiny-minilm");
    let o = run(
        "ane-export",
        &[
            "gate",
            art.to_str().unwrap(),
            "--images",
            golden("images").to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["--images is for image towers", "--texts FILE"]);
}

/// The fp16 remedy on the two golden text encoders whose residual stream
/// passes fp16's range (about 1e5 in two channels of the [SEP] token:
/// golden/README-text.md): built with `--residual-scale 1` the program
/// overflows on the Neural Engine's limits and the cosine gate fails,
/// naming the op and the remedy; built without the option, the build
/// calibrates on the golden texts (the stream peak before BERT's
/// post-norms, ModernBERT's stream after its blocks), chooses 16, and the
/// artifact is accepted.
#[test]
fn text_encoders_with_massive_activations_are_remedied_by_the_residual_scale() {
    let dir = tempfile::tempdir().unwrap();
    for m in ["tiny-bert-massive", "tiny-modernbert-massive"] {
        let buckets = token_buckets(dir.path(), &[80, 128]);
        let plain = dir.path().join(format!("{m}-plain"));
        let o = build_cmd(
            &golden(&format!("models/{m}")),
            &buckets,
            &plain,
            &["--residual-scale", "1"],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = run("ane-export", &["gate", plain.to_str().unwrap()]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{m}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let r = crate::common::gate_report(&plain);
        assert_eq!(r["gates"]["cosine"]["status"], "fail", "{m}");
        let msg = r["gates"]["cosine"]["message"].as_str().unwrap();
        assert!(
            msg.contains("32,752") && msg.contains("--residual-scale"),
            "{m}: {msg}"
        );
        let art = build(m, dir.path(), &[80, 128]);
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(manifest["residual_scale"], 16, "{m}");
        crate::common::assert_schema("manifest", &manifest);
        assert!(manifest["calibration"]["stream_peak"].as_f64().unwrap() > 65504.0);
        let o = run("ane-export", &["gate", art.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "{m}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert_eq!(crate::common::gate_report(&art)["accepted"], true, "{m}");
    }
    // A checkpoint whose stream fits keeps the stream as it is.
    let art = build("tiny-minilm", dir.path(), &[80, 128]);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["residual_scale"], 1);
}

/// `build --format both`: a text encoder's `.aimodel`, translated op by op
/// from its package, executed by Apple's Core AI runtime (its CPU on
/// Linux) in the gate beside the package with the interpreter: both pass,
/// the artifact is accepted (BERT with its pooler and a residual scale,
/// the MiniLM layout, ModernBERT's rotary and sliding window).
#[test]
fn text_encoders_ship_an_aimodel_that_core_ai_runs() {
    let dir = tempfile::tempdir().unwrap();
    for m in ["tiny-minilm", "tiny-modernbert", "tiny-bert-massive"] {
        let buckets = token_buckets(dir.path(), &[80, 128]);
        let art = dir.path().join(format!("{m}-both"));
        let o = build_cmd(
            &golden(&format!("models/{m}")),
            &buckets,
            &art,
            &["--format", "both"],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = run("ane-export", &["gate", art.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "{m}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        let r = crate::common::gate_report(&art);
        assert_eq!(r["accepted"], true, "{m}");
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap())
                .unwrap();
        crate::common::assert_schema("manifest", &manifest);
        for g in ["residency", "cosine", "task"] {
            assert_eq!(
                manifest["gates"]["aimodel"][g]["status"], "pass",
                "{m}: {g}"
            );
        }
    }
}

/// `ane-run embed --text` on built artifacts, in fp16 as the Neural Engine
/// computes: every golden tower case that fits the buckets, each in the
/// smallest bucket that holds it (its pad columns masked), against
/// transformers: min token cosine at least 0.999, pooler and sentence
/// embedding at least 0.9999; the manifest records the token buckets and ships the
/// tokenizer; a text longer than the largest bucket is truncated to it.
#[test]
fn built_text_encoders_embed_like_transformers() {
    let texts: std::collections::HashMap<String, String> = texts().into_iter().collect();
    let dir = tempfile::tempdir().unwrap();
    for m in ["tiny-bert", "tiny-minilm", "tiny-xlmr", "tiny-modernbert"] {
        let art = build(m, dir.path(), &[80, 128]);
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(manifest["buckets"][0]["tokens"], 80, "{m}");
        assert_eq!(manifest["preprocessing"]["tokenizer"], "tokenizer.json");
        crate::common::assert_schema("manifest", &manifest);
        assert!(manifest["files"]["tokenizer.json"].is_string());
        let cases: Vec<_> = tower_cases(m)
            .into_iter()
            .filter(|(s, _)| !s.ends_with("-512"))
            .collect();
        let out = dir.path().join(format!("{m}-out"));
        let mut args = vec![
            "embed",
            "--artifact",
            art.to_str().unwrap(),
            "--allow-unaccepted",
            "--precision",
            "fp16",
            "--out",
            out.to_str().unwrap(),
            "--text",
        ];
        let inputs: Vec<&str> = cases
            .iter()
            .map(|(s, _)| texts[s.rsplit_once('-').unwrap().0].as_str())
            .collect();
        args.extend(inputs.iter().copied());
        let o = run("ane-run", &args);
        assert!(
            o.status.success(),
            "{m}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), cases.len());
        for (i, (stem, path)) in cases.iter().enumerate() {
            let (want, _) = read_all(path);
            let (got, meta) = read_all(&out.join(format!("text-{i:04}.safetensors")));
            let l: usize = stem.rsplit_once('-').unwrap().1.parse().unwrap();
            let real = want["input_ids"].i64.len();
            // The golden case is truncated to L; the runtime to the largest bucket.
            if l < 128 && lines[i]["tokens"].as_u64().unwrap() as usize != real {
                continue;
            }
            assert_eq!(got["input_ids"].i64, want["input_ids"].i64, "{m} {stem}");
            let bucket = if real <= 80 { "b80" } else { "b128" };
            assert_eq!(meta["bucket"], bucket, "{m} {stem}");
            let d = want["last_hidden_state"].shape[1];
            let min = got["last_hidden_state"]
                .f32
                .chunks(d)
                .zip(want["last_hidden_state"].f32.chunks(d))
                .map(|(a, b)| cosine(a, b))
                .fold(1.0, f64::min);
            assert!(min >= 0.999, "{m} {stem}: min token cosine {min}");
            for name in ["pooler_output", "sentence_embedding"] {
                match (got.get(name), want.get(name)) {
                    (Some(a), Some(b)) => {
                        let c = cosine(&a.f32, &b.f32);
                        assert!(c >= 0.9999, "{m} {stem}: {name} cosine {c}");
                    }
                    (None, None) => {}
                    _ => panic!("{m} {stem}: {name} present on one side only"),
                }
            }
        }
        // The long text, truncated to the largest bucket.
        let o = run(
            "ane-run",
            &[
                "embed",
                "--artifact",
                art.to_str().unwrap(),
                "--allow-unaccepted",
                "--out",
                out.to_str().unwrap(),
                "--text",
                &texts["long"],
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let line: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap())
                .unwrap();
        assert_eq!(line["tokens"], 128);
        assert_eq!(line["bucket"], "b128");
        assert!(line["truncated_from"].as_u64().unwrap() > 512);
    }
}

/// Inputs of the wrong modality, and text-encoder checkpoints the tool
/// cannot use, are clear errors (exit 2) naming what is wrong.
#[test]
fn wrong_inputs_for_text_encoders_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let img = golden("images/square.png");
    let out = dir.path().join("r.safetensors");
    let o = run(
        "ane-export",
        &[
            "reference",
            "--model",
            golden("models/tiny-bert").to_str().unwrap(),
            "--image",
            img.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["text encoder", "--text"]);
    let o = reference_hello(&golden("models/tiny-clip"), &out);
    assert_fails(&o, &["image tower", "not text"]);
    assert!(!out.exists());
    // No tokenizer.json.
    let m = crate::common::copy_model("tiny-bert");
    std::fs::remove_file(m.path().join("tokenizer.json")).unwrap();
    let o = reference_hello(m.path(), &out);
    assert_fails(&o, &["tokenizer.json"]);
    // A sentence-transformers pooling the tool does not compute.
    let m = crate::common::copy_model("tiny-minilm");
    std::fs::write(
        m.path().join("1_Pooling/config.json"),
        r#"{"pooling_mode_max_tokens": true, "pooling_mode_mean_tokens": false}"#,
    )
    .unwrap();
    let o = reference_hello(m.path(), &out);
    assert_fails(&o, &["1_Pooling/config.json", "pooling_mode_max_tokens"]);
    // A relative position embedding.
    let m = crate::common::copy_model("tiny-bert");
    let cfg = m.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["position_embedding_type"] = "relative_key".into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    let o = reference_hello(m.path(), &out);
    assert_fails(
        &o,
        &["config.json", "position_embedding_type", "relative_key"],
    );
    // Buckets in tokens for an image family, in patches for a text encoder.
    let buckets = token_buckets(dir.path(), &[16]);
    let o = build_cmd(
        &golden("models/tiny-a"),
        &buckets,
        &dir.path().join("a"),
        &[],
    );
    assert_fails(&o, &["`tokens` is for text encoders"]);
    assert!(!dir.path().join("a").exists());
    // `tokens` and `patches` together.
    let p = dir.path().join("both.yaml");
    std::fs::write(
        &p,
        "buckets:\n  - name: b\n    tokens: 16\n    patches: 64\n",
    )
    .unwrap();
    let o = build_cmd(&golden("models/tiny-bert"), &p, &dir.path().join("b"), &[]);
    assert_fails(&o, &["not several"]);
    // A bucket longer than the sentence-transformers max_seq_length (256).
    let p = token_buckets(dir.path(), &[512]);
    let o = build_cmd(
        &golden("models/tiny-minilm"),
        &p,
        &dir.path().join("c"),
        &[],
    );
    assert_fails(&o, &["512 tokens", "1 to 256"]);
}
