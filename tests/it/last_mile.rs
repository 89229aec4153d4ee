//! What a new user must never meet: a build that deletes files it did not
//! write, artifacts accepted that should not be (a config that drops
//! blocks, deliberate test faults, a VQA gate whose language model answers
//! nothing right, SigLIP2 with the default buckets never accepted), and
//! artifacts written private to their builder whatever the umask.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ane_export::artifact::{Acceptance, Artifact};
use serde_json::Value;

use crate::common::{
    assert_fails, build_model, copy_model, gate_report, golden, golden_images, run, schema_errors,
};

/// `ane-export gate ART` with `extra` arguments.
fn gate(art: &Path, extra: &[&str]) -> std::process::Output {
    let mut a = vec!["gate", art.to_str().unwrap()];
    a.extend(extra);
    run("ane-export", &a)
}

fn build(model: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut a = vec![
        "build",
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--bucket",
        "b1024",
    ];
    a.extend(extra);
    run("ane-export", &a)
}

/// `--force` replaces an artifact and nothing else: a directory of the
/// user's files is refused (exit 2) and left whole; an empty directory is
/// built into without `--force`.
#[test]
fn force_never_replaces_what_is_not_an_artifact() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-a");
    let mine = t.path().join("photos");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("holiday.jpg"), b"not to be lost").unwrap();
    for extra in [&[][..], &["--force"][..]] {
        let o = build(&model, &mine, extra);
        assert_fails(&o, &["photos", "is not an artifact", "even with --force"]);
        assert_eq!(
            std::fs::read(mine.join("holiday.jpg")).unwrap(),
            b"not to be lost"
        );
        assert_eq!(std::fs::read_dir(&mine).unwrap().count(), 1);
    }
    // An empty directory: no --force needed.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = build(&model, &empty, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(empty.join("manifest.json").is_file());
    // Now an artifact: replaced only with --force.
    assert_fails(&build(&model, &empty, &[]), &["already exists", "--force"]);
    let o = build(&model, &empty, &["--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Artifacts, host tables and reports follow the umask like any other file
/// the user writes (they were 0600 and the directory 0700).
#[test]
fn artifact_files_follow_the_umask() {
    let t = tempfile::tempdir().unwrap();
    // The test binary's umask is the one the child inherits (022 here and in
    // CI; whatever it is, the modes must be 0666/0777 less it).
    // SAFETY: umask is read by setting it and putting it back at once.
    let mask = unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m as u32
    };
    let art = build_model(&golden("models/tiny-a"), t.path(), "a", &["b1024"], &[]);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&art), 0o777 & !mask, "the artifact directory");
    for f in ["manifest.json", "host.safetensors"] {
        assert_eq!(mode(&art.join(f)), 0o666 & !mask, "{f}");
    }
    let imgs = golden_images(&["tiny.png"]);
    let o = gate(
        &art,
        &["--images", imgs.path().to_str().unwrap(), "--skip", "vqa"],
    );
    assert!(o.status.code().is_some_and(|c| c < 2), "{o:?}");
    for f in ["gate/report.json", "gate/report.html", "manifest.json"] {
        assert_eq!(mode(&art.join(f)), 0o666 & !mask, "{f}");
    }
}

/// A config describing fewer blocks than the checkpoint saved would build
/// and pass every gate (the reference reads the same config): the tensors
/// no layer reads are an error naming them, in `build` and `reference`.
#[test]
fn a_config_that_leaves_tower_tensors_unread_is_refused() {
    let m = copy_model("tiny-a");
    let cfg_path = m.path().join("config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let depth = cfg["vision_config"]["depth"].as_u64().unwrap();
    cfg["vision_config"]["depth"] = (depth - 1).into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("art");
    let last = format!("blocks.{}.", depth - 1);
    assert_fails(
        &build(m.path(), &out, &[]),
        &["not read by any layer", &last, "depth"],
    );
    assert!(!out.exists());
    let o = run(
        "ane-export",
        &[
            "reference",
            "--model",
            m.path().to_str().unwrap(),
            "--image",
            golden("images/tiny.png").to_str().unwrap(),
            "--out",
            t.path().join("r.safetensors").to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["not read by any layer", &last]);
}

/// An artifact built with a deliberate fault is never accepted, even when
/// every gate passes (here at thresholds lenient enough to let the fault
/// through), and `ane-run` refuses it, saying why.
#[test]
fn artifacts_built_with_test_faults_are_never_accepted() {
    let t = tempfile::tempdir().unwrap();
    let art = build_model(
        &golden("tiny-vlm"),
        t.path(),
        "faulty",
        &["b1024"],
        &["--fault", "int8-axis"],
    );
    let imgs = golden_images(&["tiny.png", "wide.jpg"]);
    let lenient = t.path().join("lenient.yaml");
    std::fs::write(
        &lenient,
        "buckets:\n  - {name: b1024, patches: 1024}\ngates:\n  cosine_min: 0.0\n  \
         vqa_agreement_min: 0.0\n  vqa_accuracy_drop_max: 1.0\n",
    )
    .unwrap();
    let o = gate(
        &art,
        &[
            "--images",
            imgs.path().to_str().unwrap(),
            "--buckets",
            lenient.to_str().unwrap(),
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let r = gate_report(&art);
    // Every gate passed ...
    for g in ["residency", "cosine", "vqa"] {
        assert_eq!(r["gates"][g]["status"], "pass", "{g}: {out}");
    }
    // ... and still not accepted.
    assert_eq!(r["accepted"], false, "{out}");
    assert_eq!(r["test_faults"], serde_json::json!(["int8-axis"]));
    assert!(out.contains("never accepted"), "{out}");
    assert!(schema_errors("report", &r).is_empty());
    assert!(matches!(
        Artifact::open(&art).unwrap().acceptance(),
        Acceptance::Faulty { .. }
    ));
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            art.to_str().unwrap(),
            golden("images/tiny.png").to_str().unwrap(),
            "--out",
            t.path().join("e").to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["test faults", "int8-axis"]);
}

/// A language model that answers nothing right agrees with itself whatever
/// the tower sees: the VQA gate of tiny-q2 (random weights) reports itself
/// not informative, and the artifact is not accepted.
#[test]
fn an_uninformative_vqa_gate_does_not_accept() {
    let t = tempfile::tempdir().unwrap();
    let art = build_model(&golden("models/tiny-q2"), t.path(), "q2", &["b1024"], &[]);
    let o = gate(&art, &["--skip", "residency", "--skip", "cosine"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{out}");
    let r = gate_report(&art);
    let v = &r["gates"]["vqa"];
    assert_eq!(v["status"], "not_run", "{out}");
    assert!(
        v["message"].as_str().unwrap().contains("not informative"),
        "{v}"
    );
    let majority = v["majority"]["share"].as_f64().unwrap();
    assert!(
        v["accuracy_reference"].as_f64().unwrap() < majority + 0.2,
        "{v}"
    );
    assert_eq!(r["accepted"], false);
    assert!(schema_errors("report", &r).is_empty());
}

/// SigLIP2 takes one image per call: the golden three-image case is
/// skipped, as it is for CLIP, and the default buckets can be accepted.
#[test]
fn siglip2_with_the_default_buckets_is_accepted() {
    let t = tempfile::tempdir().unwrap();
    let art = t.path().join("s2");
    let o = run(
        "ane-export",
        &[
            "build",
            "--model",
            golden("models/tiny-siglip2").to_str().unwrap(),
            "--out",
            art.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = gate(&art, &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let r = gate_report(&art);
    let multi: Vec<&Value> = r["gates"]["cosine"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["images"].as_array().unwrap().len() > 1)
        .collect();
    assert!(!multi.is_empty());
    for c in multi {
        assert_eq!(c["status"], "skipped", "{c}");
        assert!(c["message"].as_str().unwrap().contains("one image"), "{c}");
    }
    assert_eq!(r["accepted"], true, "{out}");
}

/// Ctrl-C during a build's emission (Python running inside) ends it with
/// exit 130 and one line, not a Python traceback; the next build removes
/// what the interrupted one left and succeeds.
#[test]
fn ctrl_c_during_a_build_is_exit_130_and_one_line() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("art");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ane-export"))
        .args([
            "build",
            "--model",
            golden("tiny-vlm").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the build has started writing (its temporary directory),
    // then a little longer: Python is emitting.
    let building = || {
        std::fs::read_dir(t.path()).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".art.building-")
        })
    };
    let start = std::time::Instant::now();
    while !building() {
        assert!(
            start.elapsed().as_secs() < 60,
            "the build never started writing"
        );
        assert!(child.try_wait().unwrap().is_none(), "the build ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: signals a child this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert_eq!(err.trim(), "interrupted", "{err}");
    assert!(!out.exists());
    let o = build(&golden("tiny-vlm"), &out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let left: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(left, ["art"], "what the interrupted build left stays");
}

/// The command line as a good tool behaves: errors say their cause once
/// and name what the user gave (not the build's own lock file), `--json`
/// errors are JSON, `-q` silences progress, the artifact is `--artifact`
/// for `gate` too (the positional still works), `inspect` on an artifact
/// names its package, a `--model` that is neither a directory nor a repo in
/// reach says no local directory was found, `embed` is exit 2 when no
/// image could be embedded, and a failed fp16 overflow names the remedy.
#[test]
fn the_command_line_says_what_happened_once_and_clearly() {
    let t = tempfile::tempdir().unwrap();
    let err = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).to_string();
    // An unwritable --out: named, the OS error once, no lock file.
    let o = build(&golden("models/tiny-a"), Path::new("/proc/ux-out"), &[]);
    assert_fails(&o, &["--out /proc/ux-out"]);
    assert!(!err(&o).contains(".lock"), "{}", err(&o));
    // A question file that is not there: named, the OS error once, before
    // any gate runs (the artifact is not even read past its manifest).
    let good = build_model(&golden("models/tiny-a"), t.path(), "good", &["b1024"], &[]);
    let missing = t.path().join("nothing-here.jsonl");
    let o = gate(&good, &["--vqa", missing.to_str().unwrap()]);
    assert_fails(&o, &["nothing-here.jsonl"]);
    let e = err(&o);
    assert_eq!(e.matches("No such file or directory").count(), 1, "{e}");
    assert!(
        !good.join("gate").exists(),
        "a gate ran before the inputs were checked"
    );
    // --json: the error is JSON on stdout too.
    let o = gate(&good, &["--vqa", missing.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exit_code"], 2);
    assert!(v["error"].as_str().unwrap().contains("nothing-here"), "{v}");
    // A build, quietly: nothing on stderr.
    let art = t.path().join("art");
    let o = build(
        &golden("models/tiny-clip"),
        &art,
        &["-q", "--fault", "overflow"],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).is_empty(), "-q printed: {}", err(&o));
    // inspect on the artifact directory names its package.
    let o = run("ane-export", &["inspect", art.to_str().unwrap()]);
    assert_fails(&o, &["is an artifact directory", "art.mlpackage"]);
    // gate --artifact, -q: the summary alone (stdout), no progress; the
    // overflow's remedy named; which thresholds were read is said without -q.
    let imgs = golden_images(&["tiny.png"]);
    let o = run(
        "ane-export",
        &[
            "gate",
            "--artifact",
            art.to_str().unwrap(),
            "--images",
            imgs.path().to_str().unwrap(),
            "--skip",
            "task",
            "-q",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).is_empty(), "-q printed: {}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("remedy: build again with --calibration-images DIR"),
        "{out}"
    );
    let o = run(
        "ane-export",
        &[
            "gate",
            art.to_str().unwrap(),
            "--images",
            imgs.path().to_str().unwrap(),
            "--skip",
            "task",
        ],
    );
    assert!(err(&o).contains("thresholds from "), "{}", err(&o));
    assert!(err(&o).contains(" [1/"), "no k/n progress: {}", err(&o));
    // A --model that is neither a directory nor a repo in reach.
    let o = crate::common::run_env(
        "ane-export",
        &[
            "build",
            "--model",
            "no-such/dir",
            "--out",
            t.path().join("x").to_str().unwrap(),
        ],
        &[
            ("HF_ENDPOINT", Some("http://127.0.0.1:9")),
            ("HF_HOME", Some(t.path().to_str().unwrap())),
            ("HF_HUB_OFFLINE", None),
        ],
    );
    assert_fails(&o, &["--model no-such/dir: no such local directory"]);
    // embed: every image unreadable is exit 2 (not 1).
    let bad = t.path().join("bad.png");
    std::fs::write(&bad, b"not an image").unwrap();
    let accepted = build_model(&golden("tiny-vlm"), t.path(), "vlm", &["b1024"], &[]);
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            accepted.to_str().unwrap(),
            "--allow-unaccepted",
            bad.to_str().unwrap(),
            "--out",
            t.path().join("e").to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("bad.png"), "{}", err(&o));
}
