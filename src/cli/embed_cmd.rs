//! `ane-run embed`: images, folders and frame streams through an accepted artifact.
//!
//! A source thread lists the images (arguments, a folder, or stdin lines);
//! `--jobs` worker threads decode and preprocess them into a bounded queue
//! while the main thread executes one image after another, in input order.
//! `--no-overlap` does each image's host work and execution in turn. An
//! image that cannot be read fails alone (exit 1 at the end); an error
//! executing or writing stops the run there (exit 2).

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use serde_json::json;

use super::EmbedArgs;
use crate::artifact::Acceptance;
use crate::error::Error;
use crate::runtime::{Embedding, Executor, LoadOptions, MilExecutor, Prepared, Runtime};
use crate::tensor_file::{self, OwnedTensor};

const IMAGE_EXTS: [&str; 4] = ["png", "jpg", "jpeg", "webp"];

/// The images to embed: files as given, a folder's images (sorted), or `-`.
enum Source {
    List(Vec<PathBuf>),
    Stdin,
}

fn source(inputs: &[PathBuf]) -> crate::Result<Source> {
    if inputs.len() == 1 && inputs[0].as_os_str() == "-" {
        return Ok(Source::Stdin);
    }
    let mut out = Vec::new();
    for p in inputs {
        if p.as_os_str() == "-" {
            return Err(Error::Invalid(
                "`-` (stdin) cannot be mixed with other inputs".into(),
            ));
        }
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| Error::io(p, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.is_file()
                        && f.extension().is_some_and(|x| {
                            IMAGE_EXTS.contains(&x.to_string_lossy().to_lowercase().as_str())
                        })
                })
                .collect();
            v.sort();
            if v.is_empty() {
                return Err(Error::checkpoint(
                    p,
                    "no .png, .jpg, .jpeg or .webp images in this folder",
                ));
            }
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    Ok(Source::List(out))
}

/// The output file's name for `image`: its stem, or with `-1`, `-2`, ...
/// when an earlier image of this run took that name. Names are compared
/// ignoring case, as macOS's file systems do by default.
fn output_name(image: &Path, taken: &mut BTreeSet<String>) -> String {
    let stem = image
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "image".into());
    let name = (0..)
        .map(|k| match k {
            0 => format!("{stem}.safetensors"),
            k => format!("{stem}-{k}.safetensors"),
        })
        .find(|n| !taken.contains(&n.to_lowercase()))
        .unwrap_or_default();
    taken.insert(name.to_lowercase());
    name
}

/// Write one image's outputs; returns the path written.
fn write(
    out_dir: &Path,
    image: &Path,
    e: &Embedding,
    taken: &mut BTreeSet<String>,
) -> crate::Result<PathBuf> {
    let path = out_dir.join(output_name(image, taken));
    let mut tensors = vec![(
        "embeds".to_string(),
        OwnedTensor::f32(vec![e.tokens, e.out_dim], &e.embeds),
    )];
    for (i, d) in e.deepstack.iter().enumerate() {
        tensors.push((
            format!("deepstack.{i}"),
            OwnedTensor::f32(vec![e.tokens, e.out_dim], d),
        ));
    }
    let g: Vec<i64> = e.grid_thw.iter().map(|&v| v as i64).collect();
    tensors.push(("grid_thw".into(), OwnedTensor::i64(vec![1, 3], &g)));
    let mut meta = std::collections::HashMap::new();
    meta.insert("bucket".to_string(), e.bucket.clone());
    meta.insert("image".to_string(), image.display().to_string());
    tensor_file::write(&path, tensors, Some(meta))?;
    Ok(path)
}

/// Load an artifact for `ane-run`: the executor chosen by `kind` (Core ML
/// with CPU_AND_NE and `coreml`'s limits, or the interpreter at
/// `precision`), hashes verified, acceptance required unless
/// `allow_unaccepted` (then a warning).
pub(super) fn open_runtime(
    artifact: &Path,
    kind: super::ExecutorKind,
    coreml: &super::CoreMlArgs,
    precision: crate::interp::Precision,
    allow_unaccepted: bool,
) -> crate::Result<Runtime> {
    let executor: Box<dyn Executor> = match coreml.executor(kind, "CPU_AND_NE")? {
        Some(c) => Box::new(c),
        None => Box::new(MilExecutor(precision)),
    };
    let rt = Runtime::load(
        artifact,
        LoadOptions {
            allow_unaccepted,
            executor,
        },
    )?;
    if rt.acceptance != Acceptance::Accepted {
        eprintln!(
            "warning: {} is not accepted by the gates ({:?}); running it because of --allow-unaccepted",
            artifact.display(),
            rt.acceptance
        );
    }
    Ok(rt)
}

pub(super) fn run(a: EmbedArgs) -> anyhow::Result<ExitCode> {
    let rt = open_runtime(
        &a.artifact,
        a.executor,
        &a.coreml,
        a.precision,
        a.allow_unaccepted,
    )?;
    let src = source(&a.inputs)?;
    let out_dir = a.out.clone().unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&out_dir).map_err(|e| Error::io(&out_dir, e))?;
    let total = match &src {
        Source::List(v) => Some(v.len() as u64),
        Source::Stdin => None,
    };
    let bar =
        indicatif::ProgressBar::with_draw_target(total, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} {elapsed}")
    {
        bar.set_style(style);
    }
    let t0 = Instant::now();
    let mut failed: Vec<(PathBuf, String)> = Vec::new();
    let mut done = 0usize;
    let mut taken = BTreeSet::new();
    // An image that cannot be read fails alone; an error executing or
    // writing is the tool's (the executor, the output folder), so the run
    // stops there.
    let mut fatal: Option<Error> = None;
    let mut finish = |path: PathBuf, prepared: crate::Result<Prepared>| -> bool {
        bar.set_message(path.display().to_string());
        let p = match prepared {
            Ok(p) => p,
            Err(e) => {
                bar.suspend(|| eprintln!("error: {e}"));
                failed.push((path, e.to_string()));
                bar.inc(1);
                return true;
            }
        };
        let r = rt.execute(&p).and_then(|e| {
            let out = write(&out_dir, &path, &e, &mut taken)?;
            Ok((e, out))
        });
        match r {
            Ok((e, out)) => {
                done += 1;
                let mut line = json!({
                    "image": path, "out": out, "bucket": e.bucket, "tokens": e.tokens,
                    "grid_thw": e.grid_thw,
                    "seconds": {"decode": p.decode_s, "preprocess": p.preprocess_s, "execute": e.execute_s,
                                "total": p.decode_s + p.preprocess_s + e.execute_s},
                });
                if let Some(s) = e.predict_s {
                    line["seconds"]["predict"] = json!(s);
                }
                bar.suspend(|| println!("{line}"));
                bar.inc(1);
                true
            }
            Err(e) => {
                fatal = Some(Error::Invalid(format!("{}: {e}", path.display())));
                false
            }
        }
    };

    let jobs = a.jobs.max(1);
    if a.no_overlap {
        let mut one = |p: PathBuf| {
            let prepared = rt.prepare(&p);
            finish(p, prepared)
        };
        match src {
            Source::List(v) => {
                for p in v {
                    if !one(p) {
                        break;
                    }
                }
            }
            Source::Stdin => {
                for line in std::io::stdin().lock().lines() {
                    let line = line.map_err(|e| Error::Invalid(format!("reading stdin: {e}")))?;
                    if !line.trim().is_empty() && !one(PathBuf::from(line.trim())) {
                        break;
                    }
                }
            }
        }
    } else {
        // source -> (index, path) -> workers prepare -> (index, path, result) -> in order here.
        let (path_tx, path_rx) = mpsc::sync_channel::<(usize, PathBuf)>(jobs);
        let (res_tx, res_rx) =
            mpsc::sync_channel::<(usize, PathBuf, crate::Result<Prepared>)>(jobs);
        let path_rx = Mutex::new(path_rx);
        let stop = AtomicBool::new(false);
        // Not scoped: when the run stops early it may be waiting on stdin,
        // and is left to end with the process (or at its next send).
        let source = std::thread::spawn(move || -> Option<String> {
            match src {
                Source::List(v) => {
                    for (i, p) in v.into_iter().enumerate() {
                        if path_tx.send((i, p)).is_err() {
                            break;
                        }
                    }
                }
                Source::Stdin => {
                    let mut i = 0;
                    for line in std::io::stdin().lock().lines() {
                        match line {
                            Ok(l) if l.trim().is_empty() => continue,
                            Ok(l) => {
                                if path_tx.send((i, PathBuf::from(l.trim()))).is_err() {
                                    break;
                                }
                                i += 1;
                            }
                            Err(e) => return Some(format!("reading stdin: {e}")),
                        }
                    }
                }
            }
            None
        });
        std::thread::scope(|s| {
            for _ in 0..jobs {
                let (res_tx, path_rx, rt, stop) = (res_tx.clone(), &path_rx, &rt, &stop);
                s.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let next = path_rx
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .recv_timeout(Duration::from_millis(50));
                        let (i, p) = match next {
                            Ok(v) => v,
                            Err(mpsc::RecvTimeoutError::Timeout) => continue,
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        };
                        let r = rt.prepare(&p);
                        if res_tx.send((i, p, r)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(res_tx);
            let mut pending = BTreeMap::new();
            let mut next = 0usize;
            // Leaving the loop drops the receiver, so no worker stays blocked.
            'results: for (i, p, r) in res_rx {
                pending.insert(i, (p, r));
                while let Some((p, r)) = pending.remove(&next) {
                    if !finish(p, r) {
                        stop.store(true, Ordering::Relaxed);
                        break 'results;
                    }
                    next += 1;
                }
            }
        });
        if fatal.is_none() {
            // Every path was taken, so the source has ended.
            if let Ok(Some(e)) = source.join() {
                return Err(Error::Invalid(e).into());
            }
        }
    }
    bar.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64();
    eprintln!(
        "embedded {done} images in {wall:.1} s ({:.2} images/s) with {}; {} failed{}",
        done as f64 / wall.max(1e-9),
        rt.executor().describe(),
        failed.len(),
        if fatal.is_some() { "; stopped" } else { "" }
    );
    for (p, e) in &failed {
        // The error names the image itself when it comes from reading it.
        match p.display().to_string() {
            p if e.starts_with(&format!("{p}: ")) => eprintln!("  failed: {e}"),
            p => eprintln!("  failed: {p}: {e}"),
        }
    }
    if let Some(e) = fatal {
        return Err(e.into());
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_image_gets_its_own_output_name() {
        let mut taken = BTreeSet::new();
        let names: Vec<String> = ["a/x.png", "x-1.jpg", "b/X.png", "c/x.webp", "noext"]
            .iter()
            .map(|p| output_name(Path::new(p), &mut taken))
            .collect();
        assert_eq!(
            names,
            [
                "x.safetensors",
                "x-1.safetensors",
                "X-2.safetensors",
                "x-3.safetensors",
                "noext.safetensors"
            ]
        );
    }
}
