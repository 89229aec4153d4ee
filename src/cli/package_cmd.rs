//! `ane-export inspect` and `ane-export exec`.

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use candle_core::{Device, Tensor};
use serde_json::json;

use super::{ExecArgs, InspectArgs};
use crate::error::Error;
use crate::interp::{Interpreter, Precision};
use crate::mlpackage::Package;
use crate::tensor_file::{self, OwnedTensor};

fn shape_str(s: &[usize]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// How many ops of each type a function has.
fn op_histogram(f: &crate::mlpackage::Function) -> BTreeMap<&str, usize> {
    let mut hist = BTreeMap::new();
    for op in &f.ops {
        *hist.entry(op.kind.as_str()).or_default() += 1;
    }
    hist
}

/// An artifact directory given where a package is expected: say which
/// packages it holds.
fn not_an_artifact_dir(path: &std::path::Path) -> crate::Result<()> {
    if !path.join("manifest.json").is_file() {
        return Ok(());
    }
    let mut pkgs: Vec<String> = std::fs::read_dir(path)
        .map_err(|e| Error::io(path, e))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "mlpackage"))
        .map(|p| p.display().to_string())
        .collect();
    pkgs.sort();
    Err(Error::Invalid(format!(
        "{}: is an artifact directory, not a package: pass its package{} ({})",
        path.display(),
        if pkgs.len() == 1 {
            ""
        } else {
            "s one at a time"
        },
        pkgs.join(", ")
    )))
}

pub(super) fn inspect(a: InspectArgs) -> anyhow::Result<ExitCode> {
    not_an_artifact_dir(&a.package)?;
    let pkg = Package::open(&a.package)?;
    let p = &pkg.program;
    let mut functions = Vec::new();
    for f in p.functions.values() {
        let hist = op_histogram(f);
        functions.push(json!({
            "name": f.name,
            "opset": f.opset,
            "inputs": f.inputs.iter().map(|i| json!({"name": i.name, "dtype": i.ty.dtype, "shape": i.ty.shape})).collect::<Vec<_>>(),
            "outputs": f.outputs.iter().map(|i| json!({"name": i.name, "dtype": i.ty.dtype, "shape": i.ty.shape})).collect::<Vec<_>>(),
            "ops": f.ops.len(),
            "op_histogram": hist,
        }));
    }
    let report = json!({
        "package": a.package,
        "specification_version": p.specification_version,
        "default_function": p.description.default_function,
        "functions": functions,
        "weight_bytes": pkg.weight_bytes(),
        "metadata": p.description,
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} (specification {})",
        a.package.display(),
        p.specification_version
    );
    if !p.description.default_function.is_empty() {
        println!("default function: {}", p.description.default_function);
    }
    for f in p.functions.values() {
        println!("function {} ({}, {} ops)", f.name, f.opset, f.ops.len());
        for i in &f.inputs {
            println!(
                "  input  {:<24} {:?} {}",
                i.name,
                i.ty.dtype,
                shape_str(&i.ty.shape)
            );
        }
        for o in &f.outputs {
            println!(
                "  output {:<24} {:?} {}",
                o.name,
                o.ty.dtype,
                shape_str(&o.ty.shape)
            );
        }
        let h: Vec<String> = op_histogram(f)
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!("  ops: {}", h.join(", "));
    }
    for (d, b) in pkg.weight_bytes() {
        println!("weights {d}: {b} bytes");
    }
    let d = &p.description;
    for (k, v) in [
        ("author", &d.author),
        ("license", &d.license),
        ("version", &d.version),
        ("description", &d.short_description),
    ] {
        if !v.is_empty() {
            println!("{k}: {v}");
        }
    }
    for (k, v) in &d.user_defined {
        println!("metadata {k}: {v}");
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn exec(a: ExecArgs, settings: crate::interp::Settings) -> anyhow::Result<ExitCode> {
    not_an_artifact_dir(&a.package)?;
    if a.executor == crate::exec::ExecutorKind::Coreai {
        return exec_coreai(a);
    }
    let mut pkg = Package::open(&a.package)?;
    // The interpreter's refusal, after the package's path.
    let bad = |e: crate::interp::InterpError| Error::Checkpoint {
        path: a.package.clone(),
        msg: e.to_string(),
    };
    // Only the function that runs stays parsed: a bucket's ops are about a
    // third of a two-bucket package's parsed program.
    let name = pkg
        .program
        .select(a.function.as_deref())
        .map_err(|e| Error::package(&a.package, e))?
        .name
        .clone();
    pkg.program.functions.retain(|n, _| *n == name);
    let interp = Interpreter::with_settings(&pkg, Some(&name), settings).map_err(bad)?;
    // The file's bytes are dropped once its tensors are read (a b4096
    // bucket's inputs are about 100 MB).
    let bytes = std::fs::read(&a.inputs).map_err(|e| Error::io(&a.inputs, e))?;
    let mut inputs = HashMap::new();
    for i in &interp.function().inputs {
        let t = tensor_file::read_tensor(&bytes, &a.inputs, &i.name)?;
        let t = match (t.f32, t.i64) {
            (Some(v), _) => Tensor::from_vec(v, t.shape, &Device::Cpu)?,
            (None, Some(v)) => Tensor::from_vec(
                v.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                t.shape,
                &Device::Cpu,
            )?,
            _ => return Err(Error::tensor(&a.inputs, &i.name, "unreadable").into()),
        };
        inputs.insert(i.name.clone(), t);
    }
    drop(bytes);
    let mut times = Vec::new();
    let mut out = None;
    // What every run computed, for the shares below.
    let mut work = crate::interp::Work::default();
    for _ in 0..a.runs {
        let t0 = Instant::now();
        let o = interp.run(&inputs, a.precision).map_err(bad)?;
        if let Some(p) = &o.profile {
            super::print_profile(p);
        }
        work += o.work;
        out = Some(o);
        times.push(t0.elapsed().as_secs_f64());
    }
    let (Some(out), Some(&secs)) = (out, times.last()) else {
        unreachable!("clap keeps --runs at 1 or more")
    };
    let mut tensors = Vec::new();
    for (name, t) in &out.outputs {
        let t = t.to_dtype(candle_core::DType::F32)?;
        let v = t.flatten_all()?.to_vec1::<f32>()?;
        tensors.push((name.clone(), OwnedTensor::f32(t.dims().to_vec(), &v)));
    }
    tensor_file::write(&a.out, tensors, None)
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "exec: function {} ({} ops) in {:.3} s, precision {:?}; matrix products: {}, kernels {}; 1x1 convolutions: {}; attention chains: {}",
        interp.function().name,
        interp.function().ops.len(),
        secs,
        a.precision,
        crate::blas::backend(),
        crate::blas::kernel(),
        crate::blas::conv_backend(),
        crate::interp::attention_path()
    );
    if times.len() > 1 {
        let t: Vec<String> = times.iter().map(|t| format!("{t:.3}")).collect();
        eprintln!("exec: seconds per run: {}", t.join(", "));
    }
    let ((cols, all_cols), (scores, all_scores), (other, all_other)) =
        (work.conv_columns, work.scores, work.columns);
    let share = |a: u64, b: u64| 100.0 * a as f64 / b.max(1) as f64;
    eprintln!(
        "exec: computed {:.1}% of the 1x1 convolutions' columns, {:.1}% of the attention scores \
         and {:.1}% of the other ops' columns{}",
        share(cols, all_cols),
        share(scores, all_scores),
        share(other, all_other),
        if settings.shortcuts {
            " (the rest repeat them or are exactly 0)"
        } else {
            " (ANE_EXPORT_SHORTCUTS=0)"
        }
    );
    if a.precision == Precision::Fp16 {
        match &out.first_overflow {
            Some(o) => eprintln!(
                "fp16: first overflow at op `{}` ({}): {} non-finite, {} beyond fp16 range",
                o.op, o.kind, o.nonfinite, o.saturated
            ),
            None => eprintln!("fp16: no op produced inf, NaN or values beyond fp16 range"),
        }
    }
    if a.precision == Precision::Ane {
        match &out.first_overflow {
            Some(o) => eprintln!(
                "ane: first overflow at op `{}` ({}): {} inf, {} of them past the ANE's ceilings",
                o.op, o.kind, o.nonfinite, o.saturated
            ),
            None => eprintln!("ane: no op produced inf"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `exec --executor coreai`: a function of a `.aimodel` run by the Core AI
/// runtime in its child, which reads the inputs file and writes every
/// output as f32 to `--out` (the same exchange as the executors').
fn exec_coreai(a: ExecArgs) -> anyhow::Result<ExitCode> {
    use crate::exec::serve::{Module, Served};
    let model = &a.package;
    if !model.join("main.mlirb").is_file() {
        return Err(Error::checkpoint(
            model,
            "not a Core AI program (expected a .aimodel directory with main.mlirb)",
        )
        .into());
    }
    let Some(function) = a.function.as_deref() else {
        return Err(Error::checkpoint(
            model,
            "--executor coreai: name the function with --function (an artifact's \
             .aimodel has one per bucket, named like it, e.g. b1024)",
        )
        .into());
    };
    if !a.inputs.is_file() {
        return Err(Error::io(
            &a.inputs,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such inputs file"),
        )
        .into());
    }
    let served = Served::new(crate::home::find_env()?, Module::Coreai);
    // The output is written beside --out and renamed: nothing half-written.
    let parent = match a.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let staged = tempfile::Builder::new()
        .prefix(".exec-")
        .suffix(".safetensors")
        .tempfile_in(&parent)
        .map_err(|e| Error::io(&a.out, e))?
        .into_temp_path();
    let mut times = Vec::new();
    for _ in 0..a.runs {
        let t0 = Instant::now();
        let r = served
            .predict_files(model, function, &a.inputs, &staged)
            .map_err(|e| Error::checkpoint(model, e.to_string()))?;
        times.push((t0.elapsed().as_secs_f64(), r));
    }
    staged
        .persist(&a.out)
        .map_err(|e| Error::io(&a.out, e.error))?;
    let Some((secs, r)) = times.last() else {
        unreachable!("clap keeps --runs at 1 or more")
    };
    eprintln!(
        "exec: function {function} on {} in {secs:.3} s (load {:.3} s, predict {} s)",
        crate::exec::coreai::describe_runtime(),
        r.load_s,
        r.predict_s.map_or("?".into(), |p| format!("{p:.3}"))
    );
    if times.len() > 1 {
        let t: Vec<String> = times.iter().map(|(t, _)| format!("{t:.3}")).collect();
        eprintln!("exec: seconds per run: {}", t.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}
