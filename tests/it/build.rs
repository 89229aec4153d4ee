//! `ane-export build` end to end: packages that the project's reader opens
//! with static shapes per bucket, and whose program, executed by the MIL
//! interpreter on host-prepared inputs, matches the fp32 reference tower.

use ane_export::family::Model;
use ane_export::interp::Precision;
use ane_export::mlpackage::Package;

use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::common::{
    assert_fails, build_tiny, golden, golden_batch, interpret_bucket, run, run_env, token_cosines,
};

/// Run bucket `function` of the package on `images` and compare every output
/// with the reference; returns the minimum cosine over outputs.
fn compare(
    pkg: &Package,
    ck: &Model,
    function: &str,
    bucket: usize,
    images: &[&str],
    precision: Precision,
) -> f64 {
    let b = golden_batch(ck, images);
    let (got, columns) = interpret_bucket(pkg, ck, function, bucket, &b, precision);
    let tower = ane_export::family::reference_tower(ck).unwrap();
    let pv = Tensor::from_slice(&b.pixel_values, (b.rows(), b.row_len), &Device::Cpu).unwrap();
    let want = tower.forward(&pv, &b.grid_thw, false).unwrap();
    let out = ck.vision.out_hidden_size();
    assert_eq!(columns.len(), b.rows() / 4);
    let refs: Vec<(String, Tensor)> = ck
        .vision
        .output_names()
        .into_iter()
        .zip(want.outputs)
        .collect();
    assert_eq!(refs[0].0, "embeds");
    assert_eq!(refs.len(), ck.vision.output_names().len());
    let mut worst = 1f64;
    for (name, r) in refs {
        let ours = got[&name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let r = r.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let (min, mean) = token_cosines(&ours, &columns, &r, out);
        println!(
            "build {function} {images:?} {precision:?} {name}: min cos {min:.6}, mean {mean:.6}"
        );
        worst = worst.min(min);
    }
    worst
}

#[test]
fn build_then_interpret_matches_reference() {
    let t = tempfile::tempdir().unwrap();
    let buckets = t.path().join("buckets.yaml");
    std::fs::write(
        &buckets,
        "buckets:\n  - {name: b512, patches: 512}\n  - {name: b640, patches: 640}\n",
    )
    .unwrap();
    let out = t.path().join("art");
    let model = golden("models/tiny-a");
    let args = [
        "build",
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--buckets",
        buckets.to_str().unwrap(),
        "--json",
    ];
    // coremltools writes each converted and merged model to a temporary
    // package; none may outlive the build.
    let tmp = t.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let o = run_env("ane-export", &args, &[("TMPDIR", tmp.to_str())]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let left: Vec<_> = tmp
        .read_dir()
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "the build left {left:?} in TMPDIR");
    std::fs::remove_dir(&tmp).unwrap();
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["buckets"], serde_json::json!(["b512", "b640"]));
    // Nothing but the tool's own output: stdout is the JSON summary (parsed
    // above), and stderr holds none of coremltools' import warnings about its
    // macOS bindings nor its pass pipelines' progress bars.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.trim().is_empty(),
        "build with --json printed to stderr:\n{err}"
    );
    let out2 = t.path().join("art2");
    let plain = [&args[..3], &["--out", out2.to_str().unwrap()], &args[5..7]].concat();
    let o = run("ane-export", &plain);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("built ") && o.stdout.is_empty(),
        "build printed more than its one line:\n{err}"
    );

    // The manifest binds every file by sha256 and describes each bucket.
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let files = manifest["files"].as_object().unwrap();
    assert!(
        files.contains_key("host.safetensors") && files.keys().any(|k| k.ends_with("weight.bin"))
    );
    assert_eq!(manifest["buckets"][1]["function"], "b640");
    assert_eq!(
        manifest["buckets"][1]["inputs"][4]["shape"],
        serde_json::json!([1, 640, 640])
    );
    assert!(
        !t.path().read_dir().unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with('.')),
        "no temp dir or lock left"
    );

    // The multifunction package carries the metadata Xcode shows.
    let o = run(
        "ane-export",
        &["inspect", out.join("art.mlpackage").to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let shown = String::from_utf8_lossy(&o.stdout);
    for want in [
        "author: ane-export",
        "metadata family: qwen3_vl",
        "metadata bucket_patches: b512=512,b640=640",
        "metadata source_model: ",
    ] {
        assert!(shown.contains(want), "inspect lacks {want:?}:\n{shown}");
    }

    let pkg = Package::open(&out.join("art.mlpackage")).unwrap();
    let ck = Model::open(&model).unwrap();
    // One image in b512 (384 real patches, 128 padded); two in one call in b640.
    assert!(compare(&pkg, &ck, "b512", 512, &["tall.png"], Precision::Fp32) >= 0.9999);
    assert!(
        compare(
            &pkg,
            &ck,
            "b640",
            640,
            &["square.png", "tiny.png"],
            Precision::Fp32
        ) >= 0.9999
    );
    // fp16 everywhere, as the Neural Engine computes: within the release bar.
    assert!(compare(&pkg, &ck, "b512", 512, &["tall.png"], Precision::Fp16) >= 0.98);
    // The interpreter keeps the Linears' fp16 weights as stored and widens
    // them as it multiplies: what it holds decoded is about the package's
    // fp16 bytes (the small biases and norm weights widened), not twice
    // them as f32 copies of every weight would be.
    let stored: u64 = pkg.weight_bytes().values().sum();
    let held = pkg.decoded_bytes() as u64;
    println!("decoded weights: {held} bytes held for {stored} stored");
    assert!(
        held >= stored && held <= stored * 23 / 20,
        "decoded weights: {held} bytes held for {stored} stored"
    );

    // The same through the command line: host inputs for the smallest bucket
    // that holds the image, then `exec` of that bucket's function.
    let hi = t.path().join("hi.safetensors");
    let img = golden("images/tall.png");
    let o = run(
        "ane-run",
        &[
            "host-inputs",
            "--artifact",
            out.to_str().unwrap(),
            "--image",
            img.to_str().unwrap(),
            "--out",
            hi.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bucket b512: 384 real patches"));
    let ho = t.path().join("ho.safetensors");
    let pkg_path = out.join("art.mlpackage");
    let o = run(
        "ane-export",
        &[
            "exec",
            pkg_path.to_str().unwrap(),
            "--function",
            "b512",
            "--inputs",
            hi.to_str().unwrap(),
            "--out",
            ho.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (got, _) = crate::common::read_all(&ho);
    let b = golden_batch(&ck, &["tall.png"]);
    let tower = ane_export::family::reference_tower(&ck).unwrap();
    let pv = Tensor::from_slice(&b.pixel_values, (b.rows(), b.row_len), &Device::Cpu).unwrap();
    let want = tower.forward(&pv, &b.grid_thw, false).unwrap().outputs[0]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let columns: Vec<usize> = (0..96).collect();
    let (min, _) = token_cosines(
        &got["embeds"].f32,
        &columns,
        &want,
        ck.vision.out_hidden_size(),
    );
    assert!(min >= 0.9999, "CLI path min cosine {min}");

    // The interpreter's shortcuts (repeated pad columns computed once, dead
    // keys skipped) change no bit: tiny.png alone in b640 is mostly padding.
    let hi = t.path().join("hi640.safetensors");
    let img = golden("images/tiny.png");
    let o = run(
        "ane-run",
        &[
            "host-inputs",
            "--artifact",
            out.to_str().unwrap(),
            "--bucket",
            "b640",
            "--image",
            img.to_str().unwrap(),
            "--out",
            hi.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for precision in ["fp32", "fp16", "ane"] {
        let exec = |shortcuts: &str| {
            let ho = t.path().join(format!("ho640-{shortcuts}.safetensors"));
            let o = run_env(
                "ane-export",
                &[
                    "exec",
                    pkg_path.to_str().unwrap(),
                    "--function",
                    "b640",
                    "--inputs",
                    hi.to_str().unwrap(),
                    "--out",
                    ho.to_str().unwrap(),
                    "--precision",
                    precision,
                ],
                &[("ANE_EXPORT_SHORTCUTS", Some(shortcuts))],
            );
            let err = String::from_utf8_lossy(&o.stderr).to_string();
            assert!(o.status.success(), "{err}");
            let find = |start: &str| {
                let l = err.lines().find(|l| l.starts_with(start));
                l.unwrap_or_else(|| panic!("no {start} line in {err}"))
                    .to_string()
            };
            let kernels = find("exec: function");
            let kernels = kernels.rsplit("kernels ").next().unwrap().to_string();
            (std::fs::read(&ho).unwrap(), find("exec: computed"), kernels)
        };
        let (whole, line, _) = exec("0");
        assert!(
            line.contains("computed 100.0% of the 1x1 convolutions' columns"),
            "{line}"
        );
        let (short, line, kernels) = exec("1");
        assert!(
            whole == short,
            "{precision}: the shortcuts changed the outputs"
        );
        // Where the BLAS kernels compute equal columns equally, the pad
        // columns are computed once.
        if ane_export::blas::columns_independent_kernel(&kernels) {
            assert!(!line.contains("computed 100.0% of the 1x1"), "{line}");
        }
        println!("{precision}: {line}");
    }

    // An existing artifact is replaced only with --force.
    let o = run("ane-export", &args);
    assert_fails(&o, &["already exists", "--force"]);
    let mut forced = args.to_vec();
    forced.extend(["--force", "--bucket", "b512"]);
    let o = run("ane-export", &forced);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["buckets"].as_array().unwrap().len(), 1);
}

#[test]
fn build_refuses_bad_buckets_and_outputs() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-a");
    let out = t.path().join("art");
    let build = |extra: &[&str]| {
        let mut a = vec![
            "build",
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        a.extend(extra);
        run("ane-export", &a)
    };
    assert_fails(
        &build(&["--bucket", "b9"]),
        &["unknown bucket `b9`", "b1024, b4096"],
    );
    let bad = t.path().join("bad.yaml");
    std::fs::write(&bad, "buckets:\n  - {name: b6, patches: 6}\n").unwrap();
    assert_fails(
        &build(&["--buckets", bad.to_str().unwrap()]),
        &["bad.yaml", "multiple of 4"],
    );
    std::fs::write(&bad, "buckets:\n  - {name: huge, patches: 65536}\n").unwrap();
    assert_fails(
        &build(&["--buckets", bad.to_str().unwrap()]),
        &["axis limit", "R6"],
    );
    std::fs::write(&out, "a file").unwrap();
    assert_fails(&build(&[]), &["is a file"]);
    std::fs::remove_file(&out).unwrap();
    // No usable venv: say how to make one.
    let empty = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ane-export"))
        .args([
            "build",
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--bucket",
            "b1024",
        ])
        .env("ANE_EXPORT_VENV", empty.path())
        .output()
        .unwrap();
    assert_fails(&o, &["no coremltools", "make setup"]);
    assert!(!out.exists());
    // A held lock: another build is writing there.
    let held = std::fs::File::create(t.path().join(".art.lock")).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(
        unsafe {
            libc::flock(
                std::os::unix::io::AsRawFd::as_raw_fd(&held),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        },
        0
    );
    assert_fails(&build(&["--bucket", "b1024"]), &["another build"]);
    assert!(!out.exists());
    // A lock file nobody holds (a killed build's) does not block.
    drop(held);
    let o = build(&["--bucket", "b1024"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!t.path().join(".art.lock").exists());
}

/// `ane-export layout` writes every tensor the program uses, in conv shape,
/// with a description; the patch embedding is folded over its two frames.
#[test]
fn layout_writes_ane_weights_and_description() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-a");
    let o = run(
        "ane-export",
        &[
            "layout",
            "--model",
            model.to_str().unwrap(),
            "--out",
            t.path().to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (w, _) = crate::common::read_all(&t.path().join("weights.safetensors"));
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(t.path().join("layout.json")).unwrap())
            .unwrap();
    assert_eq!(doc["tensors"].as_array().unwrap().len(), w.len());
    assert_eq!(w["blocks.0.attn.qkv.weight"].shape, vec![216, 72, 1, 1]);
    assert_eq!(w["patch_embed.weight"].shape, vec![72, 768, 1, 1]);
    // Folded: the sum of the checkpoint's two temporal kernels.
    let ck = Model::open(&model).unwrap();
    let raw = ck
        .tensor("patch_embed.proj.weight", &[72, 3, 2, 16, 16])
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(w["patch_embed.weight"].f32[5], raw[5] + raw[256 + 5]);
}

/// Compressed weights (int8 per channel, 8-bit palettes) still match the
/// reference through the interpreter, within what the compression costs.
#[test]
fn compressed_builds_match_reference() {
    let t = tempfile::tempdir().unwrap();
    let buckets = t.path().join("buckets.yaml");
    std::fs::write(&buckets, "buckets:\n  - {name: b512, patches: 512}\n").unwrap();
    let model = golden("models/tiny-a");
    let ck = Model::open(&model).unwrap();
    for (mode, op, bound) in [
        ("int8", "constexpr_blockwise_shift_scale", 0.999),
        ("pal8", "constexpr_lut_to_dense", 0.99),
        ("pal6", "constexpr_lut_to_dense", 0.99),
    ] {
        let out = t.path().join(mode);
        let args = [
            "build",
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--buckets",
            buckets.to_str().unwrap(),
            "--weights",
            mode,
        ];
        let o = run("ane-export", &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let pkg = Package::open(&out.join(format!("{mode}.mlpackage"))).unwrap();
        let f = pkg.program.function(Some("b512")).unwrap();
        assert!(f.ops.iter().any(|o| o.kind == op), "{mode}: no {op}");
        let min = compare(&pkg, &ck, "b512", 512, &["tall.png"], Precision::Fp32);
        eprintln!("{mode}: min cosine {min:.6}");
        assert!(min >= bound, "{mode}: min cosine {min}");
        // The compressed weights are of the kinds that stay on the ANE (R14).
        let bytes: u64 = pkg.weight_bytes().values().sum();
        let p = ane_export::gate::residency::predict(&pkg, f, bytes);
        assert_eq!(p.fraction, 1.0, "{mode}: {:?}", p.off_ane);
        assert!(p.failed_checks().is_empty(), "{mode}");
    }
}

#[test]
fn older_targets_need_per_bucket_packages() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-a");
    let out = t.path().join("art");
    let o = run(
        "ane-export",
        &[
            "build",
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--target",
            "macos14",
        ],
    );
    assert_fails(&o, &["macOS 15", "--per-bucket"]);
}

/// A Python exception during emission becomes an error that names the stage
/// and carries the traceback (here: the weights lack every tensor).
#[test]
fn python_exceptions_name_the_stage_with_traceback() {
    let t = tempfile::tempdir().unwrap();
    let ck = Model::open(&golden("models/tiny-a")).unwrap();
    let env = ane_export::bridge::find_env().unwrap();
    let spec = ane_export::bridge::BuildSpec {
        cfg: &ck.vision,
        target: "macOS15",
        weights: "fp16",
        faults: &[],
        query_chunk: 512,
        residual_scale: None,
        branch_scale: None,
        scratch: None,
    };
    let err = ane_export::bridge::save_packages(
        &env,
        spec,
        Vec::new(),
        &[("b16".to_string(), 16)],
        &t.path().join("x.mlpackage"),
        true,
        &serde_json::json!({}),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("Python failed during emission"), "{err}");
    assert!(
        err.contains("Traceback") && err.contains("KeyError") && err.contains("patch_embed.weight"),
        "{err}"
    );
    assert!(!t.path().join("x.mlpackage").exists());
}

/// `--query-chunk`: 512 queries per chunk by default (R4: two chunks per head
/// in b1024), 0 for one piece per head; the manifest records it.
#[test]
fn query_chunks_follow_the_flag() {
    let t = tempfile::tempdir().unwrap();
    for (chunk, softmaxes) in [("0", 24), ("256", 96)] {
        let out = build_tiny(
            t.path(),
            &format!("q{chunk}"),
            &["b1024"],
            &["--query-chunk", chunk],
        );
        let pkg = Package::open(&out.join(format!("q{chunk}.mlpackage"))).unwrap();
        let f = pkg.program.function(Some("b1024")).unwrap();
        assert_eq!(
            f.ops.iter().filter(|o| o.kind == "softmax").count(),
            softmaxes
        );
        let m: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(m["query_chunk"].to_string(), chunk);
    }
}
