//! The cosine gate: the fp32 reference tower against the artifact as
//! executed, per bucket and per golden case, over real tokens only.
//!
//! Both sides start from the image file. The reference preprocesses with the
//! source checkpoint's `preprocessor_config.json` and runs the Hugging Face
//! layout in fp32; the artifact side preprocesses with the preprocessing
//! recorded in `manifest.json`, builds the host inputs (its own position and
//! rotary code) and runs the package through an [`Executor`]. A difference in
//! preprocessing, host inputs, layout or numerics therefore shows up here.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use candle_core::{Device, Tensor};

use crate::artifact::{Artifact, BucketEntry};
use crate::error::{Error, Result};
use crate::family::Oracle;
use crate::mlpackage::Package;
use crate::preprocess::{DecodeLimits, ImageProcessorConfig, PixelBatch, preprocess_file};
use crate::tensor_file::f32_values as to_vec;

mod cases;
pub mod headroom;
mod inspect;
mod metrics;
mod spill;

pub use cases::{
    Case, GOLDEN_IMAGES, GOLDEN_TEXTS, STRESS_IMAGES, cases, default_cases, text_cases,
};
pub use inspect::{block_taps, constant_mismatches};
use metrics::*;
pub use metrics::{BlockStats, CaseResult, OutputStats};
use spill::{Spill, Spilled};

use super::Status;
use super::jobs::run_jobs;
use crate::exec::Executor;
use crate::runtime::{Call, ExecError, run_bucket};

/// One reference run, spilled: outputs in the order of
/// [`crate::family::Tower::output_names`], then every block's output.
struct RefRun {
    grid: Vec<[usize; 3]>,
    outputs: Vec<Spilled>,
    blocks: Vec<Spilled>,
    seconds: f64,
}

/// Why a case has no numbers: (status, message, real patches).
type NoNumbers = (Status, String, usize);

/// What the reference side left for the artifact side: per case and
/// bucket, the reference run to compare with (an index into `runs`) or
/// why the case has no numbers (a skipped case, different grids).
pub struct References {
    /// Locked by the runs that write and read it, which may go side by side.
    spill: std::sync::Mutex<Spill>,
    runs: Vec<RefRun>,
    /// `[case][bucket]`, in the order `run` is given them.
    planned: Vec<Vec<std::result::Result<usize, NoNumbers>>>,
}

/// Everything the cosine gate needs.
pub struct CosineRun<'a> {
    pub artifact: &'a Artifact,
    /// The source checkpoint's preprocessing (the reference side).
    pub reference_pre: &'a crate::family::Processor,
    pub executor: &'a dyn Executor,
    /// Hold each op to the Neural Engine's limits (the interpreter's ane
    /// mode), else to fp16's range ([`headroom`]).
    pub ane_limits: bool,
}

/// The case's images preprocessed with `pre`, resized to fit `slots` (see
/// [`crate::family::VisionConfig::fitting`]).
pub(crate) fn fit(
    cfg: &crate::family::VisionConfig,
    images: &[PathBuf],
    pre: &ImageProcessorConfig,
    slots: usize,
) -> Result<PixelBatch> {
    cfg.fitting(pre, slots, |pre| {
        let b = preprocess(images, pre)?;
        let grid = b.grid_thw.clone();
        Ok((b, grid))
    })
}

fn preprocess(images: &[PathBuf], pre: &ImageProcessorConfig) -> Result<PixelBatch> {
    let parts = images
        .iter()
        .map(|i| preprocess_file(i, pre, DecodeLimits::default()).map(|p| p.batch))
        .collect::<Result<Vec<_>>>()?;
    PixelBatch::concat(parts)
}

impl CosineRun<'_> {
    /// The slots a reference run's grid takes: a text's tokens (its grid
    /// is `[1, 1, tokens]`), else the family's slots of its images.
    fn slots(&self, grid: &[[usize; 3]]) -> usize {
        match self.artifact.cfg.input().pixels() {
            Some(px) => px.slots(grid),
            None => grid.iter().map(|g| g[2]).sum(),
        }
    }

    /// The checkpoint's tokenizer (the reference side's).
    fn reference_tokens(&self) -> Result<&crate::preprocess::TextProcessor> {
        match self.reference_pre {
            crate::family::Processor::Text(p) => Ok(p),
            crate::family::Processor::Image(_) => Err(Error::Invalid(
                "the cosine gate's text cases need a tokenizer".into(),
            )),
        }
    }

    /// The grid (`[1, 1, tokens]`) of a text case in bucket `b`: the text
    /// truncated to the bucket by the checkpoint's tokenizer, which the
    /// artifact's tokenizer (the one it ships) must agree with, id for id
    /// (`fail` otherwise: a wrong tokenizer cannot agree with itself).
    fn text_grid(
        &self,
        b: &BucketEntry,
        text: &str,
    ) -> std::result::Result<Vec<[usize; 3]>, CaseError> {
        let art = self.artifact.text_processor()?.encode(text, b.patches)?;
        let reference = self.reference_tokens()?.encode(text, b.patches)?;
        if art.ids != reference.ids || art.type_ids != reference.type_ids {
            return Err(CaseError::Case(
                Status::Fail,
                format!(
                    "the artifact's tokenizer gives {} tokens {:?}, the checkpoint's {} tokens {:?}",
                    art.len(),
                    &art.ids[..art.len().min(12)],
                    reference.len(),
                    &reference.ids[..reference.len().min(12)]
                ),
                art.len(),
            ));
        }
        Ok(vec![[1, 1, art.len()]])
    }

    /// The checkpoint's image processor (the reference side's).
    fn reference_image_pre(&self) -> Result<&ImageProcessorConfig> {
        match self.reference_pre {
            crate::family::Processor::Image(p) => Ok(p),
            crate::family::Processor::Text(_) => Err(Error::Invalid(
                "the cosine gate's image cases need an image processor".into(),
            )),
        }
    }

    /// The reference side, first and alone: every case in every bucket
    /// preprocessed with the checkpoint's own preprocessing and run through
    /// `tower` (once per case unless a bucket scales its images down; a call
    /// of several images whose images each run alone at the same grids is
    /// joined from those runs, [`CosineRun::joined`]), the outputs spilled
    /// to a temporary file. The caller can then drop the
    /// tower before [`CosineRun::run`] executes the artifact. Errors (an
    /// image that cannot be read) stop the gate; a case that does not fit a
    /// bucket, or whose two preprocessings disagree, is recorded as such.
    /// The distinct runs go as the artifact side's cases do ([`run_jobs`]).
    pub fn references(
        &self,
        tower: &Oracle,
        buckets: &[(&BucketEntry, f64)],
        cases: &[Case],
        progress: &dyn Fn(&str),
    ) -> Result<References> {
        // Which distinct runs the cases need: a case's run serves its next
        // bucket too when the grids agree.
        let mut wanted: Vec<Wanted> = Vec::new();
        let mut planned = Vec::new();
        for case in cases {
            let first = wanted.len();
            let mut row = Vec::new();
            for &(b, _) in buckets {
                row.push(match self.reference_grid(b, case) {
                    Ok(grid) => {
                        if wanted.len() == first || wanted.last().map(|w| &w.grid) != Some(&grid) {
                            wanted.push(Wanted {
                                case,
                                bucket: b,
                                grid,
                            });
                        }
                        Ok(wanted.len() - 1)
                    }
                    Err(CaseError::Fatal(e)) => return Err(e),
                    Err(CaseError::Case(status, msg, real)) => Err((status, msg, real)),
                });
            }
            planned.push(row);
        }
        // A call of several images, each of which has a run of its own at
        // the same grid, runs no more: its outputs are those runs' one after
        // another ([`CosineRun::joined`]).
        let parts: Vec<Option<Vec<usize>>> = wanted
            .iter()
            .map(|w| {
                if w.case.images.len() < 2 || w.grid.len() != w.case.images.len() {
                    return None;
                }
                w.case
                    .images
                    .iter()
                    .zip(&w.grid)
                    .map(|(image, grid)| {
                        wanted.iter().position(|s| {
                            s.case.images.as_slice() == std::slice::from_ref(image)
                                && s.grid.as_slice() == std::slice::from_ref(grid)
                        })
                    })
                    .collect()
            })
            .collect();
        let spill = std::sync::Mutex::new(Spill::new()?);
        let mut order: Vec<usize> = (0..wanted.len()).filter(|&i| parts[i].is_none()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.slots(&wanted[i].grid)));
        let run = |&i: &usize| self.reference_run(tower, &wanted[i], &spill);
        let label = |&i: &usize| {
            let w = &wanted[i];
            format!("reference: {} in {}", w.case.name, w.bucket.name)
        };
        let (done, _) = run_jobs(&order, true, &run, &label, progress)?;
        let mut runs: Vec<Option<RefRun>> = (0..wanted.len()).map(|_| None).collect();
        for (i, r) in order.into_iter().zip(done) {
            runs[i] = Some(r);
        }
        for (i, parts) in parts.iter().enumerate() {
            if let Some(parts) = parts {
                let w = &wanted[i];
                progress(&format!(
                    "reference: {} in {}: its images' runs, one after another",
                    w.case.name, w.bucket.name
                ));
                let pieces = parts
                    .iter()
                    .map(|&j| runs[j].as_ref())
                    .collect::<Option<Vec<&RefRun>>>()
                    .ok_or_else(|| {
                        Error::Invalid(format!("{}: a part did not run", w.case.name))
                    })?;
                runs[i] = Some(Self::joined(&pieces, w.grid.clone(), &spill)?);
            }
        }
        Ok(References {
            spill,
            runs: runs.into_iter().flatten().collect(),
            planned,
        })
    }

    /// The reference run of a call of several images made of each image's
    /// own run (`pieces`, in the call's order): every output and every
    /// block's output is theirs one after another. The reference's images
    /// attend within themselves alone, each with its own positions, so a
    /// call of several gives each image's rows as a call of it alone does,
    /// to fp32 rounding (BLAS may sum in another order over more rows:
    /// `the_reference_runs_images_of_one_call_as_each_alone` in
    /// tests/it/families.rs, `encoder_references_run_many_images_as_each_alone`
    /// in tests/it/encoders.rs). Its `seconds` are the joining's.
    fn joined(
        pieces: &[&RefRun],
        grid: Vec<[usize; 3]>,
        spill: &std::sync::Mutex<Spill>,
    ) -> Result<RefRun> {
        let t = Instant::now();
        let join = |of: &dyn Fn(&RefRun) -> &[Spilled]| -> Result<Vec<Spilled>> {
            let n = of(pieces[0]).len();
            if pieces.iter().any(|p| of(p).len() != n) {
                return Err(Error::Invalid(
                    "the images of one call gave different numbers of reference outputs".into(),
                ));
            }
            (0..n)
                .map(|k| {
                    let mut v = Vec::new();
                    for p in pieces {
                        v.extend(Spill::read(spill, of(p)[k])?);
                    }
                    spill.lock().map_err(|_| Spill::poisoned())?.put_values(&v)
                })
                .collect()
        };
        Ok(RefRun {
            outputs: join(&|r| &r.outputs)?,
            blocks: join(&|r| &r.blocks)?,
            grid,
            seconds: t.elapsed().as_secs_f64(),
        })
    }

    /// The grid of the reference run case `case` in bucket `b` compares
    /// with, or why it has none: it does not fit the bucket (`skipped`), or
    /// the artifact's preprocessing and the checkpoint's disagree (`fail`).
    fn reference_grid(
        &self,
        b: &BucketEntry,
        case: &Case,
    ) -> std::result::Result<Vec<[usize; 3]>, CaseError> {
        if let Some(text) = &case.text {
            return self.text_grid(b, text);
        }
        let cfg = &self.artifact.cfg;
        let px = cfg.pixels()?;
        if let Some(max) = px.images_per_call()
            && case.images.len() > max
        {
            return Err(CaseError::Case(
                Status::Skipped,
                format!(
                    "a {} call takes {}, the case has {}",
                    self.artifact.family.name(),
                    if max == 1 {
                        "one image".to_string()
                    } else {
                        format!("{max} images")
                    },
                    case.images.len()
                ),
                0,
            ));
        }
        let art_batch = fit(
            cfg,
            &case.images,
            self.artifact.image_processor()?,
            b.patches,
        )?;
        let n = art_batch.rows();
        let slots = px.slots(&art_batch.grid_thw);
        if slots > b.patches {
            return Err(CaseError::Case(
                Status::Skipped,
                format!(
                    "{n} patches take {slots} slots and do not fit the bucket's {}",
                    b.patches
                ),
                n,
            ));
        }
        // Reference side: always its own preprocessing, from the checkpoint's
        // preprocessor_config.json (the artifact side's comes from the
        // manifest), so that a manifest recording the wrong preprocessing
        // cannot agree with itself. The code is shared (see ARCHITECTURE.md,
        // "What the two sides of the cosine gate share"); the configuration is not.
        let ref_batch = fit(cfg, &case.images, self.reference_image_pre()?, b.patches)?;
        if ref_batch.grid_thw != art_batch.grid_thw {
            return Err(CaseError::Case(
                Status::Fail,
                format!(
                    "the artifact's preprocessing gives grids {:?}, the checkpoint's {:?}",
                    art_batch.grid_thw, ref_batch.grid_thw
                ),
                n,
            ));
        }
        Ok(ref_batch.grid_thw)
    }

    /// Run `w` through the reference tower (preprocessed again: it is
    /// deterministic) and spill its outputs.
    fn reference_run(
        &self,
        tower: &Oracle,
        w: &Wanted,
        spill: &std::sync::Mutex<Spill>,
    ) -> Result<RefRun> {
        let tower = match (tower, &w.case.text) {
            (Oracle::Vision(t), None) => t.as_ref(),
            (Oracle::Text(enc), Some(text)) => {
                let tokens = self.reference_tokens()?.encode(text, w.bucket.patches)?;
                let t = Instant::now();
                let out = enc.forward(std::slice::from_ref(&tokens), true)?;
                return self.spilled(out, vec![[1, 1, tokens.len()]], t, spill);
            }
            _ => {
                return Err(Error::Invalid(format!(
                    "{}: the case's modality is not the tower's",
                    w.case.name
                )));
            }
        };
        let ref_batch = fit(
            &self.artifact.cfg,
            &w.case.images,
            self.reference_image_pre()?,
            w.bucket.patches,
        )?;
        if ref_batch.grid_thw != w.grid {
            return Err(Error::Invalid(format!(
                "{}: preprocessed twice, the reference's grids differ ({:?}, then {:?})",
                w.case.name, w.grid, ref_batch.grid_thw
            )));
        }
        let t = Instant::now();
        let pv = Tensor::from_slice(
            &ref_batch.pixel_values,
            (ref_batch.rows(), ref_batch.row_len),
            &Device::Cpu,
        )
        .map_err(Error::from)?;
        let out = tower.forward(&pv, &ref_batch.grid_thw, true)?;
        self.spilled(out, ref_batch.grid_thw, t, spill)
    }

    /// A reference run's outputs and block outputs spilled, timed from `t`.
    fn spilled(
        &self,
        out: crate::reference::TowerOutput,
        grid: Vec<[usize; 3]>,
        t: Instant,
        spill: &std::sync::Mutex<Spill>,
    ) -> Result<RefRun> {
        let seconds = t.elapsed().as_secs_f64();
        let mut spill = spill.lock().map_err(|_| Spill::poisoned())?;
        let outputs = out
            .outputs
            .iter()
            .map(|t| spill.put(t))
            .collect::<Result<_>>()?;
        let blocks = out
            .block_outputs
            .iter()
            .map(|t| spill.put(t))
            .collect::<Result<_>>()?;
        Ok(RefRun {
            grid,
            outputs,
            blocks,
            seconds,
        })
    }

    /// The artifact side: every case in every bucket executed and compared
    /// with the reference outputs of [`CosineRun::references`] (given the
    /// same buckets and cases), from the packages in `pkgs` (by their
    /// file name in the artifact). `thresholds[i]` is the cosine threshold
    /// of `buckets[i]`. A bucket whose package cannot run gives `error`
    /// cases. Returns the results, in the order of cases then buckets, and
    /// the most cases that ran at once.
    ///
    /// Cases run largest first (by the slots their images take, then bucket size). The
    /// first runs alone on every thread: it decodes the package's
    /// constants, which the others share. With an executor whose runs may
    /// execute at once ([`Executor::concurrent_runs`]), the rest then run
    /// side by side, one per thread, each on a thread of its own: a case of
    /// a few hundred patches splits its products too finely over several
    /// threads, and its many small ops run one after another, so running
    /// cases side by side keeps every thread busy (measured on the
    /// 2B-shaped Qwen3-VL tower: BENCHMARKS.md, "The gate's cases side by
    /// side"). Each case's `seconds` is then its own wall time on its
    /// thread, while other cases ran on the other threads.
    pub fn run(
        &self,
        refs: &References,
        pkgs: &HashMap<String, Package>,
        buckets: &[(&BucketEntry, f64)],
        cases: &[Case],
        progress: &dyn Fn(&str),
    ) -> Result<(Vec<CaseResult>, usize)> {
        let tables = self.artifact.host_tables()?;
        // Every (case, bucket) in order: its result when it has no numbers,
        // else a job that makes them.
        let mut results: Vec<Option<CaseResult>> = Vec::new();
        let mut jobs: Vec<Job> = Vec::new();
        for (ci, case) in cases.iter().enumerate() {
            for (bi, &(b, threshold)) in buckets.iter().enumerate() {
                let planned = refs
                    .planned
                    .get(ci)
                    .and_then(|row| row.get(bi))
                    .cloned()
                    .ok_or_else(|| {
                        Error::Invalid(format!(
                            "no reference run for case {} in {}",
                            case.name, b.name
                        ))
                    })?;
                // No package: an artifact that ships the .aimodel alone.
                let pkg = match &b.package {
                    Some(p) => Some(pkgs.get(p).ok_or_else(|| {
                        Error::Invalid(format!("package {p} of {} is not open", b.name))
                    })?),
                    None => None,
                };
                match planned {
                    Ok(k) => jobs.push(Job {
                        slot: results.len(),
                        case,
                        bucket: b,
                        threshold,
                        pkg,
                        k,
                    }),
                    Err((status, msg, real)) => {
                        results.push(Some(no_numbers(case, b, threshold, status, msg, real)));
                        continue;
                    }
                }
                results.push(None);
            }
        }
        jobs.sort_by_key(|j| {
            std::cmp::Reverse((self.slots(&refs.runs[j.k].grid), j.bucket.patches))
        });
        let run_job = |j: &Job| -> Result<CaseResult> {
            match self.one(j.pkg, j.bucket, j.threshold, j.case, &tables, refs, j.k) {
                Ok(r) => Ok(r),
                Err(CaseError::Fatal(e)) => Err(e),
                Err(CaseError::Case(status, msg, real)) => {
                    Ok(no_numbers(j.case, j.bucket, j.threshold, status, msg, real))
                }
            }
        };
        let label = |j: &Job| format!("{} in {}", j.case.name, j.bucket.name);
        let (done, at_once) = run_jobs(
            &jobs,
            self.executor.concurrent_runs(),
            &run_job,
            &label,
            progress,
        )?;
        for (j, r) in jobs.iter().zip(done) {
            results[j.slot] = Some(r);
        }
        Ok((results.into_iter().flatten().collect(), at_once))
    }

    /// An execution failure as the case's `error`, in the gate's words.
    fn case_error(&self, e: ExecError, real: usize) -> CaseError {
        let msg = match e {
            ExecError::Executor(m) => format!("{}: {m}", self.executor.describe()),
            ExecError::MissingOutput(name) => format!("the artifact has no output `{name}`"),
            e => e.to_string(),
        };
        CaseError::Case(Status::Error, msg, real)
    }

    /// Case `case` in bucket `b` against reference run `k` of `refs`.
    #[allow(clippy::too_many_arguments)]
    fn one(
        &self,
        pkg: Option<&Package>,
        b: &BucketEntry,
        threshold: f64,
        case: &Case,
        tables: &crate::host::HostTables,
        refs: &References,
        k: usize,
    ) -> std::result::Result<CaseResult, CaseError> {
        let cfg = &self.artifact.cfg;
        // The same preprocessing (or tokenization) as the reference side
        // checked (it is deterministic).
        let (art_batch, art_tokens);
        let (call, n, grid_thw) = match &case.text {
            Some(text) => {
                art_tokens = self.artifact.text_processor()?.encode(text, b.patches)?;
                let n = art_tokens.len();
                (Call::Tokens(&art_tokens), n, vec![[1, 1, n]])
            }
            None => {
                art_batch = fit(
                    cfg,
                    &case.images,
                    self.artifact.image_processor()?,
                    b.patches,
                )?;
                let grid = art_batch.grid_thw.clone();
                (Call::Pixels(&art_batch), art_batch.rows(), grid)
            }
        };
        // The blocks' outputs, read from the package's program (only the
        // interpreter captures them).
        let taps = match (pkg, &b.function) {
            (Some(pkg), Some(f)) => {
                let func = pkg
                    .program
                    .function(Some(f))
                    .map_err(|m| CaseError::Case(Status::Error, m, n))?;
                block_taps(func, cfg.depth())
            }
            _ => vec![],
        };
        let capture: Vec<String> = taps.iter().flatten().cloned().collect();
        let t = Instant::now();
        // The runtime's own execution: host inputs, the function, and the
        // rows a caller of `Runtime` gets.
        let exec = run_bucket(
            cfg,
            &self.artifact.host,
            tables,
            pkg,
            self.executor,
            call,
            b,
            &capture,
        )
        .map_err(|e| self.case_error(e, n))?;
        let art_s = t.elapsed().as_secs_f64();
        let run = &exec.output;

        // The real rows of the sequence (the patches, and the class token
        // of an encoder that has one) and their columns.
        let row_cols: Vec<usize> = (0..exec.host.real).map(|r| exec.host.slot(r)).collect();
        let mut outputs = Vec::new();
        let reference = &refs.runs[k];
        let (ref_outputs, ref_blocks, ref_seconds) = (
            reference.outputs.clone(),
            reference.blocks.clone(),
            reference.seconds,
        );
        // A text encoder's sentence embedding, pooled on both sides from
        // the real tokens' `last_hidden_state` as the checkpoint's
        // sentence-transformers configuration asks (compared after the
        // outputs, from the rows read for them).
        let pooling = cfg.input().tokens().and_then(|t| t.sentence_pooling());
        let mut sentence = None;
        for (name, spilled) in cfg.output_names().into_iter().zip(ref_outputs) {
            let r = Spill::read(&refs.spill, spilled)?;
            let r = r.as_slice();
            let spec = exec.spec(&name).map_err(|e| self.case_error(e, n))?;
            let a = exec.raw(&name).map_err(|e| self.case_error(e, n))?;
            // Non-finite values anywhere in the output, pad columns included;
            // the cosines over the rows the runtime returns.
            let nonfinite = a.iter().filter(|v| !v.is_finite()).count();
            let rows = exec.rows_of(spec, &a);
            let (token_cos, max_abs_err) = compare_rows(r, spec.width, &rows);
            if let Some(pool) = pooling.filter(|_| name == "last_hidden_state") {
                sentence = Some(compare_rows(
                    &pool.pool(r, spec.width),
                    spec.width,
                    &pool.pool(&rows, spec.width),
                ));
            }
            outputs.push(output_stats(name, &token_cos, max_abs_err, nonfinite));
        }
        if let Some((cos, max_abs_err)) = sentence {
            outputs.push(output_stats(
                "sentence_embedding".into(),
                &cos,
                max_abs_err,
                0,
            ));
        }
        let d = cfg.hidden_size();
        let mut blocks = Vec::new();
        for (i, tap) in taps.iter().enumerate() {
            let (Some(tap), Some(&spilled)) = (tap, ref_blocks.get(i)) else {
                continue;
            };
            let Some(a) = run.captured.get(tap) else {
                continue;
            };
            // The real rows' columns alone, in their order (`run_bucket`).
            let a = to_vec(a)?;
            if a.len() != d * row_cols.len() {
                return Err(CaseError::Case(
                    Status::Error,
                    format!(
                        "block tap `{tap}` holds {} values, not {d} channels x {} rows",
                        a.len(),
                        row_cols.len()
                    ),
                    n,
                ));
            }
            let r = Spill::read(&refs.spill, spilled)?;
            let real: Vec<usize> = (0..row_cols.len()).collect();
            let (cos, _, _) = compare(&r, d, &a, row_cols.len(), &real);
            let (min_cos, mean_cos) = min_mean(&cos);
            blocks.push(BlockStats {
                block: i.to_string(),
                min_cos,
                mean_cos,
            });
        }
        let worst = outputs
            .iter()
            .min_by(|a, b| a.min_cos.total_cmp(&b.min_cos))
            .expect("at least the merged output");
        let nonfinite: usize = outputs.iter().map(|o| o.nonfinite).sum();
        // An op past the limit its output has where it runs fails the case
        // whatever the cosines say: on the Neural Engine it is infinite, and
        // what follows may only hide it (a value carried to a later block
        // and removed there).
        let over = headroom::over_limit(&run.peaks, self.ane_limits);
        let pass =
            outputs.iter().all(|o| o.min_cos >= threshold) && nonfinite == 0 && over.is_empty();
        let drift_enters = (!pass).then(|| {
            blocks
                .iter()
                .find(|s| s.min_cos < threshold)
                .map(|s| format!("block {}", s.block))
                .unwrap_or_else(|| "the mergers (every block agrees)".into())
        });
        let mut message = format!(
            "min cosine {:.6} ({}), threshold {threshold}",
            worst.min_cos, worst.name
        );
        if let Some(d) = &drift_enters {
            message.push_str(&format!("; drift enters at {d}"));
        }
        if nonfinite > 0 {
            message.push_str(&format!("; {nonfinite} non-finite output values"));
        }
        if let Some(first) = over.first() {
            message.push_str(&format!(
                "; {} on {}{}",
                headroom::describe(first, self.ane_limits),
                case.name,
                if over.len() > 1 {
                    format!(" ({} ops past their limits)", over.len())
                } else {
                    String::new()
                }
            ));
        }
        if let Some(o) = &run.first_overflow {
            message.push_str(&format!(
                "; first overflow at op `{}` ({}): {} non-finite, {} saturated",
                o.op, o.kind, o.nonfinite, o.saturated
            ));
        }
        if !pass && (run.first_overflow.is_some() || !over.is_empty()) {
            let op = over
                .first()
                .map(|p| p.op.as_str())
                .or(run.first_overflow.as_ref().map(|o| o.op.as_str()))
                .unwrap_or_default();
            message.push_str(&overflow_remedy(self.artifact, op));
        }
        let mut seconds = HashMap::new();
        seconds.insert("reference".to_string(), ref_seconds);
        seconds.insert("artifact".to_string(), art_s);
        let status = if pass { Status::Pass } else { Status::Fail };
        Ok(CaseResult {
            grid_thw,
            outputs,
            blocks,
            first_overflow: run.first_overflow.clone(),
            drift_enters,
            seconds,
            peaks: run.peaks.clone(),
            ..no_numbers(case, b, threshold, status, message, n)
        })
    }
}

/// One output's statistics from its rows' cosines (rounded to 1e-6 in the
/// report), its largest absolute error and its non-finite values.
fn output_stats(name: String, cos: &[f64], max_abs_err: f64, nonfinite: usize) -> OutputStats {
    let (min_cos, mean_cos) = min_mean(cos);
    OutputStats {
        name,
        min_cos,
        mean_cos,
        max_abs_err,
        nonfinite,
        token_cos: cos.iter().map(|c| (c * 1e6).round() / 1e6).collect(),
    }
}

/// One case in one bucket for the artifact side: `k` indexes the
/// reference run it compares with, `slot` its place among the results.
struct Job<'a> {
    slot: usize,
    case: &'a Case,
    bucket: &'a BucketEntry,
    threshold: f64,
    pkg: Option<&'a Package>,
    k: usize,
}

/// The result of a case without numbers (skipped, failed before running,
/// or an error: status, message, real patches), and the fields a case with
/// numbers shares with it.
fn no_numbers(
    case: &Case,
    b: &BucketEntry,
    threshold: f64,
    status: Status,
    message: String,
    real: usize,
) -> CaseResult {
    CaseResult {
        bucket: b.name.clone(),
        case: case.name.clone(),
        images: case
            .images
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        grid_thw: vec![],
        real_patches: real,
        bucket_patches: b.patches,
        status,
        threshold,
        outputs: vec![],
        blocks: vec![],
        first_overflow: None,
        drift_enters: None,
        message,
        seconds: HashMap::new(),
        peaks: Vec::new(),
    }
}

/// A distinct reference run: the first case and bucket that need it, and
/// its grids.
struct Wanted<'a> {
    case: &'a Case,
    bucket: &'a BucketEntry,
    grid: Vec<[usize; 3]>,
}

/// Why a case did not produce numbers.
enum CaseError {
    /// Stops the gate (an input that cannot be read).
    Fatal(Error),
    /// Recorded in the case: (status, message, real patches).
    Case(Status, String, usize),
}

impl From<Error> for CaseError {
    fn from(e: Error) -> Self {
        CaseError::Fatal(e)
    }
}

/// What to do about an fp16 overflow at `op` that failed a case: rebuild
/// with the residual stream scaled down (`--residual-scale`, a larger one
/// than the artifact's own), where the family's builder can; with the
/// SwiGLU product scaled down (`--branch-scale`) when `op` is that product
/// or its `up` projection (`b<i>_glu`, `b<i>_up`), which the residual
/// scale does not reach; else say it has no remedy yet.
fn overflow_remedy(art: &Artifact, op: &str) -> String {
    let family = art.family;
    let hidden = ["_glu", "_up", "_fc1", "_gelu", "_act"];
    let in_mlp = op.starts_with('b')
        && hidden
            .iter()
            .any(|h| op.ends_with(h) || op.contains(&format!("{h}_")));
    if family.branch_scale() && in_mlp {
        return match art.manifest["branch_scale"].as_u64() {
            Some(b) if b >= 4096 => "; --branch-scale is already at its largest (4096)".into(),
            b => format!(
                "; remedy: build again with --branch-scale B (a power of two, e.g. {}) to carry \
                 the MLP's hidden layer divided by B within the Neural Engine's limits",
                b.map_or(8, |b| (b * 4).min(4096))
            ),
        };
    }
    if !family.residual_scale() {
        return format!(
            "; the {} builder has no fp16 remedy yet (--residual-scale is for {})",
            family.name(),
            crate::family::Family::residual_scale_families().join(", ")
        );
    }
    let calibrated = art.manifest.get("calibration").is_some();
    match art.manifest["residual_scale"].as_u64() {
        Some(4096) => "; --residual-scale is already at its largest (4096)".into(),
        Some(s) if calibrated => format!(
            "; remedy: build again with --calibration-images DIR holding images like this one \
             (the build chose --residual-scale {s} on its calibration images), or with a larger \
             --residual-scale (e.g. {})",
            (s * 4).min(4096)
        ),
        Some(s) if s > 1 => format!(
            "; remedy: build again with a larger --residual-scale than this artifact's {s} (e.g. {})",
            (s * 4).min(4096)
        ),
        Some(_) => "; remedy: build again without --residual-scale 1 (the build then chooses the \
                     scale) or with --residual-scale S (a power of two, e.g. 8 or 64) to carry the \
                     residual stream divided by S within fp16"
            .into(),
        None => "; remedy: build again with --residual-scale S (a power of two, e.g. 8 or 64) to \
                 carry the residual stream divided by S within fp16"
            .into(),
    }
}
