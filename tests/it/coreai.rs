//! Core AI (issue 52): `build --format both` ships the `.aimodel` translated
//! from the package, listed and hashed in the manifest, and `--format
//! aimodel` the `.aimodel` alone; `exec --executor coreai` and `ane-run
//! --executor coreai` run it with Apple's Core AI runtime; the gates
//! execute each format with its own executor; the errors. coreai-core is pinned in the project's venv (as coremltools is),
//! so these tests run wherever the others do, CI included: a venv without
//! it fails them, naming the pin, rather than skipping them.

use std::path::Path;

use ane_export::artifact::{Acceptance, Artifact, Cleared, sha256_file};

use crate::common::{
    assert_fails, assert_schema, build_model, build_tiny, gate_report, golden, golden_images, run,
};

fn manifest(a: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(a.join("manifest.json")).unwrap()).unwrap()
}

/// The manifest of an artifact built with `--format both` lists both
/// formats, names the `.aimodel` and each bucket's function in it (named
/// like the bucket), and hashes every file of the `.aimodel`.
fn assert_both(a: &Path, name: &str, buckets: &[&str]) {
    let m = manifest(a);
    assert_schema("manifest", &m);
    assert_eq!(m["formats"], serde_json::json!(["mlpackage", "aimodel"]));
    let aimodel = format!("{name}.aimodel");
    assert_eq!(m["aimodel"], aimodel.as_str());
    let got: Vec<&str> = m["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            assert_eq!(b["aimodel_function"], b["name"], "{b}");
            b["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(got, buckets);
    // Every function the translation wrote, with its Core AI ops.
    let functions = m["coreai"]["functions"].as_object().unwrap();
    assert_eq!(functions.keys().map(|k| k.as_str()).collect::<Vec<_>>(), {
        let mut b = buckets.to_vec();
        b.sort();
        b
    });
    assert!(
        functions
            .values()
            .all(|f| f["ops"]["coreai.conv2d"].as_u64() > Some(0)),
        "{functions:?}"
    );
    let files = m["files"].as_object().unwrap();
    let under: Vec<&String> = files
        .keys()
        .filter(|k| k.starts_with(&format!("{aimodel}/")))
        .collect();
    assert!(
        under.iter().any(|k| k.ends_with("/main.mlirb")),
        "{under:?}"
    );
    for k in under {
        assert_eq!(
            files[k].as_str().unwrap(),
            sha256_file(&a.join(k)).unwrap(),
            "{k}"
        );
    }
    // The artifact opens and verifies, with its program.
    let art = Cleared::without_acceptance(a).unwrap();
    assert_eq!(art.artifact().aimodel.as_deref(), Some(aimodel.as_str()));
}

#[test]
fn build_format_both_ships_one_aimodel_with_a_function_per_bucket() {
    let t = tempfile::tempdir().unwrap();
    // One multifunction package: one .aimodel, a function per bucket.
    let a = build_tiny(t.path(), "tiny", &["b1024", "b4096"], &["--format", "both"]);
    assert_both(&a, "tiny", &["b1024", "b4096"]);
    assert!(a.join("tiny.mlpackage").is_dir());
    // A package per bucket: still one .aimodel (tiny-clip, an encoder of
    // another family, at its processor's size).
    let c = build_model(
        &golden("models/tiny-clip"),
        t.path(),
        "clip",
        &[],
        &["--format", "both", "--per-bucket"],
    );
    let m = manifest(&c);
    let names: Vec<&str> = m["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_both(&c, "clip", &names);
    assert_eq!(m["multifunction"], false);
    // The default ships the package alone, as before.
    let p = build_tiny(t.path(), "plain", &["b1024"], &[]);
    let m = manifest(&p);
    assert_eq!(m["formats"], serde_json::json!(["mlpackage"]));
    assert!(m.get("aimodel").is_none() && !p.join("plain.aimodel").exists());
    assert!(
        m["buckets"][0].get("aimodel_function").is_none(),
        "{}",
        m["buckets"][0]
    );
}

#[test]
fn an_old_manifest_without_formats_is_a_package_alone() {
    let t = tempfile::tempdir().unwrap();
    let a = build_tiny(t.path(), "tiny", &["b1024"], &[]);
    let mp = a.join("manifest.json");
    let mut m = manifest(&a);
    m.as_object_mut().unwrap().remove("formats");
    std::fs::write(&mp, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let art = Artifact::open(&a).unwrap();
    assert_eq!(art.aimodel, None);
    // A manifest that lists the .aimodel without naming it is refused.
    m["formats"] = serde_json::json!(["mlpackage", "aimodel"]);
    std::fs::write(&mp, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let e = Artifact::open(&a).unwrap_err().to_string();
    assert!(e.contains("aimodel"), "{e}");
    assert!(
        crate::common::schema_errors("manifest", &m)
            .iter()
            .any(|e| e.contains("aimodel")),
        "the schema takes an .aimodel listed without its name"
    );
    // The package listed, a bucket without it: refused by both.
    m["formats"] = serde_json::json!(["mlpackage"]);
    m["buckets"][0].as_object_mut().unwrap().remove("package");
    std::fs::write(&mp, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let e = Artifact::open(&a).unwrap_err().to_string();
    assert!(e.contains("buckets[].package"), "{e}");
    assert!(
        crate::common::schema_errors("manifest", &m)
            .iter()
            .any(|e| e.contains("package")),
        "the schema takes a bucket without its package"
    );
}

/// `exec --executor coreai` runs a bucket's function of the `.aimodel` on
/// the host inputs the interpreter runs in the package, and the two agree.
#[test]
fn exec_coreai_agrees_with_the_interpreter_on_the_package() {
    let t = tempfile::tempdir().unwrap();
    let a = build_tiny(t.path(), "tiny", &["b1024"], &["--format", "both"]);
    let inputs = t.path().join("in.safetensors");
    let o = run(
        "ane-run",
        &[
            "host-inputs",
            "--artifact",
            a.to_str().unwrap(),
            "--bucket",
            "b1024",
            "--image",
            golden("images/wide.jpg").to_str().unwrap(),
            "--out",
            inputs.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (ai, mil) = (
        t.path().join("ai.safetensors"),
        t.path().join("mil.safetensors"),
    );
    let o = run(
        "ane-export",
        &[
            "exec",
            a.join("tiny.aimodel").to_str().unwrap(),
            "--executor",
            "coreai",
            "--function",
            "b1024",
            "--inputs",
            inputs.to_str().unwrap(),
            "--out",
            ai.to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("on coreai-runtime"), "{err}");
    let o = run(
        "ane-export",
        &[
            "exec",
            a.join("tiny.mlpackage").to_str().unwrap(),
            "--function",
            "b1024",
            "--precision",
            "fp16",
            "--inputs",
            inputs.to_str().unwrap(),
            "--out",
            mil.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (ai, _) = crate::common::read_all(&ai);
    let (mil, _) = crate::common::read_all(&mil);
    let mut names: Vec<&String> = mil.keys().collect();
    names.sort();
    let mut got: Vec<&String> = ai.keys().collect();
    got.sort();
    assert_eq!(got, names);
    for name in names {
        let (x, y) = (&mil[name], &ai[name]);
        assert_eq!(x.shape, y.shape, "{name}");
        let dot: f64 = x
            .f32
            .iter()
            .zip(&y.f32)
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum();
        let n = |v: &[f32]| v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
        let cos = dot / (n(&x.f32) * n(&y.f32));
        println!("exec {name}: cosine {cos} between Core AI and the interpreter in fp16");
        assert!(cos > 0.999, "{name}: cosine {cos}");
    }
    // ane-run embeds and benchmarks with it too, saying what ran.
    let out = t.path().join("embed");
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            a.to_str().unwrap(),
            "--executor",
            "coreai",
            "--allow-unaccepted",
            "--out",
            out.to_str().unwrap(),
            golden("images/tiny.png").to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("coreai-runtime"), "{err}");
    let (e, meta) = crate::common::read_all(&out.join("tiny.safetensors"));
    assert_eq!(meta["bucket"], "b1024");
    assert!(e["embeds"].f32.iter().all(|v| v.is_finite()));
    let o = run(
        "ane-run",
        &[
            "bench",
            "--artifact",
            a.to_str().unwrap(),
            "--executor",
            "coreai",
            "--allow-unaccepted",
            "--warmup",
            "0",
            "--runs",
            "1",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let b: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        b["results"][0]["executor"]
            .as_str()
            .unwrap()
            .starts_with("coreai-runtime"),
        "{b}"
    );
}

#[test]
fn coreai_without_an_aimodel_or_a_function_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let a = build_tiny(t.path(), "tiny", &["b1024"], &[]);
    let img = golden("images/wide.jpg");
    // An artifact without an .aimodel: named, with the build's --format.
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            a.to_str().unwrap(),
            "--executor",
            "coreai",
            "--allow-unaccepted",
            "--out",
            t.path().join("e").to_str().unwrap(),
            img.to_str().unwrap(),
        ],
    );
    assert_fails(
        &o,
        &[
            a.join("manifest.json").to_str().unwrap(),
            "no .aimodel",
            "--format aimodel or --format both",
        ],
    );
    let o = run(
        "ane-export",
        &[
            "gate",
            a.to_str().unwrap(),
            "--executor",
            "coreai",
            "--skip",
            "vqa",
        ],
    );
    assert_fails(&o, &["no .aimodel", "--format aimodel or --format both"]);
    // exec: a package is not a Core AI program; a program needs --function.
    let out = t.path().join("out.safetensors");
    let inputs = t.path().join("in.safetensors");
    std::fs::write(&inputs, b"").unwrap();
    let exec = |model: &Path, extra: &[&str]| {
        let mut args = vec![
            "exec",
            model.to_str().unwrap(),
            "--executor",
            "coreai",
            "--inputs",
            inputs.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        run("ane-export", &args)
    };
    assert_fails(
        &exec(&a.join("tiny.mlpackage"), &["--function", "b1024"]),
        &["tiny.mlpackage", "not a Core AI program"],
    );
    let fake = t.path().join("x.aimodel");
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(fake.join("main.mlirb"), b"").unwrap();
    assert_fails(&exec(&fake, &[]), &["x.aimodel", "--function"]);
    assert!(!out.exists(), "nothing written");
}

/// `--format aimodel` ships the `.aimodel` alone (the package emitted to
/// translate it, and left out): the gates and `ane-run` run it with Core
/// AI by default, and refuse the interpreter, naming the artifact.
#[test]
fn build_format_aimodel_ships_the_program_alone() {
    let t = tempfile::tempdir().unwrap();
    let imgs = golden_images(&["wide.jpg", "tiny.png"]);
    let a = build_tiny(t.path(), "ai", &["b1024"], &["--format", "aimodel"]);
    let m = manifest(&a);
    assert_schema("manifest", &m);
    assert_eq!(m["formats"], serde_json::json!(["aimodel"]));
    assert_eq!(m["aimodel"], "ai.aimodel");
    let b = &m["buckets"][0];
    assert!(
        b.get("package").is_none() && b.get("function").is_none(),
        "{b}"
    );
    assert_eq!(b["aimodel_function"], "b1024");
    let mut entries: Vec<String> = std::fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    entries.sort();
    assert_eq!(entries, ["ai.aimodel", "host.safetensors", "manifest.json"]);
    assert!(
        m["files"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.contains("mlpackage")),
        "{}",
        m["files"]
    );
    // The build's summary says what it shipped.
    let o = run(
        "ane-export",
        &[
            "build",
            "--model",
            golden("models/tiny-a").to_str().unwrap(),
            "--out",
            t.path().join("ai2").to_str().unwrap(),
            "--bucket",
            "b1024",
            "--format",
            "aimodel",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["formats"], serde_json::json!(["aimodel"]));
    assert_eq!(summary["aimodel"], "ai2.aimodel");
    assert_eq!(summary["packages"], serde_json::json!([]));
    // Gated with Core AI by default; the interpreter is refused, named.
    let gate = |extra: &[&str]| {
        let mut args = vec![
            "gate",
            a.to_str().unwrap(),
            "--images",
            imgs.path().to_str().unwrap(),
            "--skip",
            "vqa",
        ];
        args.extend(extra);
        run("ane-export", &args)
    };
    let o = gate(&[]);
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let r = gate_report(&a);
    assert_schema("report", &r);
    assert_eq!(r["format"], "aimodel");
    assert_eq!(r["gates"]["residency"]["source"], "coreai-predicted");
    assert_eq!(r["gates"]["cosine"]["status"], "pass", "{text}");
    assert!(
        r["gates"]["cosine"]["executor"]
            .as_str()
            .unwrap()
            .starts_with("coreai-runtime")
    );
    // Every gate that ran passed; VQA skipped keeps it from acceptance.
    assert!(text.contains("the vqa gate was skipped"), "{text}");
    assert!(matches!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Incomplete { .. }
    ));
    assert_fails(
        &gate(&["--executor", "mil"]),
        &[
            a.join("manifest.json").to_str().unwrap(),
            "ships the .aimodel alone",
            "--executor coreai",
        ],
    );
    // ane-run runs it with Core AI by default.
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            a.to_str().unwrap(),
            "--allow-unaccepted",
            "--out",
            t.path().join("e").to_str().unwrap(),
            golden("images/tiny.png").to_str().unwrap(),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && err.contains("coreai-runtime"),
        "{err}"
    );
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            a.to_str().unwrap(),
            "--executor",
            "mil",
            "--allow-unaccepted",
            "--out",
            t.path().join("e2").to_str().unwrap(),
            golden("images/tiny.png").to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["ships the .aimodel alone"]);
}

/// The gates on an artifact with both formats execute each with its own
/// executor: the package with the interpreter, the `.aimodel` with Core AI,
/// the report saying which ran what; a corrupted `.aimodel` weight is
/// rejected by the `.aimodel`'s cosine gate while the package passes.
#[test]
fn the_gates_run_each_format_with_its_own_executor() {
    let t = tempfile::tempdir().unwrap();
    let imgs = golden_images(&["wide.jpg", "tiny.png"]);
    let a = build_tiny(t.path(), "tiny", &["b1024"], &["--format", "both"]);
    let gate = |extra: &[&str]| {
        let mut args = vec![
            "gate",
            a.to_str().unwrap(),
            "--images",
            imgs.path().to_str().unwrap(),
            "--skip",
            "vqa",
        ];
        args.extend(extra);
        let o = run("ane-export", &args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!text.contains("panicked"), "{text}");
        (o, text)
    };
    let (o, text) = gate(&[]);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let r = gate_report(&a);
    assert_schema("report", &r);
    assert_eq!(r["format"], "mlpackage");
    assert_eq!(r["gates"]["cosine"]["executor"], "mil-interpreter ane");
    assert_eq!(r["gates"]["residency"]["source"], "predicted");
    let ai = &r["aimodel"];
    assert!(
        ai["cosine"]["executor"]
            .as_str()
            .unwrap()
            .starts_with("coreai-runtime"),
        "{}",
        ai["cosine"]
    );
    assert_eq!(ai["residency"]["source"], "coreai-predicted");
    assert_eq!(ai["residency"]["status"], "pass", "{}", ai["residency"]);
    assert_eq!(
        ai["cosine"]["status"], "pass",
        "{}",
        ai["cosine"]["message"]
    );
    assert!(
        text.contains("the .aimodel, executed by the Core AI runtime"),
        "{text}"
    );
    let m = manifest(&a);
    assert_schema("manifest", &m);
    assert_eq!(m["gates"]["aimodel"]["cosine"]["status"], "pass");
    // The HTML report shows both formats' gates, and renders without error.
    let dom = rendered(&a.join("gate/report.html"));
    assert!(dom.contains("data-errors=\"0\""), "rendering errors");
    assert!(
        dom.contains("The .aimodel, executed by the Core AI runtime")
            && dom.contains("residency predicted (static rules on the Core AI ops)")
            && dom.contains("executed by coreai-runtime"),
        "no .aimodel section"
    );
    // vqa skipped: not accepted, whichever format.
    assert!(matches!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Incomplete { .. }
    ));

    // --executor coreai gates the .aimodel alone, and accepts nothing.
    let (o, text) = gate(&["--executor", "coreai"]);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let r = gate_report(&a);
    assert_schema("report", &r);
    assert_schema("manifest", &manifest(&a));
    assert_eq!(r["format"], "aimodel");
    assert!(r.get("aimodel").is_none());
    assert_eq!(r["gates"]["residency"]["source"], "coreai-predicted");
    assert!(
        text.contains("the .aimodel alone (--executor coreai)"),
        "{text}"
    );

    // A weight of the .aimodel corrupted (the files rehashed, so that only
    // the numbers can tell): the package passes, the .aimodel fails.
    corrupt_aimodel_weight(&a.join("tiny.aimodel"));
    let mp = a.join("manifest.json");
    let mut m = manifest(&a);
    let files: Vec<String> = m["files"].as_object().unwrap().keys().cloned().collect();
    for f in files {
        m["files"][&f] = sha256_file(&a.join(&f)).unwrap().into();
    }
    std::fs::write(&mp, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let (o, text) = gate(&[]);
    assert_eq!(o.status.code(), Some(1), "{text}");
    let r = gate_report(&a);
    assert_eq!(r["gates"]["cosine"]["status"], "pass");
    assert_eq!(
        r["aimodel"]["cosine"]["status"], "fail",
        "{}",
        r["aimodel"]["cosine"]["message"]
    );
}

/// The page as headless Chromium renders it (as the gate's HTML test does).
fn rendered(page: &Path) -> String {
    let chromium = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|c| std::process::Command::new(c).arg("--version").output().is_ok())
        .expect("Debian's chromium is needed for this test (apt-get install chromium; `make test` installs it)");
    let profile = tempfile::tempdir().unwrap();
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
}

/// Scale a stretch of the largest weight blob in the program's bytecode
/// (the blobs are stored raw, fp16) by 4, leaving its structure intact, and
/// rewrite `main.hash` (the bytecode's sha256) to match.
fn corrupt_aimodel_weight(aimodel: &Path) {
    let p = aimodel.join("main.mlirb");
    let mut bytes = std::fs::read(&p).unwrap();
    // The middle of the file lies inside the weights of any tower: a
    // stretch of 256 fp16 values there, each multiplied by 4 (exponent + 2).
    let mid = (bytes.len() / 2) & !1;
    for i in (mid..mid + 512).step_by(2) {
        let v = half::f16::from_le_bytes([bytes[i], bytes[i + 1]]);
        if v.is_finite() && v.to_f32().abs() < 1000.0 {
            let w = half::f16::from_f32(v.to_f32() * 4.0 + 0.5);
            bytes[i..i + 2].copy_from_slice(&w.to_le_bytes());
        }
    }
    std::fs::write(&p, &bytes).unwrap();
    use sha2::Digest;
    std::fs::write(aimodel.join("main.hash"), sha2::Sha256::digest(&bytes)).unwrap();
}

/// The first `n` golden questions in a file of their own (image paths made
/// absolute), for a VQA gate that runs each tower on a few images.
fn some_questions(dir: &Path, n: usize) -> std::path::PathBuf {
    let src = golden("vqa/questions.jsonl");
    let base = src.parent().unwrap();
    let lines: Vec<String> = std::fs::read_to_string(&src)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .map(|l| {
            let mut q: serde_json::Value = serde_json::from_str(l).unwrap();
            q["image"] = base
                .join(q["image"].as_str().unwrap())
                .to_str()
                .unwrap()
                .into();
            q.to_string()
        })
        .collect();
    let p = dir.join("questions.jsonl");
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

/// An artifact with both formats gated bucket by bucket and merged: the
/// `.aimodel`'s gates are merged too, the VQA gate runs for each format,
/// and the artifact is accepted only with both; `--executor coreai` alone
/// then leaves it unaccepted.
#[test]
fn partial_reports_of_both_formats_merge_into_an_acceptance() {
    let t = tempfile::tempdir().unwrap();
    let a = build_model(
        &golden("tiny-vlm"),
        t.path(),
        "vlm",
        &[],
        &["--format", "both"],
    );
    let imgs = golden_images(&["tiny.png"]);
    let questions = some_questions(t.path(), 8);
    let (a_s, imgs_s, q_s) = (
        a.to_str().unwrap(),
        imgs.path().to_str().unwrap(),
        questions.to_str().unwrap(),
    );
    let gate = |extra: &[&str]| {
        let mut args = vec!["gate", a_s, "--images", imgs_s, "--vqa", q_s];
        args.extend(extra);
        let o = run("ane-export", &args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!text.contains("panicked"), "{text}");
        (o, text)
    };
    let buckets: Vec<String> = manifest(&a)["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect();
    assert!(buckets.len() >= 2, "{buckets:?}");
    for b in &buckets {
        let (o, text) = gate(&["--bucket", b]);
        assert_eq!(o.status.code(), Some(0), "{text}");
    }
    let (o, text) = gate(&["--merge"]);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let r = gate_report(&a);
    assert_schema("report", &r);
    let ai = &r["aimodel"];
    assert_eq!(
        ai["residency"]["buckets"].as_array().unwrap().len(),
        buckets.len()
    );
    assert_eq!(ai["cosine"]["status"], "pass", "{text}");
    assert_eq!(ai["vqa"]["status"], "pass", "{text}");
    assert!(r["accepted"].as_bool().unwrap(), "{text}");
    assert_schema("manifest", &manifest(&a));
    assert_eq!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Accepted
    );
    // Accepted: ane-run takes it with Core AI, without --allow-unaccepted.
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            a_s,
            "--executor",
            "coreai",
            "--out",
            t.path().join("e").to_str().unwrap(),
            golden("images/tiny.png").to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A manifest whose record lost the .aimodel's gates is not accepted.
    let mp = a.join("manifest.json");
    let kept = std::fs::read_to_string(&mp).unwrap();
    let mut m = manifest(&a);
    m["gates"]["aimodel"]["cosine"]["status"] = "fail".into();
    std::fs::write(&mp, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    assert_eq!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Rejected
    );
    std::fs::write(&mp, kept).unwrap();
    // The .aimodel alone passes, but accepts nothing.
    let (o, text) = gate(&["--executor", "coreai"]);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert_eq!(gate_report(&a)["accepted"], false);
    assert!(
        text.contains(
            "--executor coreai gated the .aimodel alone: acceptance needs the package gated too"
        ),
        "{text}"
    );
    assert_eq!(
        Artifact::open(&a).unwrap().acceptance(),
        Acceptance::Rejected
    );
}

/// Every family's golden (and tiny-a's massive activations), built with both
/// formats, passes residency and the cosine gate in each format, the
/// `.aimodel` executed by Core AI, each within cosine 0.9999 of the
/// reference on natural and stress images; the third gate judges both
/// formats alike.
/// The Qwen goldens (random language models: their VQA gate cannot judge,
/// `tiny-vlm`'s VQA gate runs per format above) skip it and are built at
/// b1024 alone (the Linux runtime runs their b4096 graphs in seconds per
/// image: docs/formats.md), the encoders at their default bucket, their
/// task gate run in each format.
#[test]
fn every_family_passes_the_gates_in_both_formats() {
    let t = tempfile::tempdir().unwrap();
    let imgs = tempfile::tempdir().unwrap();
    for n in ["wide.jpg", "tall.png", "gray.jpg"] {
        std::fs::copy(golden(&format!("images/{n}")), imgs.path().join(n)).unwrap();
    }
    for n in ["checker2-448.png", "text-448.png"] {
        std::fs::copy(golden(&format!("images-stress/{n}")), imgs.path().join(n)).unwrap();
    }
    let families = [
        ("tiny-a", true),
        // Massive activations (a calibrated residual scale): the layer
        // norm's squares would overflow fp16 without the translation's care.
        ("tiny-a-massive32k", true),
        ("tiny-q25", true),
        ("tiny-q2", true),
        ("tiny-clip", false),
        ("tiny-siglip", false),
        ("tiny-siglip2", false),
        ("tiny-dinov2", false),
    ];
    for (model, qwen) in families {
        let buckets: &[&str] = if qwen { &["b1024"] } else { &[] };
        let a = build_model(
            &golden(&format!("models/{model}")),
            t.path(),
            model,
            buckets,
            &["--format", "both"],
        );
        let mut args = vec![
            "gate",
            a.to_str().unwrap(),
            "--images",
            imgs.path().to_str().unwrap(),
        ];
        if qwen {
            args.extend(["--skip", "vqa"]);
        }
        let o = run("ane-export", &args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(o.status.code(), Some(0), "{model}: {text}");
        let r = gate_report(&a);
        assert_schema("report", &r);
        let ai = &r["aimodel"];
        for (what, g) in [("package", &r["gates"]), ("aimodel", ai)] {
            for gate in ["residency", "cosine"] {
                assert_eq!(
                    g[gate]["status"], "pass",
                    "{model} {what} {gate}: {}",
                    g[gate]["message"]
                );
            }
        }
        // The same cases in both: each image alone (and any that fit one
        // call together, as the gate batches them).
        let cases = |g: &serde_json::Value| g["cosine"]["cases"].as_array().unwrap().len();
        assert!(cases(&r["gates"]) >= 5, "{model}");
        assert_eq!(cases(&r["gates"]), cases(ai), "{model}");
        // Both executors within fp16's reach of the reference, far above the
        // gate's threshold: the translation computes the package's function.
        let lowest = |g: &serde_json::Value| {
            g["cosine"]["cases"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|c| c["outputs"].as_array().unwrap())
                .map(|o| o["min_cos"].as_f64().unwrap())
                .fold(f64::INFINITY, f64::min)
        };
        for (what, g) in [("package", &r["gates"]), ("aimodel", ai)] {
            assert!(
                lowest(g) >= 0.9999,
                "{model} {what}: lowest cosine {}",
                lowest(g)
            );
        }
        assert!(
            ai["cosine"]["executor"]
                .as_str()
                .unwrap()
                .starts_with("coreai-runtime"),
            "{model}"
        );
        assert_eq!(ai["residency"]["source"], "coreai-predicted");
        let third = if qwen { "vqa" } else { "task" };
        assert_eq!(
            r["gates"][third]["status"], ai[third]["status"],
            "{model}: the {third} gate judged the formats differently"
        );
        if !qwen {
            assert_eq!(ai["task"]["status"], "pass", "{model}: {}", ai["task"]);
            assert!(
                matches!(
                    Artifact::open(&a).unwrap().acceptance(),
                    Acceptance::Accepted
                ),
                "{model}: both formats passed every gate, yet not accepted"
            );
        }
    }
}
