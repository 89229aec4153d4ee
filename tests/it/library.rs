//! The build and the gates as library calls: a resolved plan in, an
//! artifact and a report out, with no command line in between.

use std::cell::RefCell;

use ane_export::Error;
use ane_export::artifact::{Acceptance, Cleared};
use ane_export::buckets::BucketsFile;
use ane_export::builder::{self, BuildPlan, Fault, Format, Stage, Target, WeightMode};
use ane_export::exec::coreml::Timeouts;
use ane_export::exec::{ExecutorKind, MilExecutor};
use ane_export::gate::{self, GateName, GatePlan, Note, Status, Written};
use ane_export::interp::Precision;

use ane_export::runtime::Runtime;

use crate::common::{golden, golden_images};

/// Load `dir` for embedding without leave to run unaccepted artifacts.
fn load(dir: &std::path::Path) -> ane_export::Result<Runtime> {
    Runtime::open(dir)
}

fn build_plan(out: std::path::PathBuf, faults: Vec<Fault>) -> BuildPlan {
    let (file, _) = BucketsFile::load(Some(&golden("../buckets.yaml"))).unwrap();
    BuildPlan {
        model: golden("models/tiny-a").display().to_string(),
        revision: None,
        hub_events: Default::default(),
        out,
        buckets: file.select(&["b1024".to_string()]).unwrap(),
        per_bucket: false,
        target: Target::Macos15,
        weights: WeightMode::Fp16,
        format: Format::Mlpackage,
        query_chunk: 512,
        residual_scale: None,
        calibration_images: None,
        branch_scale: None,
        force: false,
        faults,
    }
}

fn gate_plan(artifact: std::path::PathBuf, images: &std::path::Path) -> GatePlan {
    let (thresholds, _) = BucketsFile::load(Some(&golden("../buckets.yaml"))).unwrap();
    GatePlan {
        artifact,
        model: None,
        revision: None,
        hub_events: Default::default(),
        images: Some(images.to_path_buf()),
        texts: None,
        vqa: None,
        task: None,
        buckets: vec![],
        merge: false,
        skip: vec![GateName::Vqa],
        thresholds,
        executor: ExecutorKind::Mil,
        timeouts: Timeouts {
            load: None,
            predict: None,
        },
        interp: Default::default(),
        on_profile: None,
        precision: ane_export::interp::Precision::Ane,
    }
}

#[test]
fn a_plan_builds_and_gates_without_the_command_line() {
    let t = tempfile::tempdir().unwrap();
    let imgs = golden_images(&["wide.jpg", "tiny.png"]);
    let plan = build_plan(t.path().join("tiny"), vec![]);
    let stages = RefCell::new(Vec::new());
    let built = builder::build(&plan, &|s, _| stages.borrow_mut().push(s)).unwrap();
    // Every stage but the Core AI translation, which a package alone skips.
    let want: Vec<Stage> = Stage::ALL
        .iter()
        .copied()
        .filter(|s| *s != Stage::Translate)
        .collect();
    assert_eq!(stages.into_inner(), want);
    assert_eq!(built.buckets, [("b1024".to_string(), 1024)]);
    assert!(built.artifact.join("manifest.json").is_file());

    // A second build there is refused, by a variant a caller can match.
    match builder::build(&plan, &|_, _| {}) {
        Err(Error::Exists(p)) => assert_eq!(p, plan.out),
        other => panic!("expected Error::Exists, got {other:?}"),
    }

    // Not gated yet: the runtime refuses it, saying why in a variant.
    match load(&built.artifact) {
        Err(Error::NotAccepted { acceptance, .. }) => assert_eq!(acceptance, Acceptance::NotGated),
        other => panic!("expected NotAccepted, got {:?}", other.err()),
    }

    let notes = RefCell::new(0);
    let (report, written) = gate::run(&gate_plan(built.artifact.clone(), imgs.path()), &|n| {
        if let Note::Progress(_) = n {
            *notes.borrow_mut() += 1;
        }
    })
    .unwrap();
    assert!(*notes.borrow() > 0, "no progress reported");
    assert_eq!(
        [
            report.gates.residency.status,
            report.gates.cosine.status,
            report.gates.vqa.status
        ],
        [Status::Pass, Status::Pass, Status::Skipped]
    );
    assert!(
        report.passed && !report.accepted,
        "vqa skipped: not accepted"
    );
    assert_eq!(gate::exit_code(&report), 0);
    match written {
        Written::Report(dir) => {
            assert_eq!(dir, built.artifact.join("gate"));
            assert!(dir.join("report.json").is_file() && dir.join("report.html").is_file());
        }
        other => panic!("expected a full report, got {other:?}"),
    }
    match load(&built.artifact) {
        Err(Error::NotAccepted { acceptance, .. }) => assert_eq!(
            acceptance,
            Acceptance::Incomplete {
                skipped: vec!["vqa".into()]
            }
        ),
        other => panic!("expected NotAccepted, got {:?}", other.err()),
    }
    // The escape hatch clears it anyway, visibly, and says what it is; the
    // runtime takes only what was cleared (Runtime::load wants a Cleared).
    let cleared = Cleared::without_acceptance(&built.artifact).unwrap();
    assert_eq!(
        cleared.acceptance(),
        &Acceptance::Incomplete {
            skipped: vec!["vqa".into()]
        }
    );
    let rt = Runtime::load(cleared, Box::new(MilExecutor::new(Precision::Fp32))).unwrap();
    assert_eq!(rt.artifact.buckets.len(), 1);
    // A file changed after the build is named, by a variant of its own,
    // even through the escape hatch.
    let host = built.artifact.join("host.safetensors");
    let mut bytes = std::fs::read(&host).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&host, bytes).unwrap();
    match load(&built.artifact) {
        Err(Error::Modified { path, .. }) => assert_eq!(path, host),
        other => panic!("expected Modified, got {:?}", other.err()),
    }
    match Cleared::without_acceptance(&built.artifact) {
        Err(Error::Modified { path, .. }) => assert_eq!(path, host),
        other => panic!(
            "expected Modified, got {:?}",
            other.err().map(|e| e.to_string())
        ),
    }
}

#[test]
fn a_failed_gate_is_a_report_not_an_error() {
    let t = tempfile::tempdir().unwrap();
    let imgs = golden_images(&["wide.jpg"]);
    let built = builder::build(
        &build_plan(t.path().join("no-mask"), vec![Fault::NoMask]),
        &|_, _| {},
    )
    .unwrap();
    let (report, _) = gate::run(&gate_plan(built.artifact, imgs.path()), &|_| {}).unwrap();
    assert_eq!(
        report.gates.cosine.status,
        Status::Fail,
        "{}",
        report.gates.cosine.message
    );
    assert!(!report.passed);
    assert_eq!(gate::exit_code(&report), 1);
}

/// Checkpoints a caller may want to tell apart: a model no family handles
/// (yet), and pickled weights, which are never loaded.
#[test]
fn unusable_checkpoints_are_typed() {
    use ane_export::family::Model;

    let t = crate::common::copy_model("tiny-a");
    let cfg = t.path().join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["model_type"] = "llava".into();
    std::fs::write(&cfg, json.to_string()).unwrap();
    match Model::open(t.path()) {
        Err(Error::UnsupportedModel {
            model_type,
            supported,
            ..
        }) => {
            assert_eq!(model_type.as_str(), "llava");
            assert!(supported.contains("qwen3_vl"), "{supported}");
        }
        other => panic!("expected UnsupportedModel, got {:?}", other.err()),
    }

    std::fs::write(&cfg, text).unwrap();
    std::fs::remove_file(t.path().join("model.safetensors")).unwrap();
    let pickle = t.path().join("pytorch_model.bin");
    std::fs::write(&pickle, b"\x80\x02pickle").unwrap();
    match Model::open(t.path()) {
        Err(Error::Pickled(p)) => assert_eq!(p, pickle),
        other => panic!("expected Pickled, got {:?}", other.err()),
    }
}
