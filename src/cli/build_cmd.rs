//! `ane-export build`: checkpoint -> ANE layout -> packages -> artifact directory.
//!
//! The artifact is assembled in a temporary sibling directory and renamed
//! into place; `manifest.json` is written last, so a directory without a
//! valid manifest is never an artifact. An advisory lock (`flock`) on a file
//! beside `--out` keeps two builds from interleaving and dies with its
//! process; an existing artifact is replaced only with `--force`, only once
//! the new one is complete, and by one atomic exchange where the OS has one.
//! What a killed build left behind is removed by the next one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use super::{BuildArgs, LayoutArgs};
use crate::bridge::{self, BuildSpec};
use crate::buckets::BucketsFile;
use crate::checkpoint::{Checkpoint, resolve_model};
use crate::error::Error;
use crate::export::host::PosInterpolation;
use crate::export::layout;
use crate::mlpackage::Package;
use crate::tensor_file::{self, OwnedTensor};

use crate::artifact::{ARTIFACT_FORMAT, files_under, sha256_file};

/// One progress bar over the build's stages; drawn only on a terminal.
struct Stages(indicatif::ProgressBar);

impl Stages {
    const NAMES: [&'static str; 6] = [
        "read",
        "layout",
        "emit and optimise",
        "verify",
        "hash",
        "write",
    ];

    fn new() -> Stages {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(Self::NAMES.len() as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} {elapsed}")
        {
            bar.set_style(style);
        }
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        Stages(bar)
    }

    fn stage(&self, i: usize, detail: &str) {
        self.0.set_position(i as u64);
        self.0.set_message(format!("{} {detail}", Self::NAMES[i]));
    }
}

impl Drop for Stages {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// An exclusive advisory lock (`flock`) on `.NAME.lock` beside the artifact:
/// released by the kernel however the build ends (a build killed with
/// SIGKILL leaves no stale lock), and the file is removed on a normal end.
struct Lock {
    path: PathBuf,
    _file: std::fs::File,
}

impl Lock {
    fn acquire(path: PathBuf) -> std::io::Result<Option<Lock>> {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::io::AsRawFd;
        loop {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?;
            // SAFETY: flock on a file descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = std::io::Error::last_os_error();
                return if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    Ok(None)
                } else {
                    Err(e)
                };
            }
            // The holder before us may have removed the file after we opened
            // it: the lock only counts on the file the path names now.
            let (held, now) = (file.metadata()?, std::fs::metadata(&path));
            if let Ok(now) = now
                && now.ino() == held.ino()
                && now.dev() == held.dev()
            {
                return Ok(Some(Lock { path, _file: file }));
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Removed while still held; the descriptor closes after.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Swap two paths atomically where the OS can (Linux `renameat2`, macOS
/// `renamex_np`): the old artifact stays whole until the new one is in place.
fn exchange(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    #[cfg(target_os = "linux")]
    // SAFETY: two NUL-terminated paths; no memory is shared with the kernel beyond the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    #[cfg(target_os = "macos")]
    // SAFETY: as above.
    let r = unsafe { libc::renamex_np(ca.as_ptr(), cb.as_ptr(), libc::RENAME_SWAP) };
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    let r = {
        let _ = (&ca, &cb);
        return Ok(false);
    };
    if r == 0 {
        Ok(true)
    } else {
        let e = std::io::Error::last_os_error();
        // Filesystems without the exchange fall back to two renames.
        if matches!(
            e.raw_os_error(),
            Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP)
        ) {
            Ok(false)
        } else {
            Err(e)
        }
    }
}

/// Remove what killed builds left beside the artifact (the lock is held, so
/// no other build is using them).
fn clean_stale(parent: &Path, name: &str) {
    let prefixes = [format!(".{name}.building-"), format!(".{name}.replaced-")];
    if let Ok(rd) = std::fs::read_dir(parent) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if prefixes.iter().any(|p| n.starts_with(p.as_str())) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

pub(super) fn run(a: BuildArgs) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    let (file, source) = BucketsFile::load(a.buckets.as_deref())?;
    let buckets = file
        .select(&a.bucket)
        .map_err(|m| Error::Invalid(format!("{source}: {m}")))?;

    if !a.per_bucket && a.target != super::Target::Macos15 {
        return Err(Error::Invalid(format!(
            "--target {}: multifunction packages need macOS 15; add --per-bucket for one package per bucket",
            a.target.coremltools_name()
        ))
        .into());
    }
    let out = a.out.clone();
    if out.is_file() {
        return Err(Error::Invalid(format!(
            "--out {}: is a file, expected a directory path",
            out.display()
        ))
        .into());
    }
    if out.exists() && !a.force {
        return Err(Error::Invalid(format!(
            "--out {}: already exists; pass --force to replace it",
            out.display()
        ))
        .into());
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "artifact".into());
    let lock_path = parent.join(format!(".{name}.lock"));
    let _lock = Lock::acquire(lock_path.clone())
        .map_err(|e| Error::io(&lock_path, e))?
        .ok_or_else(|| {
            Error::Invalid(format!(
                "--out {}: another build is writing there (it holds {})",
                out.display(),
                lock_path.display()
            ))
        })?;
    clean_stale(&parent, &name);

    let env = bridge::find_env()?;
    let stages = Stages::new();
    stages.stage(0, &a.model.model);
    let dir = resolve_model(&a.model.model, a.model.revision.as_deref())?;
    let ck = Checkpoint::open(&dir)?;
    stages.stage(1, "");
    // What the runtime needs besides the package (the family's host tables,
    // read before emission, so that a bad tensor fails the build early).
    let tables = ck.vision.host_tables(&ck)?;
    let weights = ck.vision.layout(&ck, layout::Storage::F16)?;
    // An export of NaN or Inf weights can only be wrong: refuse it (the
    // reference only warns, to help debugging).
    let nonfinite = ck.weights.nonfinite_tensors();
    if !nonfinite.is_empty() {
        return Err(Error::checkpoint(
            &dir,
            format!(
                "{} tensors hold NaN or Inf values ({}); refusing to export them",
                nonfinite.len(),
                nonfinite.join(", ")
            ),
        )
        .into());
    }
    let weight_bytes: usize = weights.iter().map(|t| t.data.len() * 2).sum();

    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.building-"))
        .tempdir_in(&parent)
        .map_err(|e| Error::io(&parent, e))?;
    let pkg_name = format!("{name}.mlpackage");
    let bucket_list: Vec<(String, usize)> = buckets
        .iter()
        .map(|b| (b.name.clone(), b.patches as usize))
        .collect();
    for (bname, n) in &bucket_list {
        ck.vision
            .check_bucket(*n)
            .map_err(|m| Error::Invalid(format!("bucket {bname}: {m}")))?;
    }
    let meta = json!({
        "author": "ane-export",
        "license": "",
        "version": env!("CARGO_PKG_VERSION"),
        "description": format!("{} vision tower for the Apple Neural Engine, buckets {}", ck.model_type,
            bucket_list.iter().map(|b| b.0.clone()).collect::<Vec<_>>().join(", ")),
        "user": {
            "source_model": dir.display().to_string(),
            "family": ck.family.name(),
            "bucket_patches": bucket_list.iter().map(|b| format!("{}={}", b.0, b.1)).collect::<Vec<_>>().join(","),
            "patch_size": ck.vision.patch_size().to_string(),
            "merge_size": ck.vision.merge_size().to_string(),
            "tool_version": env!("CARGO_PKG_VERSION"),
            "preprocessing": serde_json::to_string(&ck.preprocessor).unwrap_or_default(),
        }
    });
    // Only the configuration is needed past this point: unmap the
    // checkpoint's tensors, so emission holds the tower once (in fp16).
    let Checkpoint {
        family: tower_family,
        vision,
        model_type,
        preprocessor,
        weights: mapped,
        ..
    } = ck;
    drop(mapped);
    let faults: Vec<String> = a.fault.iter().map(|f| f.name().to_string()).collect();
    let program_faults: Vec<String> = a
        .fault
        .iter()
        .filter(|f| !f.is_host())
        .map(|f| f.name().to_string())
        .collect();
    // What the runtime computes on the host for this package.
    let mut host = vision.host_recipe();
    if a.fault.contains(&super::Fault::RopeTheta) {
        host.rope_theta *= 10.0;
    }
    if a.fault.contains(&super::Fault::PosAlign) {
        if host.pos_interpolation.is_none() {
            return Err(Error::Invalid(format!(
                "--fault pos-align: {} has no position table to resample",
                vision.family().name()
            ))
            .into());
        }
        host.pos_interpolation = Some(PosInterpolation::BilinearHalfPixel);
    }
    let t_emit = Instant::now();
    let target = if a.per_bucket {
        tmp.path().to_path_buf()
    } else {
        tmp.path().join(&pkg_name)
    };
    stages.stage(
        2,
        &format!(
            "({} buckets, weights {})",
            bucket_list.len(),
            a.weights.name()
        ),
    );
    let written = bridge::save_packages(
        &env,
        BuildSpec {
            cfg: &vision,
            target: a.target.coremltools_name(),
            weights: a.weights.name(),
            faults: &program_faults,
            query_chunk: a.query_chunk,
        },
        weights,
        &bucket_list,
        &target,
        !a.per_bucket,
        &meta,
    )?;
    let emit_s = t_emit.elapsed().as_secs_f64();

    stages.stage(3, "");
    // Verify with the project's own reader: each bucket's function has the static shapes it should.
    let c = &vision;
    let mut bucket_specs = Vec::new();
    for (bname, n) in &bucket_list {
        let pkg_path = if a.per_bucket {
            tmp.path().join(format!("{bname}.mlpackage"))
        } else {
            tmp.path().join(&pkg_name)
        };
        let pkg = Package::open(&pkg_path)?;
        let f = pkg
            .program
            .function(if a.per_bucket { None } else { Some(bname) })
            .map_err(Error::Invalid)?;
        let want_in: BTreeMap<String, Vec<usize>> = c.input_shapes(*n).into_iter().collect();
        let got_in: BTreeMap<String, Vec<usize>> = f
            .inputs
            .iter()
            .map(|i| (i.name.clone(), i.ty.shape.clone()))
            .collect();
        if got_in != want_in {
            return Err(Error::Invalid(format!(
                "bucket {bname}: inputs {got_in:?}, expected {want_in:?}"
            ))
            .into());
        }
        let unit = c.merge_size() * c.merge_size();
        let want_out = c.output_names();
        if f.outputs.len() != want_out.len()
            || f.outputs
                .iter()
                .zip(&want_out)
                .any(|(o, w)| &o.name != w || o.ty.shape != [1, c.out_hidden_size(), 1, n / unit])
        {
            return Err(Error::Invalid(format!("bucket {bname}: unexpected outputs")).into());
        }
        let mut spec = json!({
            "name": bname,
            "patches": n,
            "pixel_budget": *n as u64 * (c.patch_size() * c.patch_size()) as u64,
            "package": if a.per_bucket { format!("{bname}.mlpackage") } else { pkg_name.clone() },
            "function": if a.per_bucket { "main".to_string() } else { bname.clone() },
            "inputs": f.inputs.iter().map(|i| json!({"name": i.name, "shape": i.ty.shape, "dtype": i.ty.dtype})).collect::<Vec<_>>(),
            "outputs": f.outputs.iter().map(|o| json!({"name": o.name, "shape": o.ty.shape, "dtype": o.ty.dtype})).collect::<Vec<_>>(),
        });
        if let Some(note) = c.capacity_note() {
            spec["capacity"] = note.into();
        }
        bucket_specs.push(spec);
    }

    tensor_file::write(
        &tmp.path().join("host.safetensors"),
        tables
            .iter()
            .map(|(name, shape, v)| (name.clone(), OwnedTensor::f32(shape.clone(), v)))
            .collect(),
        None,
    )?;

    stages.stage(4, "");
    let mut files = BTreeMap::new();
    for f in files_under(tmp.path())? {
        files.insert(
            f.to_string_lossy().to_string(),
            sha256_file(&tmp.path().join(&f))?,
        );
    }
    let mut source_files = BTreeMap::new();
    for f in std::iter::once(dir.join("config.json")).chain(crate::checkpoint::weight_files(&dir)?)
    {
        source_files.insert(
            f.file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default(),
            sha256_file(&f)?,
        );
    }
    let manifest = json!({
        "artifact_format": ARTIFACT_FORMAT,
        "tool": {"name": "ane-export", "version": env!("CARGO_PKG_VERSION")},
        "source": {"model": a.model.model, "revision": a.model.revision, "path": dir, "model_type": model_type, "sha256": source_files},
        "family": tower_family.name(),
        "config": vision,
        "preprocessing": preprocessor,
        "host": host,
        "precision": "fp16",
        "weights": a.weights.name(),
        "target": a.target.coremltools_name(),
        "multifunction": !a.per_bucket,
        "query_chunk": a.query_chunk,
        "buckets": bucket_specs,
        "files": files,
        "gates": null,
    });
    let mut manifest = manifest;
    if !faults.is_empty() {
        manifest["test_faults"] = json!(faults);
    }
    stages.stage(5, "");
    // Written last: a directory without it is not an artifact.
    tensor_file::write_atomic(
        &tmp.path().join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?.as_bytes(),
    )?;

    if out.exists() {
        // One atomic swap: `out` is whole at every instant, old or new; the
        // temporary directory then holds the old artifact and is removed.
        if exchange(tmp.path(), &out)
            .with_context(|| format!("swapping the new artifact into {}", out.display()))?
        {
            drop(tmp);
        } else {
            let built = tmp.keep();
            let old = parent.join(format!(".{name}.replaced-{}", std::process::id()));
            std::fs::rename(&out, &old)
                .with_context(|| format!("moving the old artifact {} aside", out.display()))?;
            std::fs::rename(&built, &out)
                .with_context(|| format!("renaming into {}", out.display()))?;
            let _ = std::fs::remove_dir_all(&old);
        }
    } else {
        let built = tmp.keep();
        std::fs::rename(&built, &out)
            .with_context(|| format!("renaming into {}", out.display()))?;
    }
    drop(stages);
    let total_s = t0.elapsed().as_secs_f64();
    let summary = json!({
        "artifact": out, "buckets": bucket_list.iter().map(|b| &b.0).collect::<Vec<_>>(),
        "packages": written.iter().map(|p| p.file_name().map(|n| n.to_string_lossy().to_string())).collect::<Vec<_>>(),
        "fp16_weight_bytes": weight_bytes, "emit_s": emit_s, "total_s": total_s,
        "peak_rss_mb": super::peak_rss_mib(),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eprintln!(
            "built {} ({} buckets: {}) in {total_s:.1} s (emission {emit_s:.1} s)",
            out.display(),
            bucket_list.len(),
            bucket_list
                .iter()
                .map(|b| format!("{} = {} patches", b.0, b.1))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `ane-export layout`: the ANE-layout weights and their description.
pub(super) fn layout(a: LayoutArgs) -> anyhow::Result<ExitCode> {
    let dir = resolve_model(&a.model.model, a.model.revision.as_deref())?;
    let ck = Checkpoint::open(&dir)?;
    let weights = ck.vision.layout(&ck, layout::Storage::F32)?;
    if a.out.is_file() {
        return Err(Error::Invalid(format!(
            "--out {}: is a file, expected a directory",
            a.out.display()
        ))
        .into());
    }
    std::fs::create_dir_all(&a.out).map_err(|e| Error::io(&a.out, e))?;
    let desc: Vec<serde_json::Value> = weights
        .iter()
        .map(|t| json!({"name": t.name, "shape": t.shape, "dtype": "f32", "meaning": t.meaning}))
        .collect();
    let doc = json!({
        "family": ck.family.name(),
        "layout": "ANE: activations (B, C, 1, S); every Linear a 1x1 conv [out, in, 1, 1]; \
                   patch embedding folded over temporal frames to [D, 3*P*P, 1, 1]; norms over channels",
        "config": ck.vision,
        "source": dir,
        "tensors": desc,
    });
    let count = weights.len();
    tensor_file::write(
        &a.out.join("weights.safetensors"),
        weights
            .into_iter()
            .map(|t| {
                let values = match t.data {
                    layout::LayoutData::F32(v) => v,
                    layout::LayoutData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
                };
                (t.name, OwnedTensor::f32(t.shape, &values))
            })
            .collect(),
        None,
    )?;
    tensor_file::write_atomic(
        &a.out.join("layout.json"),
        serde_json::to_string_pretty(&doc)?.as_bytes(),
    )?;
    eprintln!("wrote {count} tensors to {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}
