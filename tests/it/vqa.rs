//! End-to-end VQA on the golden tiny VLM: the VQA gate passes on the bundled
//! artifact (both buckets, heavy padding) and fails on one whose tower swaps
//! red and blue; `ane-run vqa` answers from the accepted artifact and from
//! the reference; bad input is exit 2 with a clear message.

use std::path::{Path, PathBuf};
use std::process::Output;

use ane_export::artifact::{Acceptance, Artifact};

use crate::common::{assert_fails, build_model, gate_report, golden, golden_images, run};

fn build_vlm(dir: &Path, name: &str, buckets: &[&str], extra: &[&str]) -> PathBuf {
    build_model(&golden("tiny-vlm"), dir, name, buckets, extra)
}

fn text(o: &Output) -> String {
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!t.contains("panicked"), "panic:\n{t}");
    t
}

#[test]
fn the_vqa_gate_passes_on_the_bundled_vlm_and_ane_run_answers() {
    let t = tempfile::tempdir().unwrap();
    let a = build_vlm(t.path(), "tiny-vlm", &[], &[]);
    // every gate; the cosine gate on two golden images to keep the test short,
    // the VQA gate on the golden question set (the default)
    let imgs = golden_images(&["wide.jpg", "tiny.png"]);
    let o = run(
        "ane-export",
        &[
            "gate",
            a.to_str().unwrap(),
            "--images",
            imgs.path().to_str().unwrap(),
        ],
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("vqa: pass"), "{out}");
    let r = gate_report(&a);
    let v = &r["gates"]["vqa"];
    assert_eq!(v["status"], "pass");
    assert!(v["agreement"].as_f64().unwrap() >= 0.98, "{v}");
    let rows = v["questions"].as_array().unwrap();
    let golden_count = std::fs::read_to_string(golden("vqa/questions.jsonl"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(rows.len(), golden_count);
    // both buckets ran, and the language model sees the images
    for b in ["b1024", "b4096"] {
        assert!(
            rows.iter().any(|q| q["bucket"] == b),
            "no question ran in {b}"
        );
    }
    let acc = v["accuracy_reference"].as_f64().unwrap();
    assert!(acc >= 0.8, "reference accuracy {acc} on the golden set");
    assert_eq!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Accepted
    );

    // ane-run vqa on the accepted artifact gives the gate's answers, from
    // the artifact and from the reference.
    let canvas = rows
        .iter()
        .find(|q| q["bucket"] == "b4096")
        .expect("a b4096 question");
    for q in [&rows[0], canvas] {
        let image = q["image"].as_str().unwrap();
        let question = q["question"].as_str().unwrap();
        let args = [
            "vqa",
            "--artifact",
            a.to_str().unwrap(),
            "--image",
            image,
            "--question",
            question,
        ];
        let o = run("ane-run", &args);
        let out = text(&o);
        assert!(o.status.success(), "{out}");
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            q["artifact"],
            "{out}"
        );

        let mut json_args = args.to_vec();
        json_args.extend(["--tower", "reference", "--json"]);
        let o = run("ane-run", &json_args);
        assert!(o.status.success(), "{}", text(&o));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["answer"], q["reference"]);
        assert_eq!(j["bucket"], "reference");
        assert_eq!(j["stop"], "stop_token");
        assert!(j["tokens"].as_array().unwrap().len() >= 2, "{j}");
        assert!(j["timings_s"]["total"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn a_tower_that_swaps_red_and_blue_fails_the_vqa_gate() {
    let t = tempfile::tempdir().unwrap();
    let a = build_vlm(t.path(), "swapped", &[], &["--fault", "swap-rb"]);
    let o = run(
        "ane-export",
        &[
            "gate",
            a.to_str().unwrap(),
            "--skip",
            "cosine",
            "--skip",
            "residency",
        ],
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let v = &gate_report(&a)["gates"]["vqa"];
    assert_eq!(v["status"], "fail", "{v}");
    assert!(v["agreement"].as_f64().unwrap() < 0.98, "{v}");
    // the disagreements are about colours the swap changes
    let rows = v["questions"].as_array().unwrap();
    let swapped = ["red", "blue", "yellow", "teal"];
    assert!(
        rows.iter().any(|q| q["agree"] == false
            && swapped.contains(&q["reference"].as_str().unwrap())
            && swapped.contains(&q["artifact"].as_str().unwrap())),
        "{v}"
    );
    assert!(
        v["message"].as_str().unwrap().contains("artifact says"),
        "{v}"
    );
    assert_eq!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Rejected
    );
}

#[test]
fn bad_vqa_input_is_exit_2_with_the_cause() {
    let t = tempfile::tempdir().unwrap();
    let a = build_vlm(t.path(), "small", &["b1024"], &[]);
    let a = a.to_str().unwrap();
    let img = golden("vqa/images/test-0000.png");
    let img = img.to_str().unwrap();
    let vqa = |extra: &[&str]| {
        let mut args = vec!["vqa", "--artifact", a, "--allow-unaccepted"];
        args.extend(extra);
        run("ane-run", &args)
    };

    assert_fails(
        &vqa(&["--image", img, "--question", "  "]),
        &["question is empty"],
    );
    assert_fails(
        &vqa(&["--image", img, "--question", "what?", "--max-tokens", "0"]),
        &["--max-tokens must be at least 1"],
    );
    let long = "what ".repeat(500);
    assert_fails(
        &vqa(&["--image", img, "--question", &long]),
        &["characters"],
    );

    let bad = t.path().join("bad.png");
    std::fs::write(&bad, b"not a png").unwrap();
    let bad = bad.to_str().unwrap();
    for tower in ["artifact", "reference"] {
        assert_fails(
            &vqa(&["--image", bad, "--question", "what?", "--tower", tower]),
            &["bad.png"],
        );
    }

    // the source has no tokenizer: no language model to answer with
    let tiny_a = golden("models/tiny-a");
    assert_fails(
        &vqa(&[
            "--image",
            img,
            "--question",
            "what?",
            "--model",
            tiny_a.to_str().unwrap(),
        ]),
        &["tokenizer.json"],
    );

    // not accepted, and no --allow-unaccepted
    let o = run(
        "ane-run",
        &[
            "vqa",
            "--artifact",
            a,
            "--image",
            img,
            "--question",
            "what shape?",
        ],
    );
    assert_fails(&o, &["has not been gated"]);
}

/// A CI matrix: each bucket gated alone (the VQA gate deferred, exit 0),
/// then `--merge` runs the VQA gate over every bucket and accepts.
#[test]
fn partial_runs_defer_the_vqa_gate_to_the_merge() {
    let t = tempfile::tempdir().unwrap();
    let a = build_vlm(t.path(), "matrix", &[], &[]);
    let a = a.to_str().unwrap();
    let imgs = golden_images(&["wide.jpg", "tiny.png"]);
    let imgs = imgs.path().to_str().unwrap();
    for b in ["b1024", "b4096"] {
        let o = run("ane-export", &["gate", a, "--bucket", b, "--images", imgs]);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(0), "{out}");
        assert!(out.contains("vqa: deferred"), "{out}");
    }
    assert_eq!(
        Artifact::open(Path::new(a)).unwrap().acceptance(),
        Acceptance::NotGated
    );
    let o = run("ane-export", &["gate", a, "--merge"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let r = gate_report(Path::new(a));
    assert_eq!(r["gates"]["vqa"]["status"], "pass");
    assert_eq!(r["gates"]["cosine"]["status"], "pass");
    assert_eq!(
        Artifact::open(Path::new(a)).unwrap().acceptance(),
        Acceptance::Accepted
    );
}
