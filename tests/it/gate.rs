//! `ane-export gate`: the tiny artifact is accepted and acceptance is bound to
//! its bytes; every deliberately broken artifact is rejected by the right gate
//! with a message pointing at the cause; partial reports merge; the HTML
//! report renders its plots in headless Chromium.

use std::path::{Path, PathBuf};
use std::process::Output;

use ane_export::artifact::{Acceptance, Artifact, sha256_file};
use ane_export::mlpackage::{Arg, Package, Value};

use crate::common::{assert_schema, build_tiny, gate_report, golden_images, run};

/// Two golden images: a wide one (640 patches) and a tiny, heavily padded one;
/// the gate adds the call with both.
fn images() -> tempfile::TempDir {
    golden_images(&["wide.jpg", "tiny.png"])
}

/// Build tiny-a into `dir/name` with the given buckets and faults.
fn build(dir: &Path, name: &str, buckets: &[&str], faults: &[&str], extra: &[&str]) -> PathBuf {
    let mut args: Vec<&str> = faults.iter().flat_map(|f| ["--fault", f]).collect();
    args.extend(extra);
    build_tiny(dir, name, buckets, &args)
}

fn gate(artifact: &Path, imgs: &Path, extra: &[&str]) -> (Output, String) {
    let mut args = vec![
        "gate",
        artifact.to_str().unwrap(),
        "--images",
        imgs.to_str().unwrap(),
    ];
    args.extend(extra);
    let o = run("ane-export", &args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!text.contains("panicked"), "panic:\n{text}");
    (o, text)
}

/// Recompute the manifest's hashes after a deliberate edit, so that only the
/// numerics can tell.
fn rehash(artifact: &Path) {
    let mp = artifact.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mp).unwrap()).unwrap();
    let files: Vec<String> = m["files"].as_object().unwrap().keys().cloned().collect();
    for f in files {
        m["files"][&f] = sha256_file(&artifact.join(&f)).unwrap().into();
    }
    std::fs::write(&mp, serde_json::to_string_pretty(&m).unwrap()).unwrap();
}

#[test]
fn accepts_the_tiny_artifact_and_binds_acceptance_to_its_bytes() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let a = build(t.path(), "tiny", &["b1024"], &[], &[]);

    // Without a language model the VQA gate cannot run: exit 2, not accepted.
    let (o, text) = gate(&a, imgs.path(), &[]);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(
        text.contains("vqa: not_run") && text.contains("--skip vqa"),
        "{text}"
    );
    assert_eq!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Rejected
    );

    // With the VQA gate skipped: every gate that ran passed (exit 0), but
    // the artifact is not accepted, and the summary says why.
    let (o, text) = gate(&a, imgs.path(), &["--skip", "vqa"]);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains("artifact not accepted (the vqa gate was skipped"),
        "{text}"
    );
    // stderr is a pipe here, as in CI: every step is a line with the
    // seconds since the gate started, in the order the gate runs them.
    // The reference runs each image alone, largest first, and joins the
    // call of both from those runs; the artifact runs the call of both
    // first (the largest), then the two calls of one image, side by side,
    // in either order.
    let steps: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix('[')?.split_once(" s] ").map(|(_, m)| m))
        .collect();
    let at = |m: &str| {
        steps
            .iter()
            .position(|s| s.starts_with(m))
            .unwrap_or_else(|| panic!("no step `{m}` in:\n{text}"))
    };
    let order = [
        "verifying the artifact's files",
        "residency: b1024",
        "cosine: loading the reference tower",
        "cosine: reference: wide.jpg in b1024",
        "cosine: reference: tiny.png in b1024",
        "cosine: reference: tiny.png+wide.jpg in b1024: its images' runs, one after another",
        "cosine: tiny.png+wide.jpg in b1024",
        "writing the report",
    ]
    .map(at);
    assert!(order.is_sorted(), "steps out of order {order:?}:\n{text}");
    for image in ["tiny.png", "wide.jpg"] {
        let artifact = at(&format!("cosine: {image} in b1024"));
        assert!(
            order[6] < artifact && artifact < order[7],
            "{image}'s steps out of order:\n{text}"
        );
    }
    let r = gate_report(&a);
    assert_schema("report", &r);
    assert_eq!(r["schema"], "ane-export-gate-report/1");
    assert_eq!(r["passed"], true);
    assert_eq!(r["accepted"], false);
    assert_eq!(r["gates"]["residency"]["status"], "pass");
    assert_eq!(r["gates"]["residency"]["source"], "predicted");
    assert_eq!(r["gates"]["residency"]["buckets"][0]["fraction"], 1.0);
    assert_eq!(r["gates"]["vqa"]["status"], "skipped");
    assert_eq!(r["skipped"], serde_json::json!(["vqa"]));
    // Each side's wall time; the artifact's cases ran side by side when
    // this machine has several threads.
    let cosine = &r["gates"]["cosine"];
    for side in ["reference", "artifact"] {
        assert!(cosine["seconds"][side].as_f64().unwrap() > 0.0, "{cosine}");
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(cosine["side_by_side"], threads.min(2), "{cosine}");
    let cases = r["gates"]["cosine"]["cases"].as_array().unwrap();
    // wide, tiny, and both in one call.
    assert_eq!(cases.len(), 3);
    for c in cases {
        assert_eq!(c["status"], "pass", "{c}");
        let outs = c["outputs"].as_array().unwrap();
        assert_eq!(outs.len(), 3, "embeds and two deepstack outputs");
        for out in outs {
            assert!(out["min_cos"].as_f64().unwrap() >= 0.999, "{out}");
            assert_eq!(
                out["token_cos"].as_array().unwrap().len(),
                c["real_patches"].as_u64().unwrap() as usize / 4
            );
        }
        assert_eq!(
            c["blocks"].as_array().unwrap().len(),
            4,
            "one row per block"
        );
    }
    assert_eq!(cases[2]["grid_thw"].as_array().unwrap().len(), 2);

    // The manifest records the result for exactly these bytes: gated with
    // the VQA gate skipped, so not accepted.
    let art = Artifact::open(&a).unwrap();
    assert_eq!(
        art.acceptance(),
        Acceptance::Incomplete {
            skipped: vec!["vqa".into()]
        }
    );
    assert_schema("manifest", &art.manifest);
    let m = &art.manifest["gates"];
    assert_eq!(m["accepted"], false);
    assert_eq!(m["files_digest"], art.digest().as_str());
    assert_eq!(m["skipped"], serde_json::json!(["vqa"]));
    assert_eq!(
        m["report_sha256"],
        sha256_file(&a.join("gate/report.json")).unwrap().as_str()
    );
    assert!(a.join("gate/report.html").is_file());

    // A file changed afterwards: verification names it, and the gate refuses to run.
    let host = a.join("host.safetensors");
    let mut bytes = std::fs::read(&host).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&host, &bytes).unwrap();
    let err = art.verify().unwrap_err().to_string();
    assert!(
        err.contains("host.safetensors") && err.contains("changed"),
        "{err}"
    );
    let (o, text) = gate(&a, imgs.path(), &["--skip", "vqa"]);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains("host.safetensors"), "{text}");
    // A package that no longer parses: the files are verified beside opening
    // the packages, and the modified file is the error reported.
    bytes[last] ^= 1;
    std::fs::write(&host, &bytes).unwrap();
    let spec = a.join("tiny.mlpackage/Data/com.apple.CoreML/model.mlmodel");
    let good = std::fs::read(&spec).unwrap();
    std::fs::write(&spec, b"not a model").unwrap();
    let (o, text) = gate(&a, imgs.path(), &["--skip", "vqa"]);
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(
        text.contains("model.mlmodel") && text.contains("changed"),
        "{text}"
    );
    std::fs::write(&spec, &good).unwrap();
    Artifact::open(&a).unwrap().verify().unwrap();
    // Rehashed (a new build of other bytes): the old acceptance no longer holds.
    bytes[last] ^= 1;
    std::fs::write(&host, &bytes).unwrap();
    rehash(&a);
    assert_eq!(Artifact::open(&a).unwrap().acceptance(), Acceptance::Stale);
}

/// The case results of a rejected artifact, with the gate's exit code checked.
fn rejected(a: &Path, imgs: &Path) -> (serde_json::Value, String) {
    let (o, text) = gate(a, imgs, &["--skip", "vqa"]);
    assert_eq!(o.status.code(), Some(1), "{text}");
    let r = gate_report(a);
    assert_eq!(r["accepted"], false);
    assert_eq!(
        Artifact::open(a).unwrap().acceptance(),
        Acceptance::Rejected
    );
    (r, text)
}

#[test]
fn a_perturbed_weight_fails_the_cosine_gate_at_its_block() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let a = build(t.path(), "tiny", &["b1024"], &[], &[]);
    // Negate block 1's fc1 weight inside weight.bin, then rehash the manifest.
    let pkg_dir = a.join("tiny.mlpackage");
    let (offset, file) = {
        let pkg = Package::open(&pkg_dir).unwrap();
        let f = pkg.program.function(Some("b1024")).unwrap();
        let conv = f
            .ops
            .iter()
            .find(|o| o.kind == "conv" && o.label().starts_with("b1_fc1"))
            .expect("block 1 fc1");
        let Some(Arg::Var(w)) = conv.inputs["weight"].first() else {
            panic!("weight is not a variable")
        };
        let c = f.ops.iter().find(|o| o.label() == w).unwrap();
        let Value::Blob { offset, file, .. } = &c.attributes["val"] else {
            panic!("weight is not a blob")
        };
        (*offset as usize, file.clone())
    };
    assert!(file.ends_with("weights/weight.bin"));
    let wpath = pkg_dir.join("Data/com.apple.CoreML/weights/weight.bin");
    let mut bytes = std::fs::read(&wpath).unwrap();
    let size = u64::from_le_bytes(bytes[offset + 8..offset + 16].try_into().unwrap()) as usize;
    let data = u64::from_le_bytes(bytes[offset + 16..offset + 24].try_into().unwrap()) as usize;
    for i in (data..data + size).step_by(2) {
        bytes[i + 1] ^= 0x80; // fp16 sign bit
    }
    std::fs::write(&wpath, &bytes).unwrap();
    rehash(&a);

    let (r, text) = rejected(&a, imgs.path());
    assert_eq!(r["gates"]["residency"]["status"], "pass", "{text}");
    assert_eq!(r["gates"]["cosine"]["status"], "fail", "{text}");
    for c in r["gates"]["cosine"]["cases"].as_array().unwrap() {
        assert_eq!(c["status"], "fail");
        assert_eq!(c["drift_enters"], "block 1", "{c}");
        // Block 0 is untouched.
        assert!(c["blocks"][0]["min_cos"].as_f64().unwrap() > 0.999);
    }
    assert!(text.contains("drift enters at block 1"), "{text}");
}

#[test]
fn an_ignored_padding_mask_fails_the_cosine_gate() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let a = build(t.path(), "tiny", &["b1024"], &["no-mask"], &[]);
    let (r, text) = rejected(&a, imgs.path());
    assert_eq!(r["gates"]["cosine"]["status"], "fail", "{text}");
    // The heavily padded image drifts from the first block on.
    let tiny = r["gates"]["cosine"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case"] == "tiny.png")
        .unwrap()
        .clone();
    assert_eq!(tiny["status"], "fail");
    assert_eq!(tiny["drift_enters"], "block 0");
    // And the static checker says why: softmaxes without the host's mask (R16);
    // 6 heads x 4 blocks x 2 query chunks of 512 (R4).
    let checks = r["gates"]["residency"]["buckets"][0]["checks"]
        .as_array()
        .unwrap();
    let r16 = checks.iter().find(|c| c["id"] == "R16").unwrap();
    assert_eq!(r16["status"], "warn", "{r16}");
    assert!(
        r16["detail"]
            .as_str()
            .unwrap()
            .contains("48 of 48 softmaxes take no host mask"),
        "{r16}"
    );
}

#[test]
fn a_colour_channel_swap_fails_the_cosine_gate() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let a = build(t.path(), "tiny", &["b1024"], &["swap-rb"], &[]);
    let (r, text) = rejected(&a, imgs.path());
    assert_eq!(r["gates"]["residency"]["status"], "pass", "{text}");
    assert_eq!(r["gates"]["cosine"]["status"], "fail", "{text}");
    for c in r["gates"]["cosine"]["cases"].as_array().unwrap() {
        assert_eq!(c["drift_enters"], "block 0", "{c}");
        assert!(c["blocks"][0]["min_cos"].as_f64().unwrap() < 0.98);
    }
}

#[test]
fn an_op_off_the_ane_fails_the_residency_gate() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let a = build(t.path(), "tiny", &["b1024"], &["gather"], &[]);
    let (r, text) = rejected(&a, imgs.path());
    // Numerically the identity gather is harmless: only residency fails.
    assert_eq!(r["gates"]["cosine"]["status"], "pass", "{text}");
    let res = &r["gates"]["residency"];
    assert_eq!(res["status"], "fail");
    let b = &res["buckets"][0];
    assert!(b["fraction"].as_f64().unwrap() < 1.0);
    assert_eq!(b["ops_off_ane"], 1);
    assert_eq!(b["off_ane"][0]["type"], "gather");
    assert_eq!(b["off_ane"][0]["rule"], "R8");
    let r8 = b["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "R8")
        .unwrap();
    assert_eq!(r8["status"], "fail");
    assert!(text.contains("(gather) off the ANE by R8"), "{text}");
}

#[test]
fn an_fp16_overflow_fails_the_cosine_gate_and_names_the_op() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let a = build(t.path(), "tiny", &["b1024"], &["overflow"], &[]);
    let (r, text) = rejected(&a, imgs.path());
    assert_eq!(r["gates"]["residency"]["status"], "pass", "{text}");
    for c in r["gates"]["cosine"]["cases"].as_array().unwrap() {
        assert_eq!(c["status"], "fail");
        // The fault scales block 1's residual stream by 256, 256, 1/256,
        // 1/256. That stream stays far below 256 in magnitude (the fp32
        // reference tower's block outputs peak near 7 on these images), so
        // b1_boost0 (x 256) stays within fp16, and b1_boost1 (x 65536 in
        // all) is the first op beyond 65504: its f32 products are finite
        // and saturate to inf when rounded to fp16.
        let o = &c["first_overflow"];
        assert_eq!(o["op"], "b1_boost1", "{text}");
        assert_eq!(o["kind"], "mul", "{text}");
        // ane mode counts the infs of the op's output as non-finite (and
        // those its own ceilings made as saturated: none for a mul).
        assert!(o["nonfinite"].as_u64().unwrap() > 0, "{text}");
        assert_eq!(o["saturated"], 0, "{text}");
        assert!(
            c["message"]
                .as_str()
                .unwrap()
                .contains("first overflow at op `b1_boost1` (mul): "),
            "{text}"
        );
        // The headroom names it too: infinite, past fp16's range.
        assert!(
            c["message"]
                .as_str()
                .unwrap()
                .contains("op `b1_boost1` (mul) became infinite, past fp16's range"),
            "{text}"
        );
        // The outputs are wrong (in ane mode inf - inf is +0, so they need
        // not hold an inf).
        assert!(c["outputs"][0]["min_cos"].as_f64().unwrap() < 0.9, "{text}");
        assert_eq!(c["drift_enters"], "block 1");
        // The remedy is named: Qwen3-VL's builder scales its residual stream.
        assert!(
            c["message"]
                .as_str()
                .unwrap()
                .contains("remedy: build again with"),
            "{text}"
        );
    }
    // Every overflow the gate prints names b1_boost1 (at least one per case).
    let named = text.matches("first overflow at op `").count();
    assert!(named >= 3, "{text}");
    assert_eq!(
        text.matches("first overflow at op `b1_boost1` (mul): ")
            .count(),
        named,
        "{text}"
    );
}

/// Each bucket gated alone (as a CI matrix would), then merged; tiny-a has
/// no language model, so the merge skips the VQA gate and records the result
/// without acceptance (merging into acceptance, with the VQA gate run over
/// every bucket, is `vqa::partial_runs_defer_the_vqa_gate_to_the_merge`); a
/// merge with a bucket missing, or with a report made for other bytes, is
/// refused.
#[test]
fn partial_reports_merge() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let buckets = t.path().join("buckets.yaml");
    std::fs::write(
        &buckets,
        "buckets:\n  - {name: b256, patches: 256}\n  - {name: b512, patches: 512, cosine_min: 0.99}\n",
    )
    .unwrap();
    let bf = buckets.to_str().unwrap();
    let a = build(t.path(), "tiny", &[], &[], &["--buckets", bf]);
    let (o, text) = gate(
        &a,
        imgs.path(),
        &["--merge", "--skip", "vqa", "--buckets", bf],
    );
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains("no partial reports"), "{text}");

    let (o, text) = gate(
        &a,
        imgs.path(),
        &["--bucket", "b256", "--skip", "vqa", "--buckets", bf],
    );
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(a.join("gate/partial/b256.json").is_file());
    assert_eq!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::NotGated
    );
    let (o, text) = gate(
        &a,
        imgs.path(),
        &["--merge", "--skip", "vqa", "--buckets", bf],
    );
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains("b512"), "{text}");

    let (o, text) = gate(
        &a,
        imgs.path(),
        &["--bucket", "b512", "--skip", "vqa", "--buckets", bf],
    );
    assert_eq!(o.status.code(), Some(0), "{text}");
    // Each side's seconds of the merge: the parts' added up.
    let part_seconds = |b: &str| -> serde_json::Value {
        let p = a.join(format!("gate/partial/{b}.json"));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        r["gates"]["cosine"]["seconds"].clone()
    };
    let parts = [part_seconds("b256"), part_seconds("b512")];
    // Merged with the VQA gate skipped: passed, not accepted.
    let (o, text) = gate(
        &a,
        imgs.path(),
        &["--merge", "--skip", "vqa", "--buckets", bf],
    );
    assert_eq!(o.status.code(), Some(0), "{text}");
    let r = gate_report(&a);
    assert_eq!(r["buckets"], serde_json::json!(["b256", "b512"]));
    assert_eq!(r["passed"], true);
    assert_eq!(r["accepted"], false);
    assert_eq!(r["skipped"], serde_json::json!(["vqa"]));
    assert_eq!(r["thresholds"]["b512"]["cosine_min"], 0.99);
    for side in ["reference", "artifact"] {
        let sum: f64 = parts.iter().map(|p| p[side].as_f64().unwrap()).sum();
        let merged = r["gates"]["cosine"]["seconds"][side].as_f64().unwrap();
        assert!(
            sum > 0.0 && (merged - sum).abs() < 1e-9,
            "{side}: {merged} vs {sum}"
        );
    }
    let cases = r["gates"]["cosine"]["cases"].as_array().unwrap();
    // 3 cases per bucket; wide.jpg was scaled down into b256 (at most 256 patches).
    assert_eq!(cases.len(), 6);
    let wide256 = cases
        .iter()
        .find(|c| c["bucket"] == "b256" && c["case"] == "wide.jpg")
        .unwrap();
    assert!(wide256["real_patches"].as_u64().unwrap() <= 256);
    // The two images together do not fit b256: recorded as skipped, not failed.
    let both256 = cases
        .iter()
        .find(|c| c["bucket"] == "b256" && c["case"] == "tiny.png+wide.jpg")
        .unwrap();
    assert_eq!(both256["status"], "skipped", "{both256}");
    assert_eq!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Incomplete {
            skipped: vec!["vqa".into()]
        }
    );

    // A partial report made for other bytes is refused.
    std::fs::write(a.join("host.safetensors.extra"), b"x").unwrap();
    let mp = a.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mp).unwrap()).unwrap();
    m["files"]["host.safetensors.extra"] = sha256_file(&a.join("host.safetensors.extra"))
        .unwrap()
        .into();
    std::fs::write(&mp, serde_json::to_string(&m).unwrap()).unwrap();
    let (o, text) = gate(
        &a,
        imgs.path(),
        &["--merge", "--skip", "vqa", "--buckets", bf],
    );
    assert_eq!(o.status.code(), Some(2), "{text}");
    assert!(text.contains("digest differs"), "{text}");
}

/// The HTML report is self-contained and draws its plots in a browser.
#[test]
fn the_html_report_renders_its_plots_in_chromium() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let a = build(t.path(), "tiny", &["b1024"], &["overflow"], &[]);
    let _ = gate(&a, imgs.path(), &["--skip", "vqa"]);
    let html_path = a.join("gate/report.html");
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(!html.contains("__REPORT_JSON__"));
    for bad in ["<script src", "<link ", "@import", "url(http"] {
        assert!(
            !html.contains(bad),
            "external resource {bad:?} in the report"
        );
    }
    let chromium = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|c| std::process::Command::new(c).arg("--version").output().is_ok())
        .expect("Debian's chromium is needed for this test (apt-get install chromium; `make test` installs it)");
    let profile = tempfile::tempdir().unwrap();
    // The page as headless Chromium renders it.
    let dump_dom = |page: &std::path::Path| {
        let o = std::process::Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                &format!("--user-data-dir={}", profile.path().display()),
                "--dump-dom",
                &format!("file://{}", page.display()),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let dom = dump_dom(&html_path);
    let body = dom
        .split("<body")
        .nth(1)
        .and_then(|b| b.split('>').next())
        .unwrap_or_default()
        .to_string();
    assert!(body.contains("data-errors=\"0\""), "body: {body}");
    let rendered: usize = body
        .split("data-rendered=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // One bucket: residency by op type; three outputs' token histograms; three cases' block plots.
    assert!(rendered >= 7, "{rendered} plots: {body}");
    for kind in ["residency-by-op", "token-cos-hist", "block-cos"] {
        assert!(
            dom.contains(&format!("data-plot=\"{kind}\"")),
            "no {kind} plot"
        );
    }
    assert!(
        dom.matches("class=\"mark\"").count() > 20,
        "plots without marks"
    );
    assert!(dom.contains("FAILED") && dom.contains("b1_boost"));
    // The headroom table: the ops past their limits counted, the fault's op among them.
    assert!(dom.contains("Headroom per op") && dom.contains("past their limit"));
    // The banner says what was checked; a failing gate's section comes
    // before the passing ones; the test fault is named.
    assert!(
        dom.contains("residency predicted (static checker)")
            && dom.contains("executed by mil-interpreter"),
        "banner"
    );
    let at = |id: &str| {
        dom.find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("no {id}"))
    };
    assert!(
        at("gate-cosine") < at("gate-residency"),
        "the failing cosine gate is not first"
    );
    assert!(dom.contains("deliberate test faults (overflow)"));
    // Percentages have one decimal at most.
    assert!(!dom.contains("100.00") && !dom.contains("0000%"));
    // The histograms' axis labels do not overlap: each pair of neighbours
    // is farther apart than the wider label (about 6.5 px a character),
    // also for cosines within 1.6e-6 of each other (labels of 9 characters,
    // which eight ticks had put 53 px apart).
    let i = html
        .find("id=\"report-data\"")
        .expect("the report's data element");
    let (head, rest) = html.split_at(i + html[i..].find('>').unwrap() + 1);
    let (data, tail) = rest.split_once("</script>").unwrap();
    let mut r: serde_json::Value = serde_json::from_str(data).unwrap();
    for case in r["gates"]["cosine"]["cases"].as_array_mut().unwrap() {
        for out in case["outputs"].as_array_mut().unwrap() {
            out["token_cos"] = (0..64)
                .map(|i| 0.999997 + 1.55e-6 * i as f64 / 63.0)
                .collect();
        }
    }
    let narrow = t.path().join("narrow.html");
    let data = serde_json::to_string(&r).unwrap().replace('<', "\\u003c");
    std::fs::write(&narrow, format!("{head}{data}</script>{tail}")).unwrap();
    let dom = dump_dom(&narrow);
    assert!(
        dom.contains("data-plot=\"token-cos-hist\""),
        "no histogram drawn"
    );
    for svg in dom.split("data-plot=\"token-cos-hist\"").skip(1) {
        let svg = svg.split("</svg>").next().unwrap();
        let mut labels: Vec<(f64, usize)> = Vec::new();
        for t in svg.split("<text x=\"").skip(1) {
            let x: f64 = t.split('"').next().unwrap().parse().unwrap_or(f64::NAN);
            let Some(rest) = t.split("text-anchor=\"middle\">").nth(1) else {
                continue;
            };
            let label = rest.split('<').next().unwrap();
            if label.parse::<f64>().is_ok() && x.is_finite() {
                labels.push((x, label.len()));
            }
        }
        assert!(labels.len() >= 2, "no axis labels: {svg}");
        for w in labels.windows(2) {
            let gap = (w[1].0 - w[0].0).abs();
            let need = w[0].1.max(w[1].1) as f64 * 6.5;
            assert!(
                gap >= need,
                "labels {gap:.1} px apart need {need:.1}: {labels:?}"
            );
        }
    }
}

/// A run that skips every gate checks nothing: it exits 0 (nothing that ran
/// failed) but records the skips, and neither the manifest nor `ane-run`
/// takes the artifact as accepted.
#[test]
fn skipping_gates_never_accepts() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let a = build(t.path(), "tiny", &["b1024"], &[], &[]);
    let all = ["--skip", "residency", "--skip", "cosine", "--skip", "vqa"];
    let (o, text) = gate(&a, imgs.path(), &all);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains("not accepted (the cosine, residency, vqa gates were skipped"),
        "{text}"
    );
    let r = gate_report(&a);
    assert_eq!(r["accepted"], false);
    assert_eq!(
        r["skipped"],
        serde_json::json!(["cosine", "residency", "vqa"])
    );
    let art = Artifact::open(&a).unwrap();
    assert_eq!(art.manifest["gates"]["accepted"], false);
    assert_eq!(
        art.acceptance(),
        Acceptance::Incomplete {
            skipped: vec!["cosine".into(), "residency".into(), "vqa".into()]
        }
    );
    let embed = |extra: &[&str]| {
        let img = crate::common::golden("images/tiny.png");
        let mut args = vec![
            "embed",
            "--artifact",
            a.to_str().unwrap(),
            img.to_str().unwrap(),
            "--out",
        ];
        let out = t.path().join("emb");
        let out = out.to_str().unwrap().to_string();
        args.push(&out);
        args.extend(extra);
        run("ane-run", &args)
    };
    let o = embed(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("gated with the cosine, residency, vqa gates skipped")
            && err.contains("--allow-unaccepted"),
        "{err}"
    );
    let o = embed(&["--allow-unaccepted"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning") && err.contains("cosine, residency, vqa gates skipped"),
        "{err}"
    );

    // One gate skipped: the others ran and passed, still not accepted.
    let (o, text) = gate(&a, imgs.path(), &["--skip", "cosine", "--skip", "vqa"]);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert_eq!(gate_report(&a)["gates"]["residency"]["status"], "pass");
    assert_eq!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Incomplete {
            skipped: vec!["cosine".into(), "vqa".into()]
        }
    );
}

/// Subtle faults, of the kind a port gets wrong: each is built into tiny-a
/// and rejected by the cosine gate at the default threshold (buckets.yaml),
/// while the residency gate still passes it (they are not placement faults).
/// The images include extreme.png, a long thin image whose grid is far from
/// the position table's, where rope-theta and pos-align show most.
/// The reference side preprocesses with the checkpoint's own config, never
/// the manifest's: an artifact whose manifest records another normalisation
/// (the hashes recomputed, so that only the numbers can tell) fails the
/// cosine gate, while the same artifact unedited passes.
#[test]
fn a_manifest_recording_other_preprocessing_fails_the_cosine_gate() {
    let t = tempfile::tempdir().unwrap();
    let imgs = images();
    let a = build(t.path(), "pre", &["b1024"], &[], &[]);
    let (o, text) = gate(&a, imgs.path(), &["--skip", "vqa"]);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let mp = a.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mp).unwrap()).unwrap();
    assert_eq!(
        m["preprocessing"]["image_mean"],
        serde_json::json!([0.5, 0.5, 0.5])
    );
    m["preprocessing"]["image_mean"] = serde_json::json!([0.45, 0.5, 0.5]);
    std::fs::write(&mp, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    rehash(&a);
    let (o, text) = gate(&a, imgs.path(), &["--skip", "vqa"]);
    assert_eq!(o.status.code(), Some(1), "{text}");
    let r = gate_report(&a);
    assert_eq!(r["gates"]["cosine"]["status"], "fail", "{text}");
    assert_eq!(r["gates"]["residency"]["status"], "pass", "{text}");
}

#[test]
fn subtle_faults_are_rejected_at_the_default_threshold() {
    let t = tempfile::tempdir().unwrap();
    let imgs = golden_images(&["wide.jpg", "tiny.png", "extreme.png"]);
    let default = ane_export::buckets::BucketsFile::parse(ane_export::buckets::DEFAULT)
        .unwrap()
        .gates
        .cosine_min;
    for fault in [
        "rope-theta",
        "swap-heads",
        "pos-align",
        "merge-order",
        "int8-axis",
    ] {
        let a = build(t.path(), fault, &["b1024"], &[fault], &[]);
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(a.join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(m["test_faults"], serde_json::json!([fault]));
        let (o, text) = gate(&a, imgs.path(), &["--skip", "vqa"]);
        assert_eq!(o.status.code(), Some(1), "{fault}: {text}");
        let r = gate_report(&a);
        assert_eq!(r["thresholds"]["b1024"]["cosine_min"], default, "{fault}");
        assert_eq!(r["gates"]["residency"]["status"], "pass", "{fault}: {text}");
        assert_eq!(r["gates"]["cosine"]["status"], "fail", "{fault}: {text}");
        let cases = r["gates"]["cosine"]["cases"].as_array().unwrap();
        let worst = cases
            .iter()
            .flat_map(|c| c["outputs"].as_array().unwrap())
            .map(|o| o["min_cos"].as_f64().unwrap())
            .fold(f64::INFINITY, f64::min);
        assert!(worst < default, "{fault}: lowest cosine {worst}");
        eprintln!("{fault}: lowest cosine {worst:.6}");
        assert_eq!(r["gates"]["cosine"]["constants"], serde_json::json!([]));
        assert_eq!(
            Artifact::open(&a).unwrap().acceptance(),
            Acceptance::Rejected,
            "{fault}"
        );
    }
    // A LayerNorm epsilon 10x too large is below fp16 rounding: every case
    // passes, and the check of the program's constants against the
    // reference's rejects it, naming the op.
    let a = build(t.path(), "ln-eps", &["b1024"], &["ln-eps"], &[]);
    let (o, text) = gate(&a, imgs.path(), &["--skip", "vqa"]);
    assert_eq!(o.status.code(), Some(1), "ln-eps: {text}");
    let r = gate_report(&a);
    let c = &r["gates"]["cosine"];
    assert_eq!(c["status"], "fail", "{text}");
    let cases = c["cases"].as_array().unwrap();
    assert!(
        cases.iter().any(|c| c["status"] == "pass")
            && cases
                .iter()
                .all(|c| c["status"] == "pass" || c["status"] == "skipped"),
        "{text}"
    );
    let constants = c["constants"].as_array().unwrap();
    // Two LayerNorms per block (4 blocks), the merger's and 2 deepstack mergers'.
    assert_eq!(constants.len(), 11, "{constants:?}");
    assert!(
        constants[0]
            .as_str()
            .unwrap()
            .starts_with("b1024: `b0_norm1` (layer_norm): epsilon 1.0013580322265625e-5"),
        "{constants:?}"
    );
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("11 program constants differ from the reference's"),
        "{text}"
    );

    // The host-side faults live in the manifest's host recipe, which the
    // runtime reads: the artifact computes its inputs the wrong way.
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(t.path().join("rope-theta/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["host"]["rope_theta"], 100000.0);
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(t.path().join("pos-align/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["host"]["pos_interpolation"], "bilinear_half_pixel");
}
