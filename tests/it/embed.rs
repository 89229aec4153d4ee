//! `ane-run embed` and the runtime library: accepted artifacts only, pad rows
//! dropped and outputs equal to the reference, bad images named while the
//! others are written, tampered and newer artifacts refused, stdin streams.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use ane_export::runtime::Runtime;

use ane_export::artifact::{Acceptance, Artifact};

use crate::common::{build_model, golden, read_all, run, run_env};

/// The tiny VLM built for b1024 and accepted by all three gates (its
/// language model answers the VQA gate), shared by the tests (copy it before
/// changing anything).
fn accepted() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // A static is never dropped: the directory is kept under Cargo's
        // scratch directory for integration tests, not in TMPDIR.
        let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap()
            .keep();
        let out = build_model(&golden("tiny-vlm"), &root, "tiny", &["b1024"], &[]);
        let imgs = root.join("images");
        std::fs::create_dir(&imgs).unwrap();
        std::fs::copy(golden("images/tiny.png"), imgs.join("tiny.png")).unwrap();
        let o = run(
            "ane-export",
            &[
                "gate",
                out.to_str().unwrap(),
                "--images",
                imgs.to_str().unwrap(),
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert_eq!(
            Artifact::open(&out).unwrap().acceptance(),
            Acceptance::Accepted
        );
        out
    })
}

/// Width of the tiny VLM's visual tokens (`out_hidden_size`).
const OUT: usize = 128;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let t = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &t);
        } else {
            std::fs::copy(&p, &t).unwrap();
        }
    }
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn embeds_match_the_reference_without_pad_rows() {
    let t = tempfile::tempdir().unwrap();
    let art = accepted();
    let img = golden("images/wide.jpg");
    let out = t.path().join("emb");
    // With the BLAS kernels this process loaded: the binary hides the
    // environment's OPENBLAS_* variables from OpenBLAS (`blas::init`), which
    // this process did not, and the library's rows below are compared with
    // the binary's bit for bit.
    let kernels = ane_export::blas::kernel();
    let o = run_env(
        "ane-run",
        &[
            "embed",
            "--artifact",
            art.to_str().unwrap(),
            img.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[("ANE_EXPORT_BLAS_CORETYPE", Some(&kernels))],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(line["bucket"], "b1024");
    assert_eq!(line["tokens"], 160);
    for k in ["decode", "preprocess", "execute", "total"] {
        assert!(line["seconds"][k].as_f64().unwrap() >= 0.0);
    }
    let (got, meta) = read_all(&out.join("wide.safetensors"));
    assert_eq!(meta["bucket"], "b1024");
    assert_eq!(got["grid_thw"].i64, vec![1, 16, 40]);

    let r = t.path().join("ref.safetensors");
    let model = golden("tiny-vlm");
    let o = run(
        "ane-export",
        &[
            "reference",
            "--model",
            model.to_str().unwrap(),
            "--image",
            img.to_str().unwrap(),
            "--out",
            r.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (want, _) = read_all(&r);
    for (k, rk) in [
        ("embeds", "embeds"),
        ("deepstack.0", "deepstack.0"),
        ("deepstack.1", "deepstack.1"),
    ] {
        assert_eq!(got[k].shape, vec![160, OUT], "{k}");
        assert_eq!(got[k].shape, want[rk].shape);
        let (a, b) = (&got[k].f32, &want[rk].f32);
        // Per token cosine, fp32 interpreter against the fp32 reference.
        for tok in 0..160 {
            let (x, y) = (
                &a[tok * OUT..(tok + 1) * OUT],
                &b[tok * OUT..(tok + 1) * OUT],
            );
            let dot: f64 = x.iter().zip(y).map(|(p, q)| *p as f64 * *q as f64).sum();
            let nx: f64 = x.iter().map(|p| (*p as f64).powi(2)).sum::<f64>().sqrt();
            let ny: f64 = y.iter().map(|p| (*p as f64).powi(2)).sum::<f64>().sqrt();
            assert!(
                dot / (nx * ny) > 0.99999,
                "{k} token {tok}: {}",
                dot / (nx * ny)
            );
        }
    }

    // The library gives the same rows.
    let rt = Runtime::open(art).unwrap();
    let e = rt.embed_file(&img).unwrap();
    assert_eq!(
        (
            e.outputs[0].name.as_str(),
            e.outputs[0].rows,
            e.outputs[0].width,
            e.bucket.as_str()
        ),
        ("embeds", 160, OUT, "b1024")
    );
    assert_eq!(e.outputs[0].values, got["embeds"].f32);
}

/// `ane-run embed -` with the accepted artifact and `extra` options, its
/// pipes open.
fn embed_stream(out: &Path, extra: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_ane-run"))
        .args(["embed", "--artifact", accepted().to_str().unwrap(), "-"])
        .args(["--out", out.to_str().unwrap()])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `ane-run embed` of a folder with the accepted artifact, and `extra` options.
fn embed_folder(dir: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "embed",
        "--artifact",
        accepted().to_str().unwrap(),
        dir.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    run("ane-run", &args)
}

#[test]
fn a_folder_with_a_bad_image_writes_the_others_and_exits_1() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("imgs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(golden("images/tiny.png"), dir.join("a.png")).unwrap();
    std::fs::write(dir.join("b.png"), b"\x89PNG\r\n\x1a\nnot really").unwrap();
    std::fs::copy(golden("images/square.png"), dir.join("c.png")).unwrap();
    std::fs::write(dir.join("notes.txt"), b"ignored").unwrap();
    let out = t.path().join("emb");
    for extra in [&[][..], &["--no-overlap"][..], &["--jobs", "3"][..]] {
        let _ = std::fs::remove_dir_all(&out);
        let o = embed_folder(&dir, &out, extra);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("1 failed") && err.contains("b.png"), "{err}");
        assert!(!err.contains("panicked"));
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        let images: Vec<String> = stdout
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["image"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        // In input order, the bad one left out.
        assert_eq!(images.len(), 2, "{stdout}");
        assert!(
            images[0].ends_with("a.png") && images[1].ends_with("c.png"),
            "{images:?}"
        );
        assert!(out.join("a.safetensors").is_file() && out.join("c.safetensors").is_file());
        assert!(!out.join("b.safetensors").exists());
    }
}

#[test]
fn an_error_writing_or_executing_stops_the_run_with_exit_2() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("imgs");
    std::fs::create_dir_all(&dir).unwrap();
    for n in ["a", "b", "c", "d"] {
        std::fs::copy(golden("images/tiny.png"), dir.join(format!("{n}.png"))).unwrap();
    }
    let out = t.path().join("emb");
    let check = |o: &std::process::Output| {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(o));
        let err = stderr(o);
        assert!(
            err.contains("b.safetensors") && err.contains("; stopped") && !err.contains("panicked"),
            "{err}"
        );
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        // a.png's line, then the error as JSON (stdout is JSON lines).
        assert_eq!(stdout.lines().count(), 2, "only a.png: {stdout}");
        let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(last["exit_code"], 2, "{stdout}");
        assert!(
            last["error"].as_str().unwrap().contains("b.safetensors"),
            "{stdout}"
        );
        assert!(out.join("a.safetensors").is_file());
        for n in ["c", "d"] {
            assert!(
                !out.join(format!("{n}.safetensors")).exists(),
                "{n} after the stop"
            );
        }
    };
    for extra in [&[][..], &["--no-overlap"][..]] {
        let _ = std::fs::remove_dir_all(&out);
        // A folder where b's output must go: writing it fails.
        std::fs::create_dir_all(out.join("b.safetensors")).unwrap();
        check(&embed_folder(&dir, &out, extra));
    }
    // A frame stream that is still open when the run stops: it ends anyway.
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(out.join("b.safetensors")).unwrap();
    let mut child = embed_stream(&out, &[]);
    let mut stdin = child.stdin.take().unwrap();
    for n in ["a", "b", "c"] {
        writeln!(stdin, "{}", dir.join(format!("{n}.png")).display()).unwrap();
    }
    stdin.flush().unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "the run waits for its input to end"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(stdin);
    check(&child.wait_with_output().unwrap());
}

#[test]
fn a_stream_that_cannot_be_read_ends_with_the_summary_and_exit_2() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("emb");
    for extra in [&[][..], &["--no-overlap"][..]] {
        let mut child = embed_stream(&out, extra);
        {
            let mut stdin = child.stdin.take().unwrap();
            writeln!(stdin, "{}", golden("images/tiny.png").display()).unwrap();
            stdin.write_all(b"\xff\xfe.png\n").unwrap();
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("embedded 1 images")
                && err.contains("; stopped")
                && err.contains("reading image paths from stdin"),
            "{err}"
        );
        // The image's line, then the error as JSON.
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        assert_eq!(stdout.lines().count(), 2, "{stdout}");
        assert!(
            stdout.lines().last().unwrap().contains("\"exit_code\":2"),
            "{stdout}"
        );
    }
}

#[test]
fn reads_a_stream_of_paths_from_stdin() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("emb");
    let mut child = embed_stream(&out, &[]);
    {
        let mut stdin = child.stdin.take().unwrap();
        for n in ["tiny.png", "wide.jpg", "tiny.png"] {
            writeln!(stdin, "{}", golden(&format!("images/{n}")).display()).unwrap();
        }
        writeln!(stdin).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 3);
    // The same name twice: the second gets a suffix instead of overwriting.
    for f in ["tiny.safetensors", "wide.safetensors", "tiny-1.safetensors"] {
        assert!(out.join(f).is_file(), "{f}");
    }
}

#[test]
fn refuses_unaccepted_tampered_and_newer_artifacts() {
    let t = tempfile::tempdir().unwrap();
    let img = golden("images/tiny.png");
    let embed = |art: &Path, extra: &[&str]| {
        let mut args = vec![
            "embed",
            "--artifact",
            art.to_str().unwrap(),
            img.to_str().unwrap(),
        ];
        args.extend(extra);
        args.extend(["--out", t.path().to_str().unwrap()]);
        run("ane-run", &args)
    };

    // Not gated: refused, unless --allow-unaccepted (with a warning).
    let a = t.path().join("ungated");
    copy_dir(accepted(), &a);
    let mp = a.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mp).unwrap()).unwrap();
    m["gates"] = serde_json::Value::Null;
    std::fs::write(&mp, serde_json::to_string(&m).unwrap()).unwrap();
    let o = embed(&a, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("has not been gated"), "{}", stderr(&o));
    let o = embed(&a, &["--allow-unaccepted"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning") && stderr(&o).contains("not gated"),
        "{}",
        stderr(&o)
    );

    // A package file changed after gating: refused, the file named.
    let b = t.path().join("tampered");
    copy_dir(accepted(), &b);
    let w = b.join("tiny.mlpackage/Data/com.apple.CoreML/weights/weight.bin");
    let mut bytes = std::fs::read(&w).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 0x40;
    std::fs::write(&w, bytes).unwrap();
    for extra in [&[][..], &["--allow-unaccepted"][..]] {
        let o = embed(&b, extra);
        assert_eq!(o.status.code(), Some(2));
        assert!(
            stderr(&o).contains("weight.bin") && stderr(&o).contains("changed"),
            "{}",
            stderr(&o)
        );
    }

    // Written by a newer, incompatible version.
    let c = t.path().join("newer");
    copy_dir(accepted(), &c);
    let mp = c.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mp).unwrap()).unwrap();
    m["artifact_format"] = 99.into();
    m["tool"]["version"] = "9.9.9".into();
    std::fs::write(&mp, serde_json::to_string(&m).unwrap()).unwrap();
    let o = embed(&c, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("artifact format 99") && stderr(&o).contains("newer"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bench_reports_median_and_p90_per_bucket() {
    let art = accepted().to_str().unwrap();
    let o = run(
        "ane-run",
        &["bench", "--artifact", art, "--runs", "3", "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r["machine"].as_str().unwrap().contains("MIL interpreter"));
    let rows = r["results"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(
        (row["bucket"].as_str(), row["runs"].as_u64()),
        (Some("b1024"), Some(3))
    );
    let (min, med, p90) = (
        row["min_s"].as_f64().unwrap(),
        row["median_s"].as_f64().unwrap(),
        row["p90_s"].as_f64().unwrap(),
    );
    assert!(0.0 < min && min <= med && med <= p90, "{row}");
    assert!(row["energy_per_image"].is_null());
    // The interpreter has no prediction apart from passing tensors.
    assert!(row["predict_median_s"].is_null() && row["predict_p90_s"].is_null());
    for (args, words) in [
        (&["--runs", "0"][..], "at least one timed run"),
        (&["--bucket", "b9"][..], "unknown bucket `b9`"),
        (&["--energy"][..], "needs Core ML on a Mac"),
        (
            &["--coreml-timeout=-1"][..],
            "seconds from 1 to 604800, got `-1`",
        ),
        (
            &["--coreml-load-timeout", "inf"][..],
            "expected 0 (no limit)",
        ),
    ] {
        let mut a = vec!["bench", "--artifact", art];
        a.extend(args);
        let o = run("ane-run", &a);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains(words), "{}", stderr(&o));
    }
    if !cfg!(target_os = "macos") {
        let o = run(
            "ane-run",
            &["bench", "--artifact", art, "--executor", "coreml"],
        );
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("needs macOS"), "{}", stderr(&o));
    }
}
