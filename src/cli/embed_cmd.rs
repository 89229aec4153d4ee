//! `ane-run embed`: images, folders and frame streams through an accepted artifact.
//!
//! A source thread lists the images (arguments, a folder, or stdin lines);
//! `--jobs` worker threads decode and preprocess them, at most 2 × jobs
//! images ahead, while the main thread executes one image after another,
//! in input order (the library's [`crate::runtime::pipeline::overlapped`]).
//! `--no-overlap` does each image's host work and execution in turn. An
//! image that cannot be read fails alone (exit 1 at the end); an error
//! executing or writing stops the run there (exit 2).

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use serde_json::json;

use super::EmbedArgs;
use crate::artifact::{Acceptance, Cleared};
use crate::error::Error;
use crate::exec::{Executor, MilExecutor};
use crate::runtime::pipeline::{in_turn, overlapped};
use crate::runtime::{Embedding, Prepared, Runtime};
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

/// The longest stem kept in an output name, in bytes: with `-k` and
/// `.safetensors` it stays within the usual 255-byte limit on a name.
const MAX_STEM: usize = 200;

/// The output file's name for `image`: its stem (its first [`MAX_STEM`]
/// bytes), or with `-1`, `-2`, ... when an earlier image of this run took
/// that name. Names are compared ignoring case, as macOS's file systems do
/// by default.
fn output_name(image: &Path, taken: &mut BTreeSet<String>) -> String {
    let mut stem = image
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "image".into());
    if stem.len() > MAX_STEM {
        let cut = (0..=MAX_STEM)
            .rev()
            .find(|&i| stem.is_char_boundary(i))
            .unwrap_or(0);
        stem.truncate(cut);
    }
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
    let mut tensors: Vec<(String, OwnedTensor)> = e
        .outputs
        .iter()
        .map(|o| {
            (
                o.name.clone(),
                OwnedTensor::f32(vec![o.rows, o.width], &o.values),
            )
        })
        .collect();
    let g: Vec<i64> = e.grid_thw.iter().map(|&v| v as i64).collect();
    tensors.push(("grid_thw".into(), OwnedTensor::i64(vec![1, 3], &g)));
    let mut meta = std::collections::HashMap::new();
    meta.insert("bucket".to_string(), e.bucket.clone());
    meta.insert("image".to_string(), image.display().to_string());
    tensor_file::write(&path, tensors, Some(meta))?;
    Ok(path)
}

/// Load an artifact for `ane-run`: the executor chosen by `kind` (Core ML
/// with CPU_AND_NE, the Core AI runtime on its `.aimodel`, both with
/// `coreml`'s limits, or the interpreter `mil`), hashes verified,
/// acceptance required unless `allow_unaccepted` (then a warning).
pub(super) fn open_runtime(
    artifact: &Path,
    kind: super::ExecutorKind,
    coreml: &super::CoreMlArgs,
    mil: MilExecutor,
    allow_unaccepted: bool,
) -> crate::Result<Runtime> {
    let cleared = clear(artifact, allow_unaccepted)?;
    let executor: Box<dyn Executor> =
        kind.for_artifact(cleared.artifact(), "CPU_AND_NE", coreml.timeouts(), mil)?;
    Runtime::load(cleared, executor)
}

/// The artifact cleared to run: accepted by the gates, or with
/// `--allow-unaccepted` whatever they said (then a warning).
pub(super) fn clear(artifact: &Path, allow_unaccepted: bool) -> crate::Result<Cleared> {
    if !allow_unaccepted {
        return Cleared::accepted(artifact);
    }
    let c = Cleared::without_acceptance(artifact)?;
    if c.acceptance() != &Acceptance::Accepted {
        eprintln!(
            "warning: {} is not accepted by the gates ({}); running it because of --allow-unaccepted",
            artifact.display(),
            c.acceptance()
        );
    }
    Ok(c)
}

pub(super) fn run(a: EmbedArgs, interp: crate::interp::Settings) -> anyhow::Result<ExitCode> {
    let rt = open_runtime(
        &a.artifact,
        a.executor,
        &a.coreml,
        super::mil(a.precision, interp),
        a.allow_unaccepted,
    )?;
    if !a.text.is_empty() || a.texts.is_some() {
        return run_texts(&a, &rt);
    }
    if rt.artifact.cfg.input().tokens().is_some() {
        return Err(Error::Invalid(format!(
            "{} is a text encoder: give --text TEXT or --texts FILE",
            a.artifact.display()
        ))
        .into());
    }
    let src = source(&a.inputs)?;
    let out_dir = a.out.clone().unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&out_dir).map_err(|e| Error::io(&out_dir, e))?;
    let total = match &src {
        Source::List(v) => Some(v.len() as u64),
        Source::Stdin => None,
    };
    let bar = indicatif::ProgressBar::with_draw_target(total, super::draw_target());
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
    let finish = |path: PathBuf, prepared: crate::Result<Prepared>| -> bool {
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
                    "image": path, "out": out, "bucket": e.bucket, "tokens": e.outputs.first().map_or(0, |o| o.rows),
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

    let paths: Box<dyn Iterator<Item = std::io::Result<PathBuf>> + Send> = match src {
        Source::List(v) => Box::new(v.into_iter().map(Ok)),
        Source::Stdin => Box::new(
            // Not a StdinLock: the reading thread owns this.
            std::io::BufReader::new(std::io::stdin())
                .lines()
                .filter(|l| l.as_ref().map_or(true, |l| !l.trim().is_empty()))
                .map(|l| l.map(|l| PathBuf::from(l.trim()))),
        ),
    };
    let prepare = |p: &PathBuf| rt.prepare(p);
    let stdin_error = if a.no_overlap {
        in_turn(paths, prepare, finish)
    } else {
        overlapped(paths, a.jobs.max(1), prepare, finish)
    };
    bar.finish_and_clear();
    if let Some(e) = stdin_error {
        fatal = Some(Error::Invalid(format!(
            "reading image paths from stdin: {e}"
        )));
    }
    let wall = t0.elapsed().as_secs_f64();
    super::say(&format!(
        "embedded {done} images in {wall:.1} s ({:.2} images/s) with {}; {} failed{}",
        done as f64 / wall.max(1e-9),
        rt.executor().describe(),
        failed.len(),
        if fatal.is_some() { "; stopped" } else { "" }
    ));
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
    } else if done == 0 {
        // Nothing could be embedded: the run did nothing it was asked to.
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    })
}

/// `embed --text` / `--texts`: each text tokenized by the artifact's
/// tokenizer (truncated to the largest bucket, said on stderr), run in the
/// smallest bucket that holds it, written to `text-<i>.safetensors`; a
/// JSON line per text on stdout.
fn run_texts(a: &EmbedArgs, rt: &Runtime) -> anyhow::Result<ExitCode> {
    rt.artifact.cfg.tokens()?;
    let mut texts = a.text.clone();
    if let Some(f) = &a.texts {
        let s = std::fs::read_to_string(f).map_err(|e| Error::io(f, e))?;
        texts.extend(s.lines().map(str::to_string));
        if s.is_empty() {
            return Err(Error::config(f, "no texts: expected one text per line").into());
        }
    }
    let out_dir = a.out.clone().unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&out_dir).map_err(|e| Error::io(&out_dir, e))?;
    let t0 = Instant::now();
    for (i, text) in texts.iter().enumerate() {
        let tokens = rt.tokenize(text)?;
        if tokens.truncated() {
            eprintln!(
                "text {i}: truncated from {} to {} tokens (the largest bucket)",
                tokens.full_len,
                tokens.len()
            );
        }
        let e = rt.embed_tokens(&tokens)?;
        let mut tensors: Vec<(String, OwnedTensor)> = e
            .outputs
            .iter()
            .map(|o| {
                (
                    o.name.clone(),
                    OwnedTensor::f32(vec![o.rows, o.width], &o.values),
                )
            })
            .collect();
        let ids: Vec<i64> = tokens.ids.iter().map(|&v| v as i64).collect();
        tensors.push(("input_ids".into(), OwnedTensor::i64(vec![ids.len()], &ids)));
        let mut meta = std::collections::HashMap::new();
        meta.insert("bucket".to_string(), e.bucket.clone());
        meta.insert("text".to_string(), text.clone());
        let path = out_dir.join(format!("text-{i:04}.safetensors"));
        tensor_file::write(&path, tensors, Some(meta))?;
        let mut line = json!({
            "text": i, "out": path, "bucket": e.bucket, "tokens": e.tokens,
            "truncated_from": tokens.truncated().then_some(tokens.full_len),
            "seconds": {"execute": e.execute_s},
        });
        if let Some(s) = e.predict_s {
            line["seconds"]["predict"] = json!(s);
        }
        println!("{line}");
    }
    let wall = t0.elapsed().as_secs_f64();
    super::say(&format!(
        "embedded {} texts in {wall:.1} s with {}",
        texts.len(),
        rt.executor().describe()
    ));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_stem_is_cut_at_a_character() {
        let mut taken = BTreeSet::new();
        let long = format!("{}.png", "é".repeat(150)); // 300 bytes
        let a = output_name(Path::new(&long), &mut taken);
        let b = output_name(Path::new(&long), &mut taken);
        assert_eq!(a, format!("{}.safetensors", "é".repeat(100)));
        assert_eq!(b, format!("{}-1.safetensors", "é".repeat(100)));
        assert!(b.len() <= 255);
    }

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
