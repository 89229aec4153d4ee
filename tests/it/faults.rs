//! Fault injection: builds killed with SIGKILL at 20 points, a full disk, two
//! builds racing into one directory. None may leave a partial artifact that
//! `gate` or `ane-run` would take, or damage the gated artifact already there.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ane_export::artifact::{Acceptance, Artifact};

use crate::common::{golden, run};

fn buckets_file(dir: &Path) -> PathBuf {
    let p = dir.join("buckets.yaml");
    std::fs::write(&p, "buckets:\n  - {name: b128, patches: 128}\n").unwrap();
    p
}

fn build_cmd(out: &Path, buckets: &Path, force: bool) -> Command {
    let model = golden("models/tiny-a");
    let mut c = Command::new(env!("CARGO_BIN_EXE_ane-export"));
    c.args([
        "build",
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ])
    .args(["--buckets", buckets.to_str().unwrap()]);
    if force {
        c.arg("--force");
    }
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

/// Entries beside the artifact that are not dot-files.
fn visible(parent: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

#[test]
fn builds_killed_at_20_points_never_leave_a_partial_artifact() {
    let t = tempfile::tempdir().unwrap();
    let buckets = buckets_file(t.path());
    let parent = t.path().join("arts");
    std::fs::create_dir_all(&parent).unwrap();
    let out = parent.join("tiny");

    // A good, gated artifact at the path.
    let o = build_cmd(&out, &buckets, false).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let imgs = t.path().join("imgs");
    std::fs::create_dir_all(&imgs).unwrap();
    std::fs::copy(golden("images/tiny.png"), imgs.join("tiny.png")).unwrap();
    let o = run(
        "ane-export",
        &[
            "gate",
            out.to_str().unwrap(),
            "--images",
            imgs.to_str().unwrap(),
            "--skip",
            "vqa",
            "--buckets",
            buckets.to_str().unwrap(),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // Gated (tiny-a has no language model, so the VQA gate is skipped and
    // the artifact is gated but not accepted; what matters here is that its
    // record survives the kills intact).
    let good = Artifact::open(&out).unwrap();
    let good_acceptance = Acceptance::Incomplete {
        skipped: vec!["vqa".into()],
    };
    assert_eq!(good.acceptance(), good_acceptance);
    let good_manifest = std::fs::read(out.join("manifest.json")).unwrap();

    // How long an uninterrupted rebuild takes here.
    let scratch = t.path().join("scratch");
    let t0 = Instant::now();
    assert!(
        build_cmd(&scratch, &buckets, false)
            .status()
            .unwrap()
            .success()
    );
    let full = t0.elapsed();

    // What the killed builds write goes to the staging directory beside the
    // artifact, never to TMPDIR, where no later build would clean it.
    let tmpdir = t.path().join("tmp");
    std::fs::create_dir_all(&tmpdir).unwrap();
    let mut replaced = 0;
    for k in 0..20 {
        let mut child = build_cmd(&out, &buckets, true)
            .env("TMPDIR", &tmpdir)
            .spawn()
            .unwrap();
        std::thread::sleep(full.mul_f64((k as f64 + 0.5) / 20.0));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        // The path holds a whole artifact, every file as its manifest says:
        // the accepted one, untouched, or a complete new (ungated) one.
        let a = Artifact::open(&out).unwrap_or_else(|e| panic!("kill {k}: {e}"));
        a.verify().unwrap_or_else(|e| panic!("kill {k}: {e}"));
        if std::fs::read(out.join("manifest.json")).unwrap() == good_manifest {
            assert_eq!(a.acceptance(), good_acceptance, "kill {k}");
        } else {
            replaced += 1;
            assert_eq!(a.acceptance(), Acceptance::NotGated, "kill {k}");
            // ane-run refuses what the gates did not accept.
            let o = run(
                "ane-run",
                &[
                    "embed",
                    "--artifact",
                    out.to_str().unwrap(),
                    golden("images/tiny.png").to_str().unwrap(),
                    "--out",
                    t.path().join("emb").to_str().unwrap(),
                ],
            );
            assert_eq!(o.status.code(), Some(2), "kill {k}");
        }
        assert_eq!(
            visible(&parent),
            vec!["tiny"],
            "kill {k}: nothing else appears beside it"
        );
    }
    // Whatever the kills left (a lock file, temporary directories) does not
    // block the next build, which cleans it up.
    let o = build_cmd(&out, &buckets, true).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let left: Vec<String> = std::fs::read_dir(&parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(left, vec!["tiny"], "stale files left: {left:?}");
    let left: Vec<_> = tmpdir
        .read_dir()
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "killed builds left {left:?} in TMPDIR");
    eprintln!("{replaced} of 20 kills came after the new artifact was in place");
}

/// Mount a tmpfs of `size` at `dir`; false when this process may not mount.
fn mount_tmpfs(dir: &Path, size: &str) -> bool {
    Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "tmpfs",
            dir.to_str().unwrap(),
        ])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_full_disk_gives_a_clear_error_and_no_partial_artifact() {
    let t = tempfile::tempdir().unwrap();
    let buckets = buckets_file(t.path());
    let disk = t.path().join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let out = disk.join("tiny");
    let mounted = mount_tmpfs(&disk, "400k");
    let o = if mounted {
        // A 400 KB filesystem: the package's ~1 MB of weights cannot fit.
        let o = build_cmd(&out, &buckets, false).output().unwrap();
        let left: Vec<_> = std::fs::read_dir(&disk)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let _ = Command::new("umount").arg(&disk).status();
        assert!(left.is_empty(), "left on the full disk: {left:?}");
        o
    } else {
        // Without mount rights: the same failure from a file size limit.
        use std::os::unix::process::CommandExt;
        let mut c = build_cmd(&out, &buckets, false);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(|| {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let lim = libc::rlimit {
                    rlim_cur: 400 << 10,
                    rlim_max: 400 << 10,
                };
                libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
                Ok(())
            });
        }
        let o = c.output().unwrap();
        assert!(!out.exists());
        o
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("No space left on device") || err.contains("File too large"),
        "{err}"
    );
    assert!(
        err.contains("Python failed during emission") || err.contains("tiny"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn two_builds_into_one_directory_one_wins_the_other_fails_cleanly() {
    let t = tempfile::tempdir().unwrap();
    let buckets = buckets_file(t.path());
    let out = t.path().join("tiny");
    let a = build_cmd(&out, &buckets, false).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let b = build_cmd(&out, &buckets, false).spawn().unwrap();
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let ok = [&a, &b].iter().filter(|o| o.status.success()).count();
    assert_eq!(ok, 1, "exactly one build wins");
    let loser = if a.status.success() { &b } else { &a };
    let err = String::from_utf8_lossy(&loser.stderr);
    assert_eq!(loser.status.code(), Some(2), "{err}");
    assert!(
        err.contains("another build is writing there") || err.contains("already exists"),
        "{err}"
    );
    let art = Artifact::open(&out).unwrap();
    art.verify().unwrap();
    assert_eq!(visible(t.path()), vec!["buckets.yaml", "tiny"]);
}
