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
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Device, Tensor};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::artifact::{Artifact, BucketEntry};
use crate::error::{Error, Result};
use crate::family::Input;
use crate::interp::Overflow;
use crate::mlpackage::{Function, Package};
use crate::preprocess::{DecodeLimits, ImageProcessorConfig, PixelBatch, preprocess_file};
use crate::reference::VisionTower;
use crate::tensor_file::f32_values as to_vec;

use super::Status;
use super::jobs::run_jobs;
use crate::exec::Executor;
use crate::runtime::{ExecError, run_bucket};

/// Images run in one call.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub images: Vec<PathBuf>,
}

/// The images the gate uses by default, under `golden/images`: small,
/// large, square, wide, tall, extreme aspect, tiny (heavily padded in any
/// bucket), transparency, grayscale; then three of them in one call.
pub const GOLDEN_IMAGES: &[&str] = &[
    "square.png",
    "wide.jpg",
    "tall.png",
    "tiny.png",
    "large.jpg",
    "extreme.png",
    "rgba.png",
    "gray.jpg",
];
const GOLDEN_MULTI: &[&str] = &["square.png", "rgba.png", "tiny.png"];

/// The gate's cases: the golden set, or every image in `dir` (sorted) plus
/// one call with its first three.
pub fn cases(dir: Option<&Path>) -> Result<Vec<Case>> {
    let (root, names): (PathBuf, Vec<String>) = match dir {
        None => {
            let root = crate::home::golden("golden/images", "--images DIR")?;
            (root, GOLDEN_IMAGES.iter().map(|s| s.to_string()).collect())
        }
        Some(d) => {
            let mut v = Vec::new();
            for e in std::fs::read_dir(d).map_err(|e| Error::io(d, e))? {
                let p = e.map_err(|e| Error::io(d, e))?.path();
                let ext = p
                    .extension()
                    .map(|x| x.to_string_lossy().to_lowercase())
                    .unwrap_or_default();
                if p.is_file() && ["png", "jpg", "jpeg", "webp"].contains(&ext.as_str()) {
                    v.push(
                        p.file_name()
                            .unwrap_or_default()
                            .to_string_lossy()
                            .to_string(),
                    );
                }
            }
            v.sort();
            if v.is_empty() {
                return Err(Error::checkpoint(d, "no .png, .jpg, .jpeg or .webp images"));
            }
            (d.to_path_buf(), v)
        }
    };
    let mut out: Vec<Case> = names
        .iter()
        .map(|n| Case {
            name: n.clone(),
            images: vec![root.join(n)],
        })
        .collect();
    let multi: Vec<String> = if dir.is_none() {
        GOLDEN_MULTI.iter().map(|s| s.to_string()).collect()
    } else {
        names.iter().take(3).cloned().collect()
    };
    if multi.len() > 1 {
        out.push(Case {
            name: multi.join("+"),
            images: multi.iter().map(|n| root.join(n)).collect(),
        });
    }
    Ok(out)
}

/// Agreement of one output over real tokens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OutputStats {
    pub name: String,
    pub min_cos: f64,
    pub mean_cos: f64,
    pub max_abs_err: f64,
    /// Non-finite values in the whole output, pad tokens included.
    pub nonfinite: usize,
    /// Cosine of every real token.
    pub token_cos: Vec<f64>,
}

/// Agreement after one block, over real rows.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BlockStats {
    pub block: String,
    pub min_cos: f64,
    pub mean_cos: f64,
}

/// One case in one bucket.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseResult {
    pub bucket: String,
    pub case: String,
    pub images: Vec<String>,
    pub grid_thw: Vec<[usize; 3]>,
    pub real_patches: usize,
    pub bucket_patches: usize,
    /// `pass`, `fail`, `error` (could not run) or `skipped` (does not fit).
    pub status: Status,
    pub threshold: f64,
    pub outputs: Vec<OutputStats>,
    pub blocks: Vec<BlockStats>,
    pub first_overflow: Option<Overflow>,
    pub drift_enters: Option<String>,
    pub message: String,
    pub seconds: HashMap<String, f64>,
}

/// Cosine of two vectors in f64; 1 when both are zero, 0 when one is.
fn cosine(a: impl Iterator<Item = f64> + Clone, b: impl Iterator<Item = f64> + Clone) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (x, y) in a.zip(b) {
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 && bb == 0.0 {
        1.0
    } else if aa == 0.0 || bb == 0.0 || !ab.is_finite() {
        0.0
    } else {
        ab / (aa.sqrt() * bb.sqrt())
    }
}

/// Compare reference rows `[n, c]` with the artifact's `[1, c, 1, cols]`,
/// reference row `t` against column `columns[t]` (the real ones; `n` is
/// `columns.len()`). Returns per-row cosines, max abs error and non-finite
/// count over the whole artifact tensor.
fn compare(
    reference: &[f32],
    c: usize,
    art: &[f32],
    cols: usize,
    columns: &[usize],
) -> (Vec<f64>, f64, usize) {
    let nonfinite = art
        .par_chunks(1 << 16)
        .map(|p| p.iter().filter(|v| !v.is_finite()).count())
        .sum();
    // Channel by channel, so that `art` is read along its rows: a column at
    // a time would touch a new cache line per value.
    let mut rows = vec![0f32; columns.len() * c];
    for (k, channel) in art.chunks_exact(cols).take(c).enumerate() {
        for (t, &col) in columns.iter().enumerate() {
            rows[t * c + k] = channel[col];
        }
    }
    let (cos, max_err) = compare_rows(reference, c, &rows);
    (cos, max_err, nonfinite)
}

/// Per-token cosines and the largest absolute difference between two
/// `[tokens, c]` row-major sets of rows (the reference's and the rows the
/// runtime read from the artifact's output).
fn compare_rows(reference: &[f32], c: usize, rows: &[f32]) -> (Vec<f64>, f64) {
    // Per token (over all cores): its cosine and its largest error.
    let per_token: Vec<(f64, f64)> = (0..rows.len() / c.max(1))
        .into_par_iter()
        .map(|t| {
            let r = (0..c).map(move |k| reference[t * c + k] as f64);
            let a = (0..c).map(move |k| rows[t * c + k] as f64);
            let mut max_err = 0f64;
            for (x, y) in r.clone().zip(a.clone()) {
                let e = (x - y).abs();
                max_err = if e.is_nan() {
                    f64::INFINITY
                } else {
                    max_err.max(e)
                };
            }
            (cosine(r, a), max_err)
        })
        .collect();
    let max_err = per_token.iter().map(|&(_, e)| e).fold(0f64, f64::max);
    (per_token.into_iter().map(|(c, _)| c).collect(), max_err)
}

fn min_mean(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (1.0, 1.0);
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    (min, v.iter().sum::<f64>() / v.len() as f64)
}

/// Names of the values holding each block's output in a function built by
/// `ane-export build` (`b{i}_res2`, or with the fp16 pass's suffix).
pub fn block_taps(f: &Function, depth: usize) -> Vec<Option<String>> {
    (0..depth)
        .map(|i| {
            let plain = format!("b{i}_res2");
            let cast = format!("{plain}_cast_fp16");
            f.ops
                .iter()
                .flat_map(|o| &o.outputs)
                .find(|o| o.name == plain || o.name == cast)
                .map(|o| o.name.clone())
        })
        .collect()
}

/// Constants of a program that its outputs cannot show, checked against the
/// reference's own: every `layer_norm`'s epsilon must be the reference's
/// (`LAYER_NORM_EPS`) as the program's dtype stores it. A LayerNorm epsilon
/// 10x too large changes a tower's outputs by less than fp16 rounding (the
/// docs/cli.md, "Cosine threshold and margin"), so no cosine threshold can catch
/// it. Returns one line per op that differs; empty when all agree.
pub fn constant_mismatches(pkg: &Package, f: &Function, reference_eps: f64) -> Vec<String> {
    use crate::mlpackage::{Arg, DType};
    let producer: HashMap<&str, &crate::mlpackage::Op> = f
        .ops
        .iter()
        .flat_map(|o| o.outputs.iter().map(move |n| (n.name.as_str(), o)))
        .collect();
    let mut bad = Vec::new();
    for op in f.ops.iter().filter(|o| o.kind == "layer_norm") {
        let value = match op.inputs.get("epsilon").and_then(|v| v.first()) {
            Some(Arg::Const(v)) => Some(v),
            Some(Arg::Var(n)) => producer
                .get(n.as_str())
                .filter(|p| p.kind == "const")
                .and_then(|p| p.attributes.get("val")),
            None => None,
        };
        let Some(value) = value else {
            bad.push(format!(
                "`{}` (layer_norm): epsilon is not a constant",
                op.label()
            ));
            continue;
        };
        let got = crate::gate::residency::value_f64(pkg, value).and_then(|v| v.first().copied());
        let want = match value.ty().dtype {
            DType::F16 => half::f16::from_f64(reference_eps).to_f64(),
            _ => reference_eps as f32 as f64,
        };
        if got != Some(want) {
            bad.push(format!(
                "`{}` (layer_norm): epsilon {}, the reference's is {reference_eps:e} ({want:e} as stored)",
                op.label(),
                got.map_or("unreadable".to_string(), |g| format!("{g:e}"))
            ));
        }
    }
    bad
}

/// Where [`Spill::put`] wrote a run of f32 values.
#[derive(Clone, Copy, Debug)]
struct Spilled {
    offset: u64,
    len: usize,
}

/// The reference's outputs, written to an unnamed temporary file as they
/// are computed and read back one tensor at a time: the gate runs the
/// reference over every case first and drops it before the artifact runs,
/// so the two towers' weights are never resident together, and a case's
/// per-block outputs (`depth x n x hidden` values) need not stay in memory.
struct Spill {
    file: std::fs::File,
    end: u64,
}

impl Spill {
    fn new() -> Result<Spill> {
        let file = tempfile::tempfile().map_err(|e| Error::io(&std::env::temp_dir(), e))?;
        Ok(Spill { file, end: 0 })
    }

    /// A run that panicked while holding the file (a bug, never input).
    fn poisoned() -> Error {
        Error::Invalid(
            "the cosine gate's temporary file of reference outputs: a case failed while reading it"
                .into(),
        )
    }

    /// The values [`Spill::put`] wrote at `s`, from the file `spill` locks.
    fn read(spill: &std::sync::Mutex<Spill>, s: Spilled) -> Result<Vec<f32>> {
        spill.lock().map_err(|_| Spill::poisoned())?.get(s)
    }

    fn io(e: std::io::Error) -> Error {
        Error::Invalid(format!(
            "the cosine gate's temporary file of reference outputs (in {}): {e}",
            std::env::temp_dir().display()
        ))
    }

    /// Append `t`'s values (any float dtype, read as f32).
    fn put(&mut self, t: &Tensor) -> Result<Spilled> {
        self.put_values(&to_vec(t)?)
    }

    /// Append `v`.
    fn put_values(&mut self, v: &[f32]) -> Result<Spilled> {
        use std::io::{Seek, SeekFrom, Write};
        self.file
            .seek(SeekFrom::Start(self.end))
            .map_err(Spill::io)?;
        for chunk in v.chunks(1 << 18) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.file.write_all(&bytes).map_err(Spill::io)?;
        }
        let s = Spilled {
            offset: self.end,
            len: v.len(),
        };
        self.end += 4 * v.len() as u64;
        Ok(s)
    }

    /// The values [`Spill::put`] wrote at `s`.
    fn get(&mut self, s: Spilled) -> Result<Vec<f32>> {
        use std::io::{Read, Seek, SeekFrom};
        self.file
            .seek(SeekFrom::Start(s.offset))
            .map_err(Spill::io)?;
        let mut bytes = vec![0u8; 4 * s.len];
        self.file.read_exact(&mut bytes).map_err(Spill::io)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

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
    pub reference_pre: &'a ImageProcessorConfig,
    pub executor: &'a dyn Executor,
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
        tower: &dyn VisionTower,
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
        let Input::Pixels(px) = self.artifact.cfg.input();
        order.sort_by_key(|&i| std::cmp::Reverse(px.slots(&wanted[i].grid)));
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
        let cfg = &self.artifact.cfg;
        let Input::Pixels(px) = cfg.input();
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
        let art_batch = fit(cfg, &case.images, &self.artifact.pre, b.patches)?;
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
        let ref_batch = fit(cfg, &case.images, self.reference_pre, b.patches)?;
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
        tower: &dyn VisionTower,
        w: &Wanted,
        spill: &std::sync::Mutex<Spill>,
    ) -> Result<RefRun> {
        let ref_batch = fit(
            &self.artifact.cfg,
            &w.case.images,
            self.reference_pre,
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
            grid: ref_batch.grid_thw,
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
                let pkg = pkgs.get(&b.package).ok_or_else(|| {
                    Error::Invalid(format!("package {} of {} is not open", b.package, b.name))
                })?;
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
        let Input::Pixels(px) = self.artifact.cfg.input();
        jobs.sort_by_key(|j| std::cmp::Reverse((px.slots(&refs.runs[j.k].grid), j.bucket.patches)));
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
        pkg: &Package,
        b: &BucketEntry,
        threshold: f64,
        case: &Case,
        tables: &crate::host::HostTables,
        refs: &References,
        k: usize,
    ) -> std::result::Result<CaseResult, CaseError> {
        let cfg = &self.artifact.cfg;
        // The same preprocessing as the reference side checked (it is deterministic).
        let art_batch = fit(cfg, &case.images, &self.artifact.pre, b.patches)?;
        let n = art_batch.rows();
        let func = pkg
            .program
            .function(Some(&b.function))
            .map_err(|m| CaseError::Case(Status::Error, m, n))?;
        let taps = block_taps(func, cfg.depth());
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
            &art_batch,
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
        for (name, spilled) in cfg.output_names().into_iter().zip(ref_outputs) {
            let r = Spill::read(&refs.spill, spilled)?;
            let r = r.as_slice();
            let spec = exec.spec(&name).map_err(|e| self.case_error(e, n))?;
            let a = exec.raw(&name).map_err(|e| self.case_error(e, n))?;
            // Non-finite values anywhere in the output, pad columns included;
            // the cosines over the rows the runtime returns.
            let nonfinite = a.iter().filter(|v| !v.is_finite()).count();
            let (token_cos, max_abs_err) = compare_rows(r, spec.width, &exec.rows_of(spec, &a));
            let (min_cos, mean_cos) = min_mean(&token_cos);
            outputs.push(OutputStats {
                name,
                min_cos,
                mean_cos,
                max_abs_err,
                nonfinite,
                token_cos: token_cos.iter().map(|c| (c * 1e6).round() / 1e6).collect(),
            });
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
        let pass = outputs.iter().all(|o| o.min_cos >= threshold) && nonfinite == 0;
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
        if let Some(o) = &run.first_overflow {
            message.push_str(&format!(
                "; first fp16 overflow at op `{}` ({}): {} non-finite, {} saturated",
                o.op, o.kind, o.nonfinite, o.saturated
            ));
            if !pass {
                message.push_str(&overflow_remedy(self.artifact));
            }
        }
        let mut seconds = HashMap::new();
        seconds.insert("reference".to_string(), ref_seconds);
        seconds.insert("artifact".to_string(), art_s);
        let status = if pass { Status::Pass } else { Status::Fail };
        Ok(CaseResult {
            grid_thw: art_batch.grid_thw.clone(),
            outputs,
            blocks,
            first_overflow: run.first_overflow.clone(),
            drift_enters,
            seconds,
            ..no_numbers(case, b, threshold, status, message, n)
        })
    }
}

/// One case in one bucket for the artifact side: `k` indexes the
/// reference run it compares with, `slot` its place among the results.
struct Job<'a> {
    slot: usize,
    case: &'a Case,
    bucket: &'a BucketEntry,
    threshold: f64,
    pkg: &'a Package,
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

/// What to do about an fp16 overflow that failed a case: rebuild with the
/// residual stream scaled down (`--residual-scale`, a larger one than the
/// artifact's own), where the family's builder can; else say it has no
/// remedy yet.
fn overflow_remedy(art: &Artifact) -> String {
    let family = art.family;
    if !family.residual_scale() {
        return format!(
            "; the {} builder has no fp16 remedy yet (--residual-scale is for {})",
            family.name(),
            crate::family::Family::residual_scale_families().join(", ")
        );
    }
    match art.manifest["residual_scale"].as_u64() {
        Some(s) if s < 4096 => format!(
            "; remedy: build again with a larger --residual-scale than this artifact's {s} (e.g. {})",
            (s * 4).min(4096)
        ),
        Some(_) => "; --residual-scale is already at its largest (4096)".into(),
        None => {
            "; remedy: build again with --residual-scale S (a power of two, e.g. 8 or 64) to carry \
                 the residual stream divided by S within fp16"
                .into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_reads_the_channel_major_layout() {
        // Reference rows [2 tokens, 3 channels]; artifact [1, 3, 1, 4] with 2 pad columns.
        let r = [1.0, 2.0, 3.0, 0.0, 1.0, 0.0];
        let a = [
            1.0,
            0.0,
            9.0,
            f32::NAN,
            2.0,
            1.0,
            9.0,
            9.0,
            3.0,
            0.0,
            9.0,
            9.0,
        ];
        let (cos, err, nonfinite) = compare(&r, 3, &a, 4, &[0, 1]);
        assert!((cos[0] - 1.0).abs() < 1e-12 && (cos[1] - 1.0).abs() < 1e-12);
        assert_eq!(err, 0.0);
        assert_eq!(nonfinite, 1);
        // A swapped channel pair is seen.
        let a2 = [3.0, 0.0, 0.0, 0.0, 2.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let (cos, err, _) = compare(&r, 3, &a2, 4, &[0, 1]);
        assert!(cos[0] < 0.72 && err == 2.0);
        assert_eq!(cosine([0.0].into_iter(), [0.0].into_iter()), 1.0);
        assert_eq!(cosine([1.0].into_iter(), [0.0].into_iter()), 0.0);
        // Non-finite values are counted in every chunk of a large output,
        // padding columns included.
        let (c, cols) = (3, 100_000);
        let mut big = vec![1f32; c * cols];
        for i in [5, 70_000, 150_000, c * cols - 1] {
            big[i] = f32::INFINITY;
        }
        big[200_001] = f32::NAN;
        let (_, _, nonfinite) = compare(&[1.0; 3], c, &big, cols, &[0]);
        assert_eq!(nonfinite, 5);
    }

    /// What the reference side spills reads back exactly, in any order,
    /// whatever the tensor's float dtype.
    #[test]
    fn spilled_reference_outputs_read_back_exactly() {
        let mut spill = Spill::new().unwrap();
        let a: Vec<f32> = (0..1000).map(|i| (i as f32).sin() * 1e3).collect();
        let b = vec![f32::MIN_POSITIVE, -0.0, 65504.0, f32::NAN];
        let ta = Tensor::from_slice(&a, (10, 100), &Device::Cpu).unwrap();
        let tb = Tensor::from_slice(&b, 4, &Device::Cpu).unwrap();
        let th = ta.to_dtype(candle_core::DType::F16).unwrap();
        let (sa, sb, sh) = (
            spill.put(&ta).unwrap(),
            spill.put(&tb).unwrap(),
            spill.put(&th).unwrap(),
        );
        let got_b = spill.get(sb).unwrap();
        assert_eq!(got_b[..3], b[..3]);
        assert!(got_b[3].is_nan() && got_b[1].is_sign_negative());
        assert_eq!(spill.get(sa).unwrap(), a);
        assert_eq!(spill.get(sh).unwrap(), to_vec(&th).unwrap());
    }

    #[test]
    fn compare_rows_agrees_with_the_column_reading() {
        // The rows the runtime returns for the artifact above: [2 tokens, 3].
        let r = [1.0, 2.0, 3.0, 0.0, 1.0, 0.0];
        let rows = [1.0, 2.0, 3.0, 0.0, 1.0, 0.0];
        let (cos, err) = compare_rows(&r, 3, &rows);
        assert_eq!(cos.len(), 2);
        assert!((cos[0] - 1.0).abs() < 1e-12 && (cos[1] - 1.0).abs() < 1e-12 && err == 0.0);
        let swapped = [3.0, 2.0, 1.0, 0.0, 1.0, 0.0];
        let (cos, err) = compare_rows(&r, 3, &swapped);
        let (want, want_err, _) = compare(&r, 3, &[3.0, 0.0, 2.0, 1.0, 1.0, 0.0], 2, &[0, 1]);
        assert_eq!((cos, err), (want, want_err));
        let (_, err) = compare_rows(&r, 3, &[f32::NAN, 2.0, 3.0, 0.0, 1.0, 0.0]);
        assert_eq!(err, f64::INFINITY, "a NaN is the largest error");
    }
}
