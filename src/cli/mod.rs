//! Command-line interfaces of `ane-export` and `ane-run`. The `///` docs on
//! the argument structs are the `--help` text. Each command returns
//! `Result<ExitCode>`: 0 done, 1 a check said no, 2 could not run (every
//! error); the binaries print errors with their whole context chain.

mod bench_cmd;
mod build_cmd;
mod embed_cmd;
mod gate_cmd;
mod package_cmd;
mod preprocess_cmd;
mod reference_cmd;
mod vqa_cmd;

mod output;
mod process;

pub(crate) use output::{draw_target, hub_events, mil, print_profile, set_quiet};
pub use output::{quiet, say};
pub use process::{
    exit_on_interrupt, finish, interp_settings, keep_freed_memory, open_blas, peak_rss_mib,
    reset_sigpipe,
};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::PossibleValue;
use clap::{Args, Parser, Subcommand};

use crate::builder::{Fault, Format, Target, WeightMode};
use crate::exec::ExecutorKind;
use crate::gate::GateName;
use crate::interp::Precision;

/// clap's possible values for the library's named enums (`crate::named`):
/// each value's name, with its doc comment as the help.
macro_rules! value_enum {
    ($($t:ty),*) => {$(
        impl clap::ValueEnum for $t {
            fn value_variants<'a>() -> &'a [Self] {
                <$t>::ALL
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                let v = PossibleValue::new(self.name());
                Some(match help(self.doc()) {
                    Some(h) => v.help(h),
                    None => v,
                })
            }
        }
    )*};
}

value_enum!(
    Precision,
    GateName,
    Target,
    WeightMode,
    Format,
    Fault,
    ExecutorKind
);

/// A doc comment as clap shows a value's help: its lines joined, without a
/// final period.
fn help(doc: &[&str]) -> Option<String> {
    let text = doc.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    let text = text.trim().trim_end_matches('.');
    (!text.is_empty()).then(|| text.to_string())
}

/// `--version`'s long form (`-V` prints the short one): the version, what
/// runs the towers' matrix products on this machine (the library, its
/// version and the kernels it chose; `blas::backend`), and the widest of
/// the project's own vector paths that run (`blas::vector_paths`).
pub fn long_version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        format!(
            "{}\nmatrix products: {}, kernels {}\nvector paths: {}",
            env!("CARGO_PKG_VERSION"),
            crate::blas::backend(),
            crate::blas::kernel(),
            crate::blas::vector_paths()
        )
    })
}

/// Parse the command line of either binary, with [`long_version`].
pub fn parse<C: Parser>() -> C {
    let m = C::command().long_version(long_version()).get_matches();
    C::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
}

/// Export vision towers of vision-language models to Core ML for the Apple
/// Neural Engine, and prove them right.
#[derive(Parser, Debug)]
#[command(name = "ane-export", version)]
pub struct ExportCli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: ExportCommand,
}

/// Options every command takes.
#[derive(Args, Debug, Clone, Copy)]
pub struct GlobalArgs {
    /// Print only results, warnings and errors: no progress, no summaries on
    /// stderr. (The tool writes no colour codes of its own; clap's help
    /// follows NO_COLOR.)
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

#[derive(Subcommand, Debug)]
pub enum ExportCommand {
    /// Run the fp32 reference tower (the oracle of the gates) on images, on
    /// preprocessed pixel values or, for a text encoder, on texts, and write
    /// its outputs as safetensors.
    Reference(ReferenceArgs),
    /// Export the vision tower (or text encoder) as static-shape Core ML
    /// packages in the ANE layout, one function per bucket, into an artifact
    /// directory.
    ///
    /// Example: ane-export build --model golden/tiny-vlm --out out/tiny-vlm
    Build(BuildArgs),
    /// Write the tower's weights rewritten into the ANE layout (safetensors)
    /// with a JSON description of each tensor, for your own converter.
    ///
    /// Example: ane-export layout --model golden/tiny-vlm --out out/tiny-vlm-layout
    Layout(LayoutArgs),
    /// Describe a Core ML package: functions, inputs and outputs, op
    /// histogram, weight bytes by dtype, metadata.
    ///
    /// Example: ane-export inspect out/tiny-vlm/tiny-vlm.mlpackage --json
    Inspect(InspectArgs),
    /// Run a Core ML package's ML program on Linux with the MIL interpreter.
    ///
    /// Example: ane-export exec out/tiny-vlm/tiny-vlm.mlpackage --function b1024 --inputs in.safetensors --out out.safetensors --precision fp16
    Exec(ExecArgs),
    /// Run the release gates on an artifact (residency, cosine, and VQA, or
    /// the task gate for an encoder without a language model), write
    /// gate/report.json and gate/report.html, and record acceptance in its
    /// manifest. The artifact is accepted only when all three gates that
    /// apply ran and passed over every bucket. Exit 0 every gate that ran passed (with
    /// --skip: passed but not accepted), 1 a gate failed, 2 a gate could not run.
    ///
    /// Example: ane-export gate --artifact out/tiny-vlm
    Gate(GateArgs),
}

#[derive(Args, Debug)]
pub struct GateArgs {
    /// Artifact directory written by `ane-export build` (or `--artifact DIR`,
    /// as every `ane-run` command takes it).
    #[arg(value_name = "ARTIFACT", required_unless_present = "artifact_flag")]
    pub artifact: Option<PathBuf>,
    /// The artifact directory, as a flag.
    #[arg(long = "artifact", value_name = "DIR", conflicts_with = "artifact")]
    pub artifact_flag: Option<PathBuf>,
    /// Checkpoint for the fp32 reference (default: the source recorded in the
    /// manifest). A directory, or a repo id from the Hugging Face cache, with
    /// what it lacks downloaded from the hub.
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: Option<String>,
    /// Revision of a repo id given with --model.
    #[arg(long)]
    pub revision: Option<String>,
    /// Folder of images for the cosine gate: each image alone, and its first
    /// three in one call (default: the golden images under golden/images and
    /// the stress images under golden/images-stress).
    #[arg(long, value_name = "DIR")]
    pub images: Option<PathBuf>,
    /// Texts for a text encoder's cosine gate, one per line, each run alone in
    /// every bucket, truncated to it (default: the golden texts, golden/text/texts.jsonl).
    #[arg(long, value_name = "FILE")]
    pub texts: Option<PathBuf>,
    /// Golden questions for the VQA gate (JSON lines: image, question, answer).
    #[arg(long, value_name = "FILE")]
    pub vqa: Option<PathBuf>,
    /// Labelled images for the task gate of an encoder without a language
    /// model (JSON lines: image, split train|test, labels {task: class}), or
    /// for a text encoder labelled texts (JSON lines: text, split, labels);
    /// default: the golden set golden/task/labels.jsonl, for a text encoder
    /// golden/task-text/texts.jsonl.
    #[arg(long, value_name = "FILE")]
    pub task: Option<PathBuf>,
    /// Gate only this bucket (repeatable): writes `gate/partial/<buckets>.json`
    /// for `--merge`, and does not change acceptance.
    #[arg(long, value_name = "NAME", conflicts_with = "merge")]
    pub bucket: Vec<String>,
    /// Combine the partial reports under gate/partial/ into one report over
    /// every bucket, and record acceptance.
    #[arg(long)]
    pub merge: bool,
    /// Skip a gate on purpose (repeatable); recorded in the report and the
    /// manifest. An artifact gated with a gate skipped is not accepted:
    /// `ane-run` refuses it, naming the skipped gates, unless --allow-unaccepted.
    #[arg(long, value_enum, value_name = "GATE")]
    pub skip: Vec<GateName>,
    /// Thresholds file (default: ./buckets.yaml if present, else the built-in defaults).
    #[arg(long, value_name = "FILE")]
    pub buckets: Option<PathBuf>,
    /// How the artifact runs: `mil` (the interpreter, in --precision's mode), `coreml`
    /// (Core ML with CPU_AND_NE and MLComputePlan; macOS only), `coreai` (the
    /// Core AI runtime on the artifact's .aimodel alone; its CPU on Linux),
    /// `auto` (Core ML on a Mac, else the interpreter; an artifact with an
    /// .aimodel has its .aimodel gated by Core AI beside, and one that ships
    /// the .aimodel alone is gated by Core AI).
    #[arg(long, value_enum, default_value = "auto")]
    pub executor: ExecutorKind,
    /// The interpreter's numeric mode, where it runs the artifact: `ane`
    /// (fp16 with the Neural Engine's published limits: matmul and conv
    /// outputs infinite past 32,752, narrow reduce_sum, no subnormals from
    /// products, offset slices clamped at 4,094; each op held to its limit,
    /// docs/numerics.md) or `fp16` (an idealised fp16 machine, every op
    /// held to 65,504).
    #[arg(long, default_value = "ane", value_parser = gate_precision)]
    pub precision: Precision,
    #[command(flatten)]
    pub coreml: CoreMlArgs,
    /// Print the report as JSON instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// The gate's `--precision`: `ane` or `fp16` (an fp32 run proves nothing
/// about fp16 hardware).
fn gate_precision(s: &str) -> std::result::Result<Precision, String> {
    match s {
        "ane" => Ok(Precision::Ane),
        "fp16" => Ok(Precision::Fp16),
        _ => Err(format!(
            "`{s}`: expected ane or fp16 (the gate judges fp16 hardware)"
        )),
    }
}

/// `exec --executor`: `mil` or `coreai` (Core ML runs artifacts, through
/// `ane-run` and the gates).
fn exec_executor(s: &str) -> std::result::Result<ExecutorKind, String> {
    match s {
        "mil" => Ok(ExecutorKind::Mil),
        "coreai" => Ok(ExecutorKind::Coreai),
        _ => Err(format!("`{s}`: expected mil or coreai")),
    }
}

/// How long Core ML (or Core AI) may take before its child process is
/// stopped as hung.
#[derive(Args, Debug, Clone, Copy)]
pub struct CoreMlArgs {
    /// With Core ML or Core AI: seconds to wait for the first prediction of
    /// each bucket, which loads the model and compiles it (for the Neural
    /// Engine; for MLComputePlan; Core AI's listing of its ops), before the
    /// child is stopped as hung; 0 for no limit.
    #[arg(long, default_value_t = 1800.0, value_name = "S", value_parser = seconds)]
    pub coreml_load_timeout: f64,
    /// With Core ML or Core AI: seconds to wait for each later prediction; 0
    /// for no limit.
    #[arg(long, default_value_t = 600.0, value_name = "S", value_parser = seconds)]
    pub coreml_timeout: f64,
}

/// A limit in seconds: 0 (none), or from 1 s to a week.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v == 0.0 || (1.0..=604_800.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "expected 0 (no limit) or seconds from 1 to 604800, got `{s}`"
        )),
    }
}

impl CoreMlArgs {
    /// The limits, 0 meaning none.
    pub fn timeouts(&self) -> crate::exec::coreml::Timeouts {
        let limit = |s: f64| (s > 0.0).then(|| std::time::Duration::from_secs_f64(s));
        crate::exec::coreml::Timeouts {
            load: limit(self.coreml_load_timeout),
            predict: limit(self.coreml_timeout),
        }
    }

    /// Core ML with `units` when `kind` means it here (`None` for the
    /// interpreter); an error off macOS when Core ML was asked for.
    pub fn executor(
        &self,
        kind: ExecutorKind,
        units: &str,
    ) -> crate::Result<Option<crate::exec::coreml::CoreMl>> {
        kind.coreml(units, self.timeouts())
    }
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Artifact directory to create (package, host.safetensors, manifest.json).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Buckets file (default: ./buckets.yaml if present, else the built-in b1024 and b4096).
    /// A bucket's `patches` is its capacity in slots: one per patch, except
    /// for Qwen2.5-VL, whose host gives every attention window 64 slots
    /// (edge windows included), so a bucket must be a multiple of 64 and an
    /// image takes 64 slots per window (the manifest records the capacity as
    /// `patches`).
    #[arg(long, value_name = "FILE")]
    pub buckets: Option<PathBuf>,
    /// Build only this bucket (repeatable), e.g. to fan buckets out over a CI matrix.
    #[arg(long, value_name = "NAME")]
    pub bucket: Vec<String>,
    /// One package per bucket (for targets before macOS 15) instead of one multifunction package.
    #[arg(long)]
    pub per_bucket: bool,
    /// Deployment target; multifunction packages need macOS 15.
    #[arg(long, value_enum, default_value = "macos15")]
    pub target: Target,
    /// Weight storage: fp16, int8 (per-channel linear quantisation) or
    /// k-means palettes of 6 or 8 bits (ANE-RULES R14).
    #[arg(long, value_enum, default_value = "fp16")]
    pub weights: WeightMode,
    /// The formats the artifact ships: the Core ML package, the Core AI
    /// program (`<name>.aimodel`, one function per bucket named like the
    /// bucket) translated op by op from it (the package is emitted to
    /// translate it and left out), or both; listed, hashed and gated each
    /// with its own executor: the package with the interpreter (Core ML on
    /// a Mac), the .aimodel with the Core AI runtime (docs/formats.md).
    #[arg(long, value_enum, default_value = "mlpackage")]
    pub format: Format,
    /// Queries per attention chunk: score tensors stay within N x patches
    /// (ANE-RULES R4); 0 computes each head's attention in one piece. More
    /// chunks mean more ops and a slower conversion.
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub query_chunk: usize,
    /// Carry the residual stream divided by S (a power of two, 1 to 4096;
    /// 1: not scaled) inside the program, so that a trained tower's massive activations
    /// (channels in the tens of thousands) stay within fp16 and on the
    /// Neural Engine: where the stream starts (the embeddings; CLIP's
    /// `pre_layrnorm`) and every branch's last weights (DINOv2's
    /// LayerScale; the other families' attention output and MLP down
    /// projections) are divided by S, position rows added to the stream
    /// multiplied by 1/S in the program, and LayerNorm and RMSNorm are
    /// unchanged by the scale (up to their epsilon, now relative to the
    /// scaled variance). Outputs after a norm need nothing (the Qwen
    /// mergers start with one); CLIP's `last_hidden_state`, the stream
    /// itself, is multiplied back by the host in f32 (`host.output_scale`).
    /// The cosine gate's `first_overflow` says when a tower needs it. Every
    /// family (a post-norm text encoder scales the sums its norms read,
    /// which the norms return unscaled). Without it, the build chooses the
    /// smallest S that keeps the fp32 reference's residual stream on the
    /// calibration images (the cosine gate's default images; a text
    /// encoder's golden texts) 4x below the Neural Engine's 32,752 ceiling
    /// for conv outputs, and says so (docs/numerics.md). Recorded in the
    /// manifest (`residual_scale`, `calibration`).
    #[arg(long, value_name = "S")]
    pub residual_scale: Option<u32>,
    /// The images the residual scale is calibrated on when --residual-scale
    /// is not given: every .png, .jpg, .jpeg or .webp in DIR (default: the
    /// cosine gate's default images, its stress images among them). Not for
    /// a text encoder, which calibrates on the golden texts.
    #[arg(long, value_name = "DIR")]
    pub calibration_images: Option<PathBuf>,
    /// Carry each block's MLP hidden layer divided by B (a power of two, 2
    /// to 4096) inside the program, so that the block's output is unchanged
    /// while its hidden values stay B times further from the Neural
    /// Engine's limits: Qwen2.5-VL's SwiGLU product silu(gate) * up (the
    /// `up` projection divided by B; it reaches the thousands in trained
    /// towers), Qwen3-VL's and Qwen2-VL's fc1 output (fc1 divided by B, the
    /// GELU computed exactly on the scaled values: the activation of x
    /// clipped to [-16, 16], where it has saturated, plus the part beyond);
    /// the down projection's weights multiplied by B (and divided by
    /// --residual-scale). The Qwen families; recorded in the manifest
    /// (`branch_scale`; docs/numerics.md).
    #[arg(long, value_name = "B")]
    pub branch_scale: Option<u32>,
    /// Replace an existing artifact at --out.
    #[arg(long)]
    pub force: bool,
    /// Print a machine-readable summary.
    #[arg(long)]
    pub json: bool,
    /// Build a deliberately broken artifact (repeatable), to prove that the
    /// gates catch it (see `Fault`). Recorded in the manifest.
    #[arg(long, hide = true, value_enum, value_name = "FAULT")]
    pub fault: Vec<Fault>,
}

#[derive(Args, Debug)]
pub struct LayoutArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Directory to write `weights.safetensors` and `layout.json` into.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The .mlpackage directory.
    pub package: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// The .mlpackage directory (with --executor coreai: the .aimodel directory).
    pub package: PathBuf,
    /// Function to run (default: the package's default function, or its
    /// only one; a .aimodel's function must be named, e.g. b1024).
    #[arg(long)]
    pub function: Option<String>,
    /// What runs the function: `mil` (the interpreter, in --precision's
    /// mode) or `coreai` (the Core AI runtime of coreai-core, in a child
    /// process, on a .aimodel: its CPU on Linux; inputs cast to the
    /// function's declared types, outputs written as f32).
    #[arg(long, default_value = "mil", value_parser = exec_executor)]
    pub executor: ExecutorKind,
    /// safetensors file with one tensor per function input, named as the inputs.
    #[arg(long, value_name = "IN.safetensors")]
    pub inputs: PathBuf,
    /// Output safetensors file: every function output, as f32.
    #[arg(long, value_name = "OUT.safetensors")]
    pub out: PathBuf,
    /// fp32 computes every op in f32; fp16 rounds every op's output to fp16
    /// and names the first op that overflows; ane adds the Neural Engine's
    /// measured limits (docs/numerics.md).
    #[arg(long, value_enum, default_value = "fp32")]
    pub precision: Precision,
    /// Run the function this many times (weights are decoded in the first
    /// run only): the time printed is the last run's; outputs are the last run's.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
}

/// Where the checkpoint comes from.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A Hugging Face model directory, or a repo id (`org/name`) resolved in
    /// the local Hugging Face cache (HF_HUB_CACHE / HF_HOME), downloading
    /// what it lacks from the hub (HF_ENDPOINT, HF_TOKEN; HF_HUB_OFFLINE=1
    /// for the cache alone).
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: String,
    /// Revision of a repo id: branch, tag or commit hash (default: main).
    #[arg(long)]
    pub revision: Option<String>,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["image", "pixel_values", "text"])))]
pub struct ReferenceArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Image files (JPEG, PNG, WebP); several images run in one call and
    /// attend only within themselves.
    #[arg(long, num_args = 1.., value_name = "IMG")]
    pub image: Vec<PathBuf>,
    /// A safetensors file with `pixel_values` [n, 3*T*P*P] and `grid_thw` [k, 3],
    /// to check the tower apart from preprocessing; for a fixed-resolution
    /// encoder (CLIP, SigLIP, DINOv2) also transformers' `pixel_values`
    /// [B, 3, H, W] alone; for SigLIP2 transformers' padded `pixel_values`
    /// [B, N, 3*P*P] with `spatial_shapes` [B, 2] and `pixel_attention_mask`
    /// [B, N] (outputs then hold the images' real tokens, one after another).
    #[arg(long, value_name = "FILE", conflicts_with = "text")]
    pub pixel_values: Option<PathBuf>,
    /// Texts, for a text encoder (BERT, RoBERTa, XLM-R, ModernBERT): each tokenized by the
    /// checkpoint's tokenizer.json and run alone; outputs hold the texts'
    /// tokens one after another.
    #[arg(long, num_args = 1.., value_name = "TEXT", conflicts_with = "image")]
    pub text: Vec<String>,
    /// Truncate each text to this many tokens, special tokens included
    /// (default: the checkpoint's position table).
    #[arg(long, value_name = "N", requires = "text")]
    pub max_tokens: Option<usize>,
    /// Output safetensors: the family's outputs (Qwen-VL: `embeds`, `deepstack.{i}`; CLIP, SigLIP, SigLIP2, DINOv2:
    /// `last_hidden_state`, `pooler_output`, `image_embeds` as transformers names them), `grid_thw`
    /// and, from images, `pixel_values`; for texts `last_hidden_state`, `pooler_output`,
    /// `sentence_embedding` (where the checkpoint's sentence-transformers configuration asks for
    /// one), `input_ids` and `lengths`.
    #[arg(long, value_name = "OUT.safetensors")]
    pub out: PathBuf,
    /// Also write the hidden states after every block as `block.{i}` [n, hidden].
    #[arg(long)]
    pub blocks: bool,
}

/// Run exported towers: embed images with an accepted artifact, answer
/// questions about them, benchmark its buckets; and the host side on its
/// own (preprocessing as the model's processor does, a bucket's inputs).
#[derive(Parser, Debug)]
#[command(name = "ane-run", version)]
pub struct RunCli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: RunCommand,
}

#[derive(Subcommand, Debug)]
pub enum RunCommand {
    /// Preprocess images exactly as the model's image processor does and write
    /// `pixel_values` and `grid_thw` as safetensors.
    Preprocess(PreprocessArgs),
    /// Write the inputs an exported bucket takes for some images (patches,
    /// pos, cos, sin, mask), named as the package's inputs, for `ane-export
    /// exec` or a Core ML caller.
    ///
    /// Example: ane-run host-inputs --artifact out/tiny-vlm --bucket b1024 --image golden/images/wide.jpg --out in.safetensors
    HostInputs(HostInputsArgs),
    /// Embed images with an accepted artifact: per image a safetensors file
    /// (the family's outputs: `embeds` and every `deepstack.{i}`, or an
    /// encoder's `last_hidden_state`, `pooler_output`, `image_embeds`; and
    /// `grid_thw`; pad rows dropped) and a
    /// JSON line on stdout with the bucket and timings. Exit 1 when some
    /// images could not be read (the others are written), 2 when none
    /// could, when nothing could run, or when an error executing or writing
    /// stopped the run. A text encoder's artifact embeds texts instead
    /// (`--text`, `--texts FILE`): per text `text-<i>.safetensors`.
    ///
    /// Example: ane-run embed --artifact out/tiny-vlm golden/images/ --out embeddings/
    Embed(EmbedArgs),
    /// Latency of each bucket of an artifact: a warm-up, then the median and
    /// 90th percentile over timed runs of a synthetic image filling the
    /// bucket (a text encoder's: tokens of a repeated sentence). On a Mac with Core ML: CPU_ONLY, CPU_AND_NE and ALL side by
    /// side, the chip named, and with --energy (root) energy per image.
    ///
    /// Example: ane-run bench --artifact out/tiny-vlm --runs 5 --json
    Bench(BenchArgs),
    /// Answer a question about an image: the artifact's visual tokens (or,
    /// with --tower reference, the fp32 reference tower's) fed to the source
    /// checkpoint's language model (Qwen3-VL's, or Qwen2's for Qwen2-VL and Qwen2.5-VL), decoded greedily. Prints the
    /// answer; --json adds the tokens, bucket and timings.
    ///
    /// Example: ane-run vqa --artifact out/tiny-vlm --image golden/vqa/images/test-0000.png --question "what shape is in the image?"
    Vqa(VqaArgs),
}

/// Which tower makes the visual tokens for `ane-run vqa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VqaTower {
    /// The artifact, as its executor runs it.
    Artifact,
    /// The fp32 reference tower on the source checkpoint, for comparison.
    Reference,
}

#[derive(Args, Debug)]
pub struct VqaArgs {
    /// Artifact directory (its hashes and acceptance are checked first).
    #[arg(long, value_name = "DIR")]
    pub artifact: PathBuf,
    /// The image the question is about.
    #[arg(long, value_name = "IMG")]
    pub image: PathBuf,
    /// The question.
    #[arg(long)]
    pub question: String,
    /// Checkpoint with the language model and tokenizer (default: the source
    /// the manifest records).
    #[arg(long, value_name = "DIR")]
    pub model: Option<String>,
    /// Where the visual tokens come from.
    #[arg(long, value_enum, default_value = "artifact")]
    pub tower: VqaTower,
    /// What runs the artifact (see `embed`).
    #[arg(long, value_enum, default_value = "auto")]
    pub executor: ExecutorKind,
    #[command(flatten)]
    pub coreml: CoreMlArgs,
    /// The interpreter's numeric mode: fp32, fp16 rounding like the Neural
    /// Engine, or ane (fp16 and its measured limits, docs/numerics.md).
    #[arg(long, value_enum, default_value = "fp16")]
    pub precision: Precision,
    /// Tokens generated at most.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Run an artifact the gates did not accept (with a warning).
    #[arg(long)]
    pub allow_unaccepted: bool,
    /// Print JSON: the answer, its tokens, the bucket and timings.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Artifact directory.
    #[arg(long, value_name = "DIR")]
    pub artifact: PathBuf,
    /// Only this bucket (repeatable; default: every bucket).
    #[arg(long, value_name = "NAME")]
    pub bucket: Vec<String>,
    /// Untimed runs first.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Timed runs per bucket.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// What runs the artifact (see `embed`).
    #[arg(long, value_enum, default_value = "auto")]
    pub executor: ExecutorKind,
    #[command(flatten)]
    pub coreml: CoreMlArgs,
    /// The interpreter's numeric mode.
    #[arg(long, value_enum, default_value = "fp32")]
    pub precision: Precision,
    /// Energy per image from `powermetrics` (macOS, root).
    #[arg(long)]
    pub energy: bool,
    /// With `--energy`: seconds of back-to-back runs measured per row.
    #[arg(long, default_value_t = 3.0, value_name = "S")]
    pub energy_seconds: f64,
    /// Benchmark an artifact the gates did not accept.
    #[arg(long)]
    pub allow_unaccepted: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// Artifact directory (its hashes and acceptance are checked first).
    #[arg(long, value_name = "DIR")]
    pub artifact: PathBuf,
    /// Image files, a folder of images, or `-` to read image paths from stdin
    /// (one per line: a frame stream).
    #[arg(required_unless_present_any = ["text", "texts"], value_name = "IMAGE|FOLDER|-")]
    pub inputs: Vec<PathBuf>,
    /// Texts, for a text encoder's artifact: each written to
    /// `text-<i>.safetensors` (its tokens' `last_hidden_state`, `pooler_output`,
    /// `sentence_embedding` where the checkpoint has them, `input_ids`).
    #[arg(long, num_args = 1.., value_name = "TEXT", conflicts_with = "inputs")]
    pub text: Vec<String>,
    /// A UTF-8 file of texts, one per line (empty lines are texts too).
    #[arg(long, value_name = "FILE", conflicts_with = "inputs")]
    pub texts: Option<PathBuf>,
    /// Directory for the per-image safetensors files (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// What runs the artifact: `mil` (the interpreter), `coreml` (Core ML
    /// with CPU_AND_NE; macOS only), `coreai` (the Core AI runtime on the
    /// artifact's .aimodel, built with --format aimodel or both; its CPU on
    /// Linux), `auto` (Core ML on a Mac, else the interpreter; Core AI for an
    /// artifact that ships the .aimodel alone).
    #[arg(long, value_enum, default_value = "auto")]
    pub executor: ExecutorKind,
    #[command(flatten)]
    pub coreml: CoreMlArgs,
    /// The interpreter's numeric mode: fp32, fp16 rounding like the Neural
    /// Engine, or ane (fp16 and its measured limits, docs/numerics.md).
    #[arg(long, value_enum, default_value = "fp32")]
    pub precision: Precision,
    /// Threads decoding and preprocessing the next images while one executes.
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// Do each image's host work and execution in turn (no overlap).
    #[arg(long)]
    pub no_overlap: bool,
    /// Run an artifact the gates did not accept (with a warning).
    #[arg(long)]
    pub allow_unaccepted: bool,
}

#[derive(Args, Debug)]
pub struct HostInputsArgs {
    /// Artifact directory written by `ane-export build`.
    #[arg(long, value_name = "DIR")]
    pub artifact: PathBuf,
    /// Bucket to prepare for (default: the smallest that holds the images).
    #[arg(long, value_name = "NAME")]
    pub bucket: Option<String>,
    /// Image files, run in one call.
    #[arg(long, num_args = 1.., required = true, value_name = "IMG")]
    pub image: Vec<PathBuf>,
    /// Output safetensors file.
    #[arg(long, value_name = "OUT.safetensors")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct PreprocessArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Image files (JPEG, PNG, WebP).
    #[arg(long, num_args = 1.., required = true, value_name = "IMG")]
    pub image: Vec<PathBuf>,
    /// Output safetensors file.
    #[arg(long, value_name = "OUT.safetensors")]
    pub out: PathBuf,
    /// Cap the patch count, as a bucket of this many patches would
    /// (max_pixels = N * patch * patch).
    #[arg(long, value_name = "N")]
    pub max_patches: Option<u64>,
}

impl ExportCli {
    /// Whether the command prints JSON (`--json`): its errors are JSON too.
    pub fn json(&self) -> bool {
        match &self.command {
            ExportCommand::Build(a) => a.json,
            ExportCommand::Inspect(a) => a.json,
            ExportCommand::Gate(a) => a.json,
            _ => false,
        }
    }
}

impl RunCli {
    /// Whether the command prints JSON (`--json`; `embed` always prints JSON
    /// lines): its errors are JSON too.
    pub fn json(&self) -> bool {
        match &self.command {
            RunCommand::Bench(a) => a.json,
            RunCommand::Vqa(a) => a.json,
            RunCommand::Embed(_) => true,
            _ => false,
        }
    }
}

/// Run `ane-export`.
pub fn run_export(cli: ExportCli) -> anyhow::Result<ExitCode> {
    set_quiet(cli.global.quiet);
    let interp = interp_settings();
    match cli.command {
        ExportCommand::Reference(a) => reference_cmd::run(a),
        ExportCommand::Build(a) => build_cmd::run(a),
        ExportCommand::Layout(a) => build_cmd::layout(a),
        ExportCommand::Inspect(a) => package_cmd::inspect(a),
        ExportCommand::Exec(a) => package_cmd::exec(a, interp),
        ExportCommand::Gate(a) => gate_cmd::run(a, interp),
    }
}

/// Run `ane-run`.
pub fn run_run(cli: RunCli) -> anyhow::Result<ExitCode> {
    set_quiet(cli.global.quiet);
    let interp = interp_settings();
    match cli.command {
        RunCommand::Preprocess(a) => preprocess_cmd::run(a),
        RunCommand::HostInputs(a) => preprocess_cmd::host_inputs(a),
        RunCommand::Embed(a) => embed_cmd::run(a, interp),
        RunCommand::Bench(a) => bench_cmd::run(a, interp),
        RunCommand::Vqa(a) => vqa_cmd::run(a, interp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn coreml_limits_are_seconds_and_0_is_none() {
        let a = CoreMlArgs {
            coreml_load_timeout: seconds("0").unwrap(),
            coreml_timeout: seconds("2.5").unwrap(),
        };
        let t = a.timeouts();
        assert_eq!(t.load, None);
        assert_eq!(t.predict, Some(Duration::from_millis(2500)));
        for bad in ["-1", "0.5", "1e-12", "inf", "NaN", "604801", "ten"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds("604800"), Ok(604_800.0));
    }
}
