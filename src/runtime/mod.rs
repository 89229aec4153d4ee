//! The runtime: load an accepted artifact and embed images with it.
//!
//! ```no_run
//! use ane_export::runtime::Runtime;
//! let rt = Runtime::open("out/tiny-vlm".as_ref())?;
//! let e = rt.embed_file("photo.jpg".as_ref())?;
//! let embeds = &e.outputs[0];
//! println!("{} tokens of {} from bucket {}", embeds.rows, embeds.width, e.bucket);
//! # Ok::<(), ane_export::Error>(())
//! ```
//!
//! Loading takes a [`Cleared`] artifact: the sha256 of every file the
//! manifest lists checked, and the acceptance the gates recorded required
//! ([`Cleared::accepted`]) unless cleared through the visible escape hatch
//! [`Cleared::without_acceptance`]. Embedding an image is split in two so
//! that callers can overlap them: [`Runtime::prepare`] (decode, resize,
//! patchify: host work, any thread) and [`Runtime::execute`] (host inputs,
//! the bucket's function, pad rows dropped).

pub mod pipeline;

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use candle_core::{Device, Tensor};

use crate::artifact::{Acceptance, Artifact, BucketEntry, Cleared};
pub use crate::error::ExecError;
use crate::error::{Error, ImageError, Result};
use crate::exec::{Executor, MilExecutor, Target};
use crate::family::{Input, OutputSpec, VisionConfig};
use crate::host::{HostError, HostInputs, HostTables};
use crate::interp::{Precision, RunOutput};
use crate::lm::ImageFeatures;
use crate::mlpackage::Package;
use crate::preprocess::{DecodeLimits, PixelBatch, TokenBatch, load_rgb, preprocess_rgb};

/// An image decoded, resized and patchified for the artifact.
pub struct Prepared {
    pub batch: PixelBatch,
    /// Seconds spent decoding and preprocessing.
    pub decode_s: f64,
    pub preprocess_s: f64,
}

/// One output of one image, pad rows dropped: `[rows, width]` row-major.
pub struct OutputRows {
    /// The name files give it ([`crate::family::OutputSpec::file_name`]).
    pub name: String,
    pub rows: usize,
    pub width: usize,
    pub values: Vec<f32>,
}

/// One image's outputs, pad rows dropped.
pub struct Embedding {
    /// Every output of the family, in order: for the Qwen-VL families the
    /// visual tokens that replace the image-pad tokens (`embeds`), then
    /// the deepstack outputs; for an encoder its token states and pooled
    /// outputs.
    pub outputs: Vec<OutputRows>,
    pub grid_thw: [usize; 3],
    pub bucket: String,
    /// Seconds from the host inputs to the rows, the executor included.
    pub execute_s: f64,
    /// Seconds of the prediction alone, when the executor reports it
    /// (Core ML; see [`RunOutput::predict_s`]).
    pub predict_s: Option<f64>,
}

impl Embedding {
    /// What the language model takes from a Qwen-VL tower's outputs: the
    /// visual tokens, then the deepstack outputs.
    pub fn into_image_features(self) -> Result<ImageFeatures> {
        let mut t = self
            .outputs
            .into_iter()
            .map(|o| Tensor::from_vec(o.values, (o.rows, o.width), &Device::Cpu));
        let embeds = t
            .next()
            .ok_or_else(|| Error::Invalid("the artifact gave no outputs".into()))??;
        Ok(ImageFeatures {
            embeds,
            deepstack: t.collect::<candle_core::Result<_>>()?,
            grid_thw: self.grid_thw,
        })
    }
}

/// One text's outputs: the real tokens' rows.
pub struct TextEmbedding {
    /// Every output of the family, in order (`last_hidden_state`, then
    /// `pooler_output` where the checkpoint has a pooler), then
    /// `sentence_embedding` where the checkpoint asks for one.
    pub outputs: Vec<OutputRows>,
    /// Tokens run (special tokens included).
    pub tokens: usize,
    /// Tokens before truncation to the largest bucket.
    pub full_len: usize,
    pub bucket: String,
    pub execute_s: f64,
    pub predict_s: Option<f64>,
}

/// A loaded, verified artifact.
pub struct Runtime {
    pub artifact: Artifact,
    /// Why an unaccepted artifact was loaded anyway (for a warning), if it was.
    pub acceptance: Acceptance,
    tables: crate::host::HostTables,
    /// Slots of the largest bucket, which every image is resized to fit
    /// (and every text truncated to).
    largest: usize,
    packages: HashMap<String, Package>,
    executor: Box<dyn Executor>,
}

impl Runtime {
    /// The accepted artifact at `dir`, run by the interpreter in fp32.
    pub fn open(dir: &Path) -> Result<Runtime> {
        Runtime::load(
            Cleared::accepted(dir)?,
            Box::new(MilExecutor::new(Precision::Fp32)),
        )
    }

    /// Load a cleared artifact (verified, and accepted unless cleared
    /// without) to run with `executor`.
    pub fn load(cleared: Cleared, executor: Box<dyn Executor>) -> Result<Runtime> {
        let (artifact, acceptance) = cleared.into_parts();
        let tables = artifact.host_tables()?;
        let mut packages = HashMap::new();
        for b in &artifact.buckets {
            if let Some(p) = &b.package
                && !packages.contains_key(p)
            {
                packages.insert(p.clone(), Package::open(&artifact.dir.join(p))?);
            }
        }
        // Each image is resized to fit the largest bucket (`prepare`).
        let largest = artifact
            .buckets
            .iter()
            .map(|b| b.patches)
            .max()
            .unwrap_or(0);
        Ok(Runtime {
            largest,
            artifact,
            acceptance,
            tables,
            packages,
            executor,
        })
    }

    /// What runs the packages.
    pub fn executor(&self) -> &dyn Executor {
        self.executor.as_ref()
    }

    /// Decode and preprocess one image file (safe to call from other threads).
    pub fn prepare(&self, path: &Path) -> Result<Prepared> {
        let t = Instant::now();
        let img = load_rgb(path, DecodeLimits::default())?;
        let decode_s = t.elapsed().as_secs_f64();
        let pre = self.artifact.image_processor()?;
        let t = Instant::now();
        let p = self.artifact.cfg.fitting(pre, self.largest, |pre| {
            let p = preprocess_rgb(img.clone(), pre)
                .map_err(|m| Error::image(path, ImageError::Preprocess(m)))?;
            let grid = p.batch.grid_thw.clone();
            Ok((p, grid))
        })?;
        Ok(Prepared {
            batch: p.batch,
            decode_s,
            preprocess_s: t.elapsed().as_secs_f64(),
        })
    }

    /// The smallest bucket that holds images `grid_thw` (the slots the
    /// family's layout needs: one per patch, or whole windows).
    pub fn bucket_for(&self, grid_thw: &[[usize; 3]]) -> Result<&BucketEntry> {
        let slots = self.artifact.cfg.pixels()?.slots(grid_thw);
        self.bucket_of(slots)
    }

    /// The smallest bucket of at least `slots` slots (patches or tokens).
    pub fn bucket_of(&self, slots: usize) -> Result<&BucketEntry> {
        self.artifact
            .buckets
            .iter()
            .filter(|b| b.patches >= slots)
            .min_by_key(|b| b.patches)
            .ok_or_else(|| Error::Invalid(format!("{slots} slots fit no bucket")))
    }

    /// Run a prepared image through its bucket and drop the pad rows.
    pub fn execute(&self, p: &Prepared) -> Result<Embedding> {
        self.execute_in(p, self.bucket_for(&p.batch.grid_thw)?)
    }

    /// A synthetic image (a smooth colour gradient) as large as bucket `b`
    /// holds, prepared: for benchmarks.
    pub fn synthetic(&self, b: &BucketEntry) -> Result<Prepared> {
        let p = self.artifact.cfg.pixels()?.patch_size();
        let pre = self.artifact.image_processor()?;
        let side = ((b.patches * p * p) as f64).sqrt() as usize;
        let mut data = Vec::with_capacity(side * side * 3);
        for y in 0..side {
            for x in 0..side {
                data.extend([
                    (x * 255 / side) as u8,
                    (y * 255 / side) as u8,
                    ((x + y) * 127 / side) as u8,
                ]);
            }
        }
        let img = crate::preprocess::RgbImage {
            width: side,
            height: side,
            data,
        };
        let t = Instant::now();
        let out = self.artifact.cfg.fitting(pre, b.patches, |pre| {
            let out = preprocess_rgb(img.clone(), pre).map_err(Error::Preprocess)?;
            let grid = out.batch.grid_thw.clone();
            Ok((out, grid))
        })?;
        Ok(Prepared {
            batch: out.batch,
            decode_s: 0.0,
            preprocess_s: t.elapsed().as_secs_f64(),
        })
    }

    /// Run a prepared image through bucket `b` (which must hold it) and drop the pad rows.
    pub fn execute_in(&self, p: &Prepared, b: &BucketEntry) -> Result<Embedding> {
        let (outputs, execute_s, predict_s) = self.call(Call::Pixels(&p.batch), b)?;
        Ok(Embedding {
            outputs,
            grid_thw: p.batch.grid_thw.first().copied().unwrap_or([0, 0, 0]),
            bucket: b.name.clone(),
            execute_s,
            predict_s,
        })
    }

    /// Tokens that fill bucket `b` of a text encoder's artifact (a sentence
    /// repeated, tokenized by the artifact's tokenizer and truncated to
    /// the bucket): for benchmarks.
    pub fn synthetic_tokens(&self, b: &BucketEntry) -> Result<TokenBatch> {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(b.patches.max(1));
        self.artifact.text_processor()?.encode(&text, b.patches)
    }

    /// Run one call through bucket `b` (which must hold it): the outputs'
    /// real rows, the seconds it took, the executor's prediction seconds.
    pub fn call(&self, call: Call, b: &BucketEntry) -> Result<(Vec<OutputRows>, f64, Option<f64>)> {
        let at = |error: ExecError| Error::Exec {
            bucket: b.name.clone(),
            error,
        };
        let t = Instant::now();
        let cfg = &self.artifact.cfg;
        // None: an artifact that ships the .aimodel alone.
        let pkg = b.package.as_ref().and_then(|p| self.packages.get(p));
        let run = run_bucket(
            cfg,
            &self.artifact.host,
            &self.tables,
            pkg,
            self.executor.as_ref(),
            call,
            b,
            &[],
        )
        .map_err(at)?;
        let outputs = run
            .specs
            .iter()
            .map(|s| {
                let values = run.rows(&s.name).map_err(at)?;
                Ok(OutputRows {
                    name: s.file_name.clone(),
                    rows: values.len() / s.width.max(1),
                    width: s.width,
                    values,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((outputs, t.elapsed().as_secs_f64(), run.output.predict_s))
    }

    /// Tokenize one text with the artifact's tokenizer, truncated to the
    /// largest bucket (what a text encoder's call takes).
    pub fn tokenize(&self, text: &str) -> Result<TokenBatch> {
        self.artifact.text_processor()?.encode(text, self.largest)
    }

    /// Run one text's tokens through the smallest bucket that holds them:
    /// the outputs' rows of the real tokens, and the sentence embedding
    /// (`sentence_embedding [1, D]`) where the checkpoint's
    /// sentence-transformers configuration asks for one.
    pub fn embed_tokens(&self, tokens: &TokenBatch) -> Result<TextEmbedding> {
        let t = self.artifact.cfg.tokens()?;
        let b = self.bucket_of(tokens.len())?;
        let (mut outputs, execute_s, predict_s) = self.call(Call::Tokens(tokens), b)?;
        if let Some(pool) = t.sentence_pooling()
            && let Some(h) = outputs.iter().find(|o| o.name == "last_hidden_state")
        {
            let values = pool.pool(&h.values, h.width);
            outputs.push(OutputRows {
                name: "sentence_embedding".into(),
                rows: 1,
                width: h.width,
                values,
            });
        }
        Ok(TextEmbedding {
            outputs,
            tokens: tokens.len(),
            full_len: tokens.full_len,
            bucket: b.name.clone(),
            execute_s,
            predict_s,
        })
    }

    /// Tokenize and embed one text.
    pub fn embed_text(&self, text: &str) -> Result<TextEmbedding> {
        self.embed_tokens(&self.tokenize(text)?)
    }

    /// Prepare and execute one image file.
    pub fn embed_file(&self, path: &Path) -> Result<Embedding> {
        self.execute(&self.prepare(path)?)
    }
}

/// What one call of a bucket reads, by modality.
#[derive(Clone, Copy)]
pub enum Call<'a> {
    /// Images, preprocessed.
    Pixels(&'a PixelBatch),
    /// One text's tokens.
    Tokens(&'a TokenBatch),
}

/// One execution of a bucket: the executor's outputs (and the values it was
/// asked to capture), with the host inputs' layout to read them by token.
pub struct BucketRun {
    pub output: RunOutput,
    pub host: HostInputs,
    /// The family's outputs for this bucket.
    pub specs: Vec<OutputSpec>,
    /// Patches merged into one token, `merge^2`.
    pub unit: usize,
    /// The recipe's `output_scale` and the outputs it multiplies (the
    /// family's [`crate::family::Tower::residual_outputs`]).
    pub output_scale: Option<(u32, Vec<&'static str>)>,
}

/// Make the host inputs of `batch` for bucket `b`, run its function with
/// `executor`, capturing the values named in `capture`: of each, the
/// columns of the real rows alone, in their order (`host.slot(r)` for each
/// real row `r`), where the executor captures at all. What both
/// [`Runtime::execute_in`] and the cosine gate execute.
#[allow(clippy::too_many_arguments)]
pub fn run_bucket(
    cfg: &VisionConfig,
    recipe: &crate::host::HostRecipe,
    tables: &HostTables,
    pkg: Option<&Package>,
    executor: &dyn Executor,
    call: Call,
    b: &BucketEntry,
    capture: &[String],
) -> std::result::Result<BucketRun, ExecError> {
    let host = match (cfg.input(), call) {
        (Input::Pixels(px), Call::Pixels(batch)) => {
            px.host_inputs(recipe, tables, batch, b.patches)
        }
        (Input::Tokens(t), Call::Tokens(batch)) => t.host_inputs(recipe, tables, batch, b.patches),
        (input, _) => Err(HostError::Batch(format!(
            "a {} model takes {}",
            cfg.family().name(),
            input.noun()
        ))),
    }
    .map_err(ExecError::HostInputs)?;
    let unit = cfg
        .input()
        .pixels()
        .map_or(1, |px| px.merge_size() * px.merge_size());
    let mut inputs = HashMap::new();
    for (name, shape, v) in host.named() {
        let t = Tensor::from_slice(v, shape, &Device::Cpu)
            .map_err(|e| ExecError::HostInputs(HostError::Batch(e.to_string())))?;
        inputs.insert(name.to_string(), t);
    }
    let capture = crate::interp::Capture {
        names: capture.to_vec(),
        columns: (!capture.is_empty()).then(|| (0..host.real).map(|r| host.slot(r)).collect()),
    };
    let specs = cfg.outputs(b.patches);
    let outputs: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let target = Target {
        package: pkg.zip(b.function.as_deref()),
        aimodel_function: b.aimodel_function.as_deref(),
        outputs: &outputs,
    };
    let output = executor
        .run(target, &inputs, &capture)
        .map_err(ExecError::Executor)?;
    Ok(BucketRun {
        output,
        host,
        specs,
        unit,
        output_scale: recipe.output_scale.map(|s| (s, cfg.residual_outputs())),
    })
}

impl BucketRun {
    /// The spec of output `name`.
    pub fn spec(&self, name: &str) -> std::result::Result<&OutputSpec, ExecError> {
        self.specs
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| ExecError::MissingOutput(name.to_string()))
    }

    /// Output `name` as it comes, `[1, width, 1, cols]` flattened, its size
    /// checked; an output that carries the residual stream scaled down is
    /// scaled back (in f32) by the recipe's `output_scale`.
    pub fn raw(&self, name: &str) -> std::result::Result<Vec<f32>, ExecError> {
        let spec = self.spec(name)?;
        let t = self
            .output
            .outputs
            .get(name)
            .ok_or_else(|| ExecError::MissingOutput(name.to_string()))?;
        let mut v = crate::tensor_file::f32_values(t)
            .map_err(|e| ExecError::Executor(crate::error::ExecutorError::Tensor(e.to_string())))?;
        if let Some((s, names)) = &self.output_scale
            && names.contains(&name)
        {
            v.iter_mut().for_each(|x| *x *= *s as f32);
        }
        if v.len() != spec.width * spec.cols {
            return Err(ExecError::OutputSize {
                name: name.to_string(),
                got: v.len(),
                width: spec.width,
                cols: spec.cols,
            });
        }
        Ok(v)
    }

    /// The real tokens' columns of output `name` as rows `[tokens, width]`,
    /// in the images' token order: what a caller of the runtime gets.
    pub fn rows(&self, name: &str) -> std::result::Result<Vec<f32>, ExecError> {
        Ok(self.rows_of(self.spec(name)?, &self.raw(name)?))
    }

    /// [`BucketRun::rows`] of an output already read with [`BucketRun::raw`].
    pub fn rows_of(&self, spec: &OutputSpec, v: &[f32]) -> Vec<f32> {
        let (out_dim, cols) = (spec.width, spec.cols);
        let columns: Vec<usize> = if spec.padded {
            self.host.token_columns(self.unit)
        } else {
            (0..cols).collect()
        };
        let mut rows = vec![0f32; columns.len() * out_dim];
        for c in 0..out_dim {
            for (t, &col) in columns.iter().enumerate() {
                rows[t * out_dim + c] = v[c * cols + col];
            }
        }
        rows
    }
}
