//! What the user sees: exit code, stdout and stderr of the main commands
//! and their commonest errors, as insta snapshots (`tests/it/snapshots/`).
//! Temporary paths, the checkout's path, times and measured numbers are
//! filtered, so a snapshot changes only when what the tool says changes.
//! `INSTA_UPDATE=always cargo test --release cli_snapshots` rewrites them
//! (review the diff); CI fails on any difference.

use std::path::Path;
use std::process::Output;

use crate::common::{golden, golden_images, root, run};

/// `o` as one text: exit code, then stdout and stderr.
fn shown(o: &Output) -> String {
    format!(
        "exit: {}\n--- stdout\n{}--- stderr\n{}",
        o.status
            .code()
            .map_or("signal".to_string(), |c| c.to_string()),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Snapshot `o` with `tmp` shown as `[TMP]`, the checkout as `[ROOT]`,
/// seconds, sizes and measured figures as placeholders.
fn snapshot(name: &str, o: &Output, tmp: &Path) {
    let tmp = regex_escape(&tmp.display().to_string());
    let root = regex_escape(&root().display().to_string());
    let filters = vec![
        (tmp.as_str(), "[TMP]"),
        (root.as_str(), "[ROOT]"),
        // Times ("in 1.6 s", "[    0.3 s]", "0.087 s") and rates.
        (r"\d+\.\d+ ?s\b", "[S] s"),
        (r"\d+\.\d+ images/s", "[R] images/s"),
        // Measured numbers: cosines, errors, fractions, percentages; and
        // which output has the lowest cosine, which a CPU's rounding decides.
        (r"-?\d+\.\d+(e-?\d+)?", "[N]"),
        (r"\(\w+ of ", "([OUTPUT] of "),
        (r"/tmp/\.tmp\w+", "[TMP]"),
        (r"\.tmp\w+", "[TMP]"),
    ];
    insta::with_settings!({filters => filters, prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!(name, shown(o));
    });
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if "\\.+*?()|[]{}^$#&-~".contains(c) {
                vec!['\\', c]
            } else {
                vec![c]
            }
        })
        .collect()
}

#[test]
fn build_gate_embed_and_their_errors() {
    let t = tempfile::tempdir().unwrap();
    let art = t.path().join("tiny");
    let model = golden("models/tiny-a");
    let (m, a) = (model.to_str().unwrap(), art.to_str().unwrap());
    snapshot(
        "build",
        &run(
            "ane-export",
            &["build", "--model", m, "--out", a, "--bucket", "b1024"],
        ),
        t.path(),
    );
    snapshot(
        "build_exists",
        &run(
            "ane-export",
            &["build", "--model", m, "--out", a, "--bucket", "b1024"],
        ),
        t.path(),
    );
    let mine = t.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), "mine").unwrap();
    snapshot(
        "build_not_an_artifact",
        &run(
            "ane-export",
            &[
                "build",
                "--model",
                m,
                "--out",
                mine.to_str().unwrap(),
                "--force",
            ],
        ),
        t.path(),
    );
    snapshot(
        "build_unknown_bucket",
        &run(
            "ane-export",
            &[
                "build",
                "--model",
                m,
                "--out",
                t.path().join("x").to_str().unwrap(),
                "--bucket",
                "b9",
            ],
        ),
        t.path(),
    );
    snapshot(
        "inspect_artifact_dir",
        &run("ane-export", &["inspect", a]),
        t.path(),
    );
    let imgs = golden_images(&["tiny.png"]);
    let imgs_dir = imgs.path().to_str().unwrap();
    snapshot(
        "gate_missing_questions",
        &run(
            "ane-export",
            &[
                "gate",
                "--artifact",
                a,
                "--images",
                imgs_dir,
                "--vqa",
                t.path().join("none.jsonl").to_str().unwrap(),
            ],
        ),
        t.path(),
    );
    // Gated with VQA skipped: passed, not accepted. The images' folder is
    // another temporary directory: its name filtered too.
    let o = run(
        "ane-export",
        &["gate", "-q", a, "--images", imgs_dir, "--skip", "vqa"],
    );
    snapshot("gate_skip_vqa", &o, t.path());
    snapshot(
        "embed_not_accepted",
        &run(
            "ane-run",
            &[
                "embed",
                "--artifact",
                a,
                golden("images/tiny.png").to_str().unwrap(),
                "--out",
                t.path().join("e").to_str().unwrap(),
            ],
        ),
        t.path(),
    );
}
