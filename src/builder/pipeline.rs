//! The build itself: checkpoint -> ANE layout -> packages -> artifact.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use super::publish::{Lock, clean_stale, exchange};
use super::{BuildPlan, Built, Fault, Stage};
use crate::artifact::{ARTIFACT_FORMAT, files_under, sha256_file};
use crate::bridge::{self, BuildSpec};
use crate::checkpoint::resolve_model;
use crate::error::{BuildError, Error, Result};
use crate::export::layout;
use crate::family::{Input, Model, Processor};

/// The tokenizer's file in a text encoder's artifact.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
use crate::mlpackage::Package;
use crate::tensor_file::{self, OwnedTensor};

/// Build `plan`'s artifact, telling `progress` each stage as it starts.
pub fn build(plan: &BuildPlan, progress: &dyn Fn(Stage, &str)) -> Result<Built> {
    let t0 = Instant::now();
    plan.check()?;
    let out = &plan.out;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|error| BuildError::OutParent {
        out: out.clone(),
        parent: parent.clone(),
        error,
    })?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "artifact".into());
    let lock_path = parent.join(format!(".{name}.lock"));
    // The lock and the temporary directory are the build's own: an error
    // making them names `--out`, where the user asked to write.
    let unwritable = |error: std::io::Error| BuildError::OutUnwritable {
        out: out.clone(),
        error,
    };
    let _lock = Lock::acquire(lock_path.clone())
        .map_err(unwritable)?
        .ok_or_else(|| Error::Busy {
            out: out.clone(),
            lock: lock_path.clone(),
        })?;
    clean_stale(&parent, &name);

    let env = bridge::find_env()?;
    progress(Stage::Read, &plan.model);
    let dir = resolve_model(&plan.model, plan.revision.as_deref(), &plan.hub_events)?;
    let ck = Model::open(&dir)?;
    progress(Stage::Layout, "");
    // What the runtime needs besides the package (the family's host tables,
    // read before emission, so that a bad tensor fails the build early).
    let tables = ck.vision.host_tables(&ck)?;
    let weights = ck.vision.layout(&ck, layout::Storage::F16)?;
    // Tower tensors the layout did not read: the config describes fewer
    // layers than were saved, and the reference would agree with it.
    ck.check_all_read()?;
    // An export of NaN or Inf weights can only be wrong: refuse it (the
    // reference only warns, to help debugging).
    let tensors = ck.weights.nonfinite_tensors();
    if !tensors.is_empty() {
        return Err(Error::NonFinite {
            path: dir.clone(),
            tensors,
        });
    }
    let weight_bytes: usize = weights.iter().map(|t| t.data.len() * 2).sum();

    // 0777 less the umask (tempfile's default, 0700, would make every
    // artifact private to its builder).
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.building-"))
        .permissions(tensor_file::umask_mode(0o777))
        .tempdir_in(&parent)
        .map_err(unwritable)?;
    let pkg_name = format!("{name}.mlpackage");
    // A fixed-resolution encoder builds its processor's size unless the
    // buckets file gives it buckets in pixels.
    // A text encoder builds b128 and b512 unless the buckets file gives it
    // buckets in tokens.
    let buckets = match (ck.vision.input(), &ck.processor) {
        (Input::Pixels(px), Processor::Image(pre)) => match px.default_buckets(pre) {
            Some(d) if plan.buckets.iter().all(|b| b.pixels.is_none()) => d,
            _ => plan.buckets.clone(),
        },
        (Input::Tokens(t), _) if plan.buckets.iter().all(|b| b.tokens.is_none()) => {
            t.default_buckets()
        }
        _ => plan.buckets.clone(),
    };
    let bucket_list: Vec<(String, usize)> = buckets
        .iter()
        .map(|b| Ok((b.name.clone(), ck.vision.bucket_slots(b)?)))
        .collect::<std::result::Result<_, crate::error::BucketsError>>()
        .map_err(|error| Error::Bucket { name: None, error })?;
    for (bname, n) in &bucket_list {
        ck.vision.check_bucket(*n).map_err(|error| Error::Bucket {
            name: Some(bname.clone()),
            error,
        })?;
    }
    // The residual scale: the user's, else the smallest the calibration
    // images' fp32 stream leaves headroom with (calibrate.rs), for a family
    // whose builder scales.
    let calibration = match plan.residual_scale {
        None if ck.family.residual_scale() => {
            let cases = match ck.vision.input() {
                Input::Pixels(_) => crate::gate::cosine::cases(plan.calibration_images.as_deref())?,
                Input::Tokens(_) => {
                    if let Some(d) = &plan.calibration_images {
                        return Err(Error::Invalid(format!(
                            "--calibration-images {}: a text encoder calibrates on the golden texts \
                             (or give --residual-scale)",
                            d.display()
                        )));
                    }
                    crate::gate::cosine::text_cases(None)?
                }
            };
            progress(
                Stage::Calibrate,
                &format!(
                    "(the fp32 reference on {} {})",
                    cases.len(),
                    ck.vision.input().noun()
                ),
            );
            Some(super::calibrate::calibrate(&ck, &bucket_list, &cases)?)
        }
        _ => None,
    };
    let residual_scale = plan
        .residual_scale
        .or(calibration.as_ref().map(|c| c.residual_scale));
    // 1 is the stream as it is: nothing scaled, nothing for the host.
    let program_scale = residual_scale.filter(|&s| s > 1);
    let buckets_meta = bucket_list
        .iter()
        .map(|b| format!("{}={}", b.0, b.1))
        .collect::<Vec<_>>()
        .join(",");
    let mut meta = json!({
        "author": "ane-export",
        "license": "",
        "version": env!("CARGO_PKG_VERSION"),
        "description": format!("{} {} for the Apple Neural Engine, buckets {}", ck.model_type,
            match ck.vision.input() { Input::Pixels(_) => "vision tower", Input::Tokens(_) => "text encoder" },
            bucket_list.iter().map(|b| b.0.clone()).collect::<Vec<_>>().join(", ")),
        "user": {
            // The model's name, never a path of the building machine.
            "source_model": source_name(&plan.model, &dir),
            "family": ck.family.name(),
            "tool_version": env!("CARGO_PKG_VERSION"),
        }
    });
    match (ck.vision.input(), &ck.processor) {
        (Input::Pixels(px), Processor::Image(pre)) => {
            let user = &mut meta["user"];
            user["bucket_patches"] = json!(buckets_meta);
            user["patch_size"] = json!(px.patch_size().to_string());
            user["merge_size"] = json!(px.merge_size().to_string());
            user["preprocessing"] = json!(serde_json::to_string(pre).unwrap_or_default());
        }
        _ => meta["user"]["bucket_tokens"] = json!(buckets_meta),
    }
    // Only the configuration is needed past this point: unmap the
    // checkpoint's tensors, so emission holds the tower once (in fp16).
    let Model {
        family: tower_family,
        vision,
        processor,
        checkpoint,
        ..
    } = ck;
    let model_type = checkpoint.model_type.clone();
    drop(checkpoint);
    let faults: Vec<String> = plan.faults.iter().map(|f| f.name().to_string()).collect();
    let program_faults: Vec<String> = plan
        .faults
        .iter()
        .filter(|f| !f.is_host())
        .map(|f| f.name().to_string())
        .collect();
    if let Some(s) = program_scale
        && !tower_family.residual_scale()
    {
        return Err(BuildError::ResidualScaleFamily {
            scale: s,
            family: tower_family.name(),
            families: crate::family::Family::residual_scale_families(),
        }
        .into());
    }
    if let Some(s) = plan.branch_scale
        && !tower_family.branch_scale()
    {
        return Err(BuildError::BranchScaleFamily {
            scale: s,
            family: tower_family.name(),
            families: crate::family::Family::branch_scale_families(),
        }
        .into());
    }
    // What the runtime computes on the host for this package.
    let mut host = vision.host_recipe();
    if !vision.residual_outputs().is_empty() {
        host.output_scale = program_scale;
    }
    if plan.faults.contains(&Fault::RopeTheta) {
        match &mut host.rope_theta {
            Some(t) => *t *= 10.0,
            None => {
                return Err(BuildError::FaultNotApplicable {
                    fault: Fault::RopeTheta.name(),
                    family: vision.family().name(),
                    what: "rotary embedding",
                }
                .into());
            }
        }
    }
    if plan.faults.contains(&Fault::PosAlign) {
        match &mut host.pos_interpolation {
            Some(p) => *p = p.misaligned(),
            None => {
                return Err(BuildError::FaultNotApplicable {
                    fault: Fault::PosAlign.name(),
                    family: vision.family().name(),
                    what: "position table to resample",
                }
                .into());
            }
        }
    }
    let t_emit = Instant::now();
    // An artifact without the package still emits it, to translate it, in
    // a directory of the staging one that is removed before hashing.
    let pkg_dir = if plan.format.mlpackage() {
        tmp.path().to_path_buf()
    } else {
        tmp.path().join(".mlpackage-scratch")
    };
    let target = if plan.per_bucket {
        pkg_dir.clone()
    } else {
        pkg_dir.join(&pkg_name)
    };
    progress(
        Stage::Emit,
        &format!(
            "({} buckets, weights {})",
            bucket_list.len(),
            plan.weights.name()
        ),
    );
    let written = bridge::save_packages(
        &env,
        BuildSpec {
            cfg: &vision,
            target: plan.target.coremltools_name(),
            weights: plan.weights.name(),
            faults: &program_faults,
            query_chunk: plan.query_chunk,
            residual_scale: program_scale,
            branch_scale: plan.branch_scale,
            scratch: Some(tmp.path()),
        },
        weights,
        &bucket_list,
        &target,
        !plan.per_bucket,
        &meta,
    )?;
    let emit_s = t_emit.elapsed().as_secs_f64();

    progress(Stage::Verify, "");
    // Verify with the project's own reader: each bucket's function has the static shapes it should.
    let c = &vision;
    let mut bucket_specs = Vec::new();
    // (package, its function, the bucket) for the Core AI translation.
    let mut aimodel_sources = Vec::new();
    for (bname, n) in &bucket_list {
        let pkg_path = if plan.per_bucket {
            pkg_dir.join(format!("{bname}.mlpackage"))
        } else {
            pkg_dir.join(&pkg_name)
        };
        let pkg = Package::open(&pkg_path)?;
        let f = pkg
            .program
            .function(if plan.per_bucket { None } else { Some(bname) })
            .map_err(Error::Invalid)?;
        let want_in: BTreeMap<String, Vec<usize>> = c.input_shapes(*n).into_iter().collect();
        let got_in: BTreeMap<String, Vec<usize>> = f
            .inputs
            .iter()
            .map(|i| (i.name.clone(), i.ty.shape.clone()))
            .collect();
        if got_in != want_in {
            return Err(BuildError::Verify {
                bucket: bname.clone(),
                what: format!("inputs {got_in:?}, expected {want_in:?}"),
            }
            .into());
        }
        let want_out = c.outputs(*n);
        if f.outputs.len() != want_out.len()
            || f.outputs
                .iter()
                .zip(&want_out)
                .any(|(o, w)| o.name != w.name || o.ty.shape != [1, w.width, 1, w.cols])
        {
            return Err(BuildError::Verify {
                bucket: bname.clone(),
                what: "unexpected outputs".into(),
            }
            .into());
        }
        let function = if plan.per_bucket {
            "main".to_string()
        } else {
            bname.clone()
        };
        let mut spec = json!({
            "name": bname,
            "inputs": f.inputs.iter().map(|i| json!({"name": i.name, "shape": i.ty.shape, "dtype": i.ty.dtype})).collect::<Vec<_>>(),
            "outputs": f.outputs.iter().map(|o| json!({"name": o.name, "shape": o.ty.shape, "dtype": o.ty.dtype})).collect::<Vec<_>>(),
        });
        match c.input() {
            Input::Pixels(px) => {
                spec["patches"] = json!(n);
                spec["pixel_budget"] =
                    json!(*n as u64 * (px.patch_size() * px.patch_size()) as u64);
            }
            Input::Tokens(_) => spec["tokens"] = json!(n),
        }
        if plan.format.mlpackage() {
            spec["package"] = json!(pkg_path.strip_prefix(tmp.path()).unwrap_or(&pkg_path));
            spec["function"] = json!(function);
        }
        if plan.format.aimodel() {
            // One function per bucket, named like the bucket.
            spec["aimodel_function"] = json!(bname);
            aimodel_sources.push((pkg_path.clone(), function, bname.clone()));
        }
        if let Some(note) = c.capacity_note() {
            spec["capacity"] = note.into();
        }
        bucket_specs.push(spec);
    }

    let aimodel_name = format!("{name}.aimodel");
    let coreai = if plan.format.aimodel() {
        progress(Stage::Translate, &format!("({aimodel_name})"));
        let summary =
            bridge::save_aimodel(&env, &aimodel_sources, &tmp.path().join(&aimodel_name))?;
        if !plan.format.mlpackage() {
            std::fs::remove_dir_all(&pkg_dir).map_err(|e| Error::io(&pkg_dir, e))?;
        }
        Some(summary)
    } else {
        None
    };

    // What turns a user's input into a call: the image processor's
    // settings, or the checkpoint's tokenizer, copied into the artifact
    // (and hashed with it) so that the runtime tokenizes as the gates did.
    let preprocessing = match &processor {
        Processor::Image(pre) => json!(pre),
        Processor::Text(tok) => {
            let to = tmp.path().join(TOKENIZER_FILE);
            std::fs::copy(&tok.path, &to).map_err(|e| Error::io(&tok.path, e))?;
            json!({ "tokenizer": TOKENIZER_FILE })
        }
    };
    tensor_file::write(
        &tmp.path().join("host.safetensors"),
        tables
            .iter()
            .map(|(name, shape, v)| (name.clone(), OwnedTensor::f32(shape.clone(), v)))
            .collect(),
        None,
    )?;

    progress(Stage::Hash, "");
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
    // Where the checkpoint is, as an absolute path and relative to the
    // artifact (which survives moving the two together): never the path as
    // typed, which means nothing from another directory.
    let abs_dir = dir.canonicalize().map_err(|e| Error::io(&dir, e))?;
    let abs_out = parent
        .canonicalize()
        .map_err(|e| Error::io(&parent, e))?
        .join(&name);
    let mut source = json!({
        "model": plan.model, "revision": plan.revision, "path": abs_dir,
        "model_type": model_type, "sha256": source_files,
    });
    if let Some(rel) = crate::artifact::relative_path(&abs_out, &abs_dir) {
        source["path_from_artifact"] = json!(rel);
    }
    let mut manifest = json!({
        "artifact_format": ARTIFACT_FORMAT,
        "tool": {"name": "ane-export", "version": env!("CARGO_PKG_VERSION")},
        "source": source,
        "family": tower_family.name(),
        "config": vision,
        "preprocessing": preprocessing,
        "host": host,
        "precision": "fp16",
        "weights": plan.weights.name(),
        "target": plan.target.coremltools_name(),
        "multifunction": !plan.per_bucket,
        "formats": plan.format.shipped(),
        "query_chunk": plan.query_chunk,
        "buckets": bucket_specs,
        "files": files,
        "gates": null,
    });
    if let Some(summary) = coreai {
        manifest["aimodel"] = json!(aimodel_name);
        manifest["coreai"] = summary;
    }
    if let Some(s) = residual_scale {
        manifest["residual_scale"] = json!(s);
    }
    if let Some(c) = &calibration {
        manifest["calibration"] = json!(c);
    }
    if let Some(b) = plan.branch_scale {
        manifest["branch_scale"] = json!(b);
    }
    if !faults.is_empty() {
        manifest["test_faults"] = json!(faults);
    }
    progress(Stage::Write, "");
    // Written last: a directory without it is not an artifact.
    let text = serde_json::to_string_pretty(&manifest)
        .map_err(|e| Error::Invalid(format!("manifest.json: {e}")))?;
    tensor_file::write_atomic(&tmp.path().join("manifest.json"), text.as_bytes())?;

    // Checked again under the lock: something may have been put there
    // while the build ran.
    if super::replaceable(out)? == super::Existing::Artifact && !plan.force {
        return Err(Error::Exists(out.clone()));
    }
    if out.exists() {
        // One atomic swap: `out` is whole at every instant, old or new; the
        // temporary directory then holds the old artifact and is removed.
        if exchange(tmp.path(), out).map_err(|e| Error::io(out, e))? {
            drop(tmp);
        } else {
            let built = tmp.keep();
            let old = parent.join(format!(".{name}.replaced-{}", std::process::id()));
            std::fs::rename(out, &old).map_err(|e| Error::io(out, e))?;
            std::fs::rename(&built, out).map_err(|e| Error::io(out, e))?;
            let _ = std::fs::remove_dir_all(&old);
        }
    } else {
        let built = tmp.keep();
        std::fs::rename(&built, out).map_err(|e| Error::io(out, e))?;
    }
    Ok(Built {
        artifact: out.clone(),
        buckets: bucket_list,
        slot_unit: match vision.input() {
            Input::Pixels(_) => "patches",
            Input::Tokens(_) => "tokens",
        },
        // A package left out is not in the artifact.
        packages: if plan.format.mlpackage() {
            written
        } else {
            vec![]
        },
        aimodel: plan.format.aimodel().then(|| out.join(&aimodel_name)),
        fp16_weight_bytes: weight_bytes,
        emit_s,
        total_s: t0.elapsed().as_secs_f64(),
        residual_scale,
        calibration,
    })
}

/// The model as a package's metadata names it: a repo id as given, else
/// the checkpoint directory's own name (no path of the building machine).
fn source_name(model: &str, dir: &std::path::Path) -> String {
    if std::path::Path::new(model).is_dir() {
        dir.canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().to_string()))
            .unwrap_or_else(|| "checkpoint".into())
    } else {
        model.to_string()
    }
}
