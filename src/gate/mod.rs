//! `ane-export gate`: the three release gates, the report, and acceptance.
//!
//! 1. **Residency** ([`residency`]): a static checker over each bucket's
//!    saved ML program predicts which ops run on the Neural Engine (labelled
//!    `predicted`; on a Mac, `MLComputePlan` gives Core ML's own plan,
//!    `coreml-plan`: neither is a measurement of where ops ran).
//! 2. **Cosine** ([`cosine`]): the fp32 reference against the artifact as
//!    executed (the MIL interpreter in fp16 emulation), per bucket and case.
//! 3. **VQA** ([`vqa`]) for a tower with a language model: answers from the
//!    artifact's embeddings against the reference's (`not_run` when the
//!    checkpoint's language model cannot be loaded). **Task** ([`task`])
//!    for an encoder without one (CLIP): linear probes fitted on the
//!    reference's pooled embeddings classify held-out images from both
//!    sides. The third gate that does not suit the family reports
//!    `not_applicable`.
//!
//! The report (`gate/report.json`, schema [`SCHEMA`], and a self-contained
//! `gate/report.html`) is written on every run, and its results are written
//! into `manifest.json` with the digest of the `files` map they were checked
//! against ([`crate::artifact`]): a file changed afterwards makes the artifact
//! unaccepted. The artifact is accepted ([`accepts`]) only when all three
//! gates that apply ran and passed over every bucket: a gate skipped on purpose with
//! `--skip` is recorded, and leaves the artifact unaccepted
//! ([`crate::artifact::Acceptance::Incomplete`]).

pub mod cosine;
pub mod features;
mod jobs;
mod pipeline;
pub mod plan;
pub mod residency;
pub mod task;
pub mod vqa;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::artifact::Artifact;
use crate::buckets::Thresholds;
use crate::error::{Error, Result};
use crate::named::named_enum;

pub use self::pipeline::{GatePlan, Note, Written, run};

/// Identifier of the report format.
pub const SCHEMA: &str = "ane-export-gate-report/1";

named_enum! {
    /// The gates, as `--skip` names them.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum GateName {
        Residency = "residency",
        Cosine = "cosine",
        Vqa = "vqa",
        Task = "task",
    }
}

named_enum! {
    /// What a gate (or a bucket, or a case) came to; serialised by its
    /// name, as the report schema lists them.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Status {
        Pass = "pass",
        Fail = "fail",
        /// The gate could not run (an op the executor lacks, a missing input).
        Error = "error",
        /// Nothing to run it with (no language model, no questions).
        NotRun = "not_run",
        /// Skipped on purpose with `--skip`.
        Skipped = "skipped",
        /// Left to a later step: the VQA or task gate of a partial
        /// (`--bucket`) run, which `--merge` runs over every bucket.
        Deferred = "deferred",
        /// The gate does not suit the family: VQA for an encoder without a
        /// language model, the task gate for a tower without a pooled output.
        NotApplicable = "not_applicable",
    }
}

named_enum! {
    /// Where the residency gate's placements come from.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum PlacementSource {
        /// The static checker ([`residency::predict`]).
        Predicted = "predicted",
        /// `MLComputePlan` on a Mac: the device Core ML prefers for each op and
        /// its estimated cost (not a measurement of where ops ran).
        CoremlPlan = "coreml-plan",
        /// The static rules applied to the Core AI program's ops
        /// ([`residency::coreai`]): a prediction, as Core AI on Linux
        /// places nothing.
        CoreaiPredicted = "coreai-predicted",
    }
}

named_enum! {
    /// The format a report's `gates` judge: the package (the interpreter,
    /// Core ML) or, with `--executor coreai`, the `.aimodel` alone.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum GatedFormat {
        Mlpackage = "mlpackage",
        Aimodel = "aimodel",
    }
}

impl Default for GatedFormat {
    /// Reports written before Core AI gated the package.
    fn default() -> Self {
        GatedFormat::Mlpackage
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub version: String,
}

/// One bucket's residency.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResidencyBucket {
    pub bucket: String,
    pub status: Status,
    pub threshold: f64,
    #[serde(flatten)]
    pub prediction: residency::Prediction,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResidencyGate {
    pub status: Status,
    pub source: PlacementSource,
    pub message: String,
    pub buckets: Vec<ResidencyBucket>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CosineGate {
    pub status: Status,
    pub executor: String,
    pub message: String,
    /// Every op's largest magnitude over the cases against its limit,
    /// smallest margin first, and the norms' input squares
    /// ([`cosine::headroom`]); empty where Core ML ran the artifact and in
    /// older reports.
    #[serde(default)]
    pub headroom: cosine::headroom::Headroom,
    pub cases: Vec<cosine::CaseResult>,
    /// Program constants that differ from the reference's
    /// ([`cosine::constant_mismatches`]), one line each, over every bucket
    /// gated; any fails the gate.
    #[serde(default)]
    pub constants: Vec<String>,
    /// Wall seconds of the gate's two sides: `reference` (every distinct
    /// reference run) and `artifact` (every case executed and compared);
    /// summed over the partial reports of a merge. A case's own `seconds`
    /// overlap when cases ran side by side. Empty in older reports.
    #[serde(default)]
    pub seconds: BTreeMap<String, f64>,
    /// The most cases the artifact side ran at once (one thread each when
    /// more than one; [`cosine::CosineRun::run`]); 0 in older reports.
    #[serde(default)]
    pub side_by_side: usize,
}

/// The whole report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub tool: Tool,
    pub artifact: String,
    /// Digest of the manifest's `files` map the gates ran against.
    pub artifact_digest: String,
    /// The checkpoint the reference was loaded from.
    pub model: String,
    /// Whether that checkpoint's files hash as the manifest's source records.
    pub source_matches: bool,
    pub created_unix: u64,
    pub passed: bool,
    pub accepted: bool,
    /// Buckets this report covers.
    pub buckets: Vec<String>,
    pub skipped: Vec<String>,
    pub thresholds: BTreeMap<String, Thresholds>,
    /// The deliberate defects the artifact was built with (its manifest's
    /// `test_faults`): the gates run as usual, but such an artifact is
    /// never accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub test_faults: Vec<String>,
    pub vqa_thresholds: vqa::VqaThresholds,
    #[serde(default)]
    pub task_thresholds: task::TaskThresholds,
    /// What `gates` judged: the package (reports written before Core AI),
    /// or the `.aimodel` with `--executor coreai`.
    #[serde(default)]
    pub format: GatedFormat,
    pub gates: Gates,
    /// The `.aimodel`'s gates, executed by the Core AI runtime, for an
    /// artifact that ships one gated with another executor; an artifact
    /// with an `.aimodel` is accepted only when these pass too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aimodel: Option<Gates>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Gates {
    pub residency: ResidencyGate,
    pub cosine: CosineGate,
    pub vqa: vqa::VqaGate,
    #[serde(default)]
    pub task: task::TaskGate,
}

impl Gates {
    /// Whether residency and cosine passed and exactly one of the VQA and
    /// task gates applies and passed (the other `not_applicable`).
    pub fn all_pass(&self) -> bool {
        let third = matches!(
            (self.vqa.status, self.task.status),
            (Status::Pass, Status::NotApplicable) | (Status::NotApplicable, Status::Pass)
        );
        self.residency.status == Status::Pass && self.cosine.status == Status::Pass && third
    }

    /// Every gate's status: residency, cosine, VQA, task.
    pub fn statuses(&self) -> [Status; 4] {
        [
            self.residency.status,
            self.cosine.status,
            self.vqa.status,
            self.task.status,
        ]
    }
}

/// Whether a finished report accepts its artifact `art`: it passed, it
/// covers all the artifact's buckets, nothing was skipped, residency and
/// cosine passed, and exactly one of the VQA and task gates applies and
/// passed (the other `not_applicable`), for the package; and for an
/// artifact that ships an `.aimodel` too, the same for the `.aimodel` as
/// the Core AI runtime executed it. A report of `--executor coreai` (the
/// `.aimodel` alone) accepts only an artifact that ships it alone.
pub fn accepts(r: &Report, art: &Artifact) -> bool {
    // The artifact's primary format: the package, or the .aimodel where it
    // ships alone; with both, the .aimodel's gates beside.
    let primary = if art.ships_package() {
        GatedFormat::Mlpackage
    } else {
        GatedFormat::Aimodel
    };
    let aimodel_ok = match (&r.aimodel, art.ships_package() && art.aimodel.is_some()) {
        (_, false) => true,
        (Some(g), true) => g.all_pass(),
        (None, true) => false,
    };
    r.passed
        && r.format == primary
        && r.buckets.len() == art.buckets.len()
        && r.skipped.is_empty()
        && r.test_faults.is_empty()
        && r.gates.all_pass()
        && aimodel_ok
}

/// Process exit code of a report: 0 passed, 1 a gate failed, 2 a gate could
/// not run. A gate that does not apply to the family counts for neither.
/// The `.aimodel`'s gates count as the package's do.
pub fn exit_code(r: &Report) -> u8 {
    let s: Vec<Status> = r
        .gates
        .statuses()
        .into_iter()
        .chain(r.aimodel.iter().flat_map(|g| g.statuses()))
        .collect();
    if s.contains(&Status::Fail) {
        1
    } else if s.iter().all(|s| {
        [
            Status::Pass,
            Status::Skipped,
            Status::Deferred,
            Status::NotApplicable,
        ]
        .contains(s)
    }) {
        0
    } else {
        2
    }
}

/// Status of the residency gate from its buckets.
pub fn residency_status(buckets: &[ResidencyBucket], source: PlacementSource) -> (Status, String) {
    let failed: Vec<String> = buckets
        .iter()
        .filter(|b| b.status != Status::Pass)
        .map(|b| {
            let p = &b.prediction;
            let why = p
                .off_ane
                .first()
                .map(|o| {
                    format!(
                        "op `{}` ({}) off the ANE by {}: {}",
                        o.op, o.kind, o.rule, o.reason
                    )
                })
                .or_else(|| {
                    p.failed_checks()
                        .first()
                        .map(|c| format!("check {} failed: {}", c.id, c.detail))
                })
                .unwrap_or_default();
            format!(
                "{}: {source} fraction {:.4} < {} ({} ops off); {why}",
                b.bucket, p.fraction, b.threshold, p.ops_off_ane
            )
        })
        .collect();
    if buckets.is_empty() {
        (Status::Error, "no buckets".into())
    } else if failed.is_empty() {
        (
            Status::Pass,
            buckets
                .iter()
                .map(|b| format!("{} {:.4}", b.bucket, b.prediction.fraction))
                .collect::<Vec<_>>()
                .join(", ")
                + &format!(" {source} on the ANE"),
        )
    } else {
        (Status::Fail, failed.join("; "))
    }
}

/// Status of the cosine gate from its cases and the program constants that
/// differ from the reference's.
pub fn cosine_status(cases: &[cosine::CaseResult], constants: &[String]) -> (Status, String) {
    let (s, m) = case_status(cases);
    if constants.is_empty() {
        return (s, m);
    }
    (
        Status::Fail,
        format!(
            "{} program constant{} differ{} from the reference's: {}{}; cases: {m}",
            constants.len(),
            if constants.len() == 1 { "" } else { "s" },
            if constants.len() == 1 { "s" } else { "" },
            constants[0],
            if constants.len() > 1 { ", ..." } else { "" }
        ),
    )
}

/// Status of the cosine gate from its cases alone.
fn case_status(cases: &[cosine::CaseResult]) -> (Status, String) {
    let of = |s: Status| cases.iter().filter(|c| c.status == s).collect::<Vec<_>>();
    let (fail, err, pass) = (of(Status::Fail), of(Status::Error), of(Status::Pass));
    let worst = cases
        .iter()
        .filter(|c| !c.outputs.is_empty())
        .flat_map(|c| c.outputs.iter().map(move |o| (c, o)))
        .min_by(|a, b| a.1.min_cos.total_cmp(&b.1.min_cos));
    let worst_txt = worst
        .map(|(c, o)| {
            format!(
                "lowest cosine {:.6} ({} of {} in {})",
                o.min_cos, o.name, c.case, c.bucket
            )
        })
        .unwrap_or_default();
    if !fail.is_empty() {
        let list: Vec<String> = fail
            .iter()
            .take(4)
            .map(|c| format!("{} in {}: {}", c.case, c.bucket, c.message))
            .collect();
        (
            Status::Fail,
            format!(
                "{} of {} cases fail: {}",
                fail.len(),
                cases.len(),
                list.join(" | ")
            ),
        )
    } else if !err.is_empty() {
        (
            Status::Error,
            format!("{} cases could not run: {}", err.len(), err[0].message),
        )
    } else if pass.is_empty() {
        (Status::Error, "no case ran".into())
    } else {
        (
            Status::Pass,
            format!("{} cases pass; {worst_txt}", pass.len()),
        )
    }
}

impl Report {
    /// Set `passed` from the gates.
    pub fn finish(&mut self) {
        self.passed = exit_code(self) == 0;
    }

    /// Write `report.json` and `report.html` into `dir`, atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Invalid(format!("report: {e}")))?;
        crate::tensor_file::write_atomic(&dir.join("report.json"), json.as_bytes())?;
        crate::tensor_file::write_atomic(&dir.join("report.html"), html(self).as_bytes())
    }

    /// The summary the terminal shows.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let g = &self.gates;
        s.push_str(&format!(
            "gate {} ({} buckets: {}) against {}\n",
            self.artifact,
            self.buckets.len(),
            self.buckets.join(", "),
            self.model
        ));
        if !self.source_matches {
            s.push_str("  warning: the checkpoint's files differ from the source the artifact was built from\n");
        }
        if self.format == GatedFormat::Aimodel {
            s.push_str("the .aimodel alone (--executor coreai):\n");
        }
        gates_summary(&mut s, g);
        if let Some(a) = &self.aimodel {
            s.push_str("the .aimodel, executed by the Core AI runtime:\n");
            gates_summary(&mut s, a);
        }
        if !self.skipped.is_empty() {
            s.push_str(&format!(
                "skipped on purpose: {}\n",
                self.skipped.join(", ")
            ));
        }
        let why_not = if self.accepted {
            String::new()
        } else if !self.test_faults.is_empty() {
            format!(
                " (built with test faults {}: never accepted)",
                self.test_faults.join(", ")
            )
        } else if self.passed && !self.skipped.is_empty() {
            format!(
                " (the {} gate{} skipped: acceptance needs every gate that applies)",
                self.skipped.join(", "),
                if self.skipped.len() == 1 {
                    " was"
                } else {
                    "s were"
                }
            )
        } else if self.format == GatedFormat::Aimodel && self.passed {
            // Everything passed and was not accepted: the artifact ships its
            // package too, which these gates did not judge.
            " (--executor coreai gated the .aimodel alone: acceptance needs the package gated too)"
                .to_string()
        } else {
            String::new()
        };
        s.push_str(&format!(
            "result: {}{}{why_not}\n",
            if self.passed { "PASSED" } else { "NOT PASSED" },
            if self.accepted {
                ", artifact accepted"
            } else {
                ", artifact not accepted"
            }
        ));
        s
    }
}

/// The gates' part of the summary.
fn gates_summary(s: &mut String, g: &Gates) {
    s.push_str(&format!(
        "residency ({}): {}: {}\n",
        g.residency.source, g.residency.status, g.residency.message
    ));
    for b in &g.residency.buckets {
        s.push_str(&format!(
            "  {:<8} {:>8.4} >= {:<6} {:>5} ops, {} off the ANE  {}\n",
            b.bucket,
            b.prediction.fraction,
            b.threshold,
            b.prediction.ops,
            b.prediction.ops_off_ane,
            b.status
        ));
    }
    s.push_str(&format!(
        "cosine ({}): {}: {}\n",
        g.cosine.executor, g.cosine.status, g.cosine.message
    ));
    if !g.cosine.cases.is_empty() {
        s.push_str(&format!(
            "  {:<8} {:<28} {:>11}  {:>9} {:>9} {:>9}  {}\n",
            "bucket", "case", "real/bucket", "min cos", "mean cos", "max err", "status"
        ));
    }
    for c in &g.cosine.cases {
        let worst = c
            .outputs
            .iter()
            .min_by(|a, b| a.min_cos.total_cmp(&b.min_cos));
        let (mn, mean, err) = worst.map_or((f64::NAN, f64::NAN, f64::NAN), |o| {
            (
                o.min_cos,
                o.mean_cos,
                c.outputs.iter().map(|o| o.max_abs_err).fold(0.0, f64::max),
            )
        });
        let mut name = c.case.clone();
        if name.len() > 28 {
            name.truncate(27);
            name.push('~');
        }
        s.push_str(&format!(
            "  {:<8} {:<28} {:>5}/{:<5}  {:>9.6} {:>9.6} {:>9.3e}  {}\n",
            c.bucket, name, c.real_patches, c.bucket_patches, mn, mean, err, c.status
        ));
        if c.status != Status::Pass {
            s.push_str(&format!("       {}\n", c.message));
        }
    }
    s.push_str(&format!("vqa: {}: {}\n", g.vqa.status, g.vqa.message));
    s.push_str(&format!("task: {}: {}\n", g.task.status, g.task.message));
    if let Some(rt) = &g.task.retrieval {
        s.push_str(&format!(
        "  retrieval over {} test images (reported, not gated): top-1 agreement {:.1}%, top-5 {:.1}%\n",
        rt.queries,
        rt.top1_agreement * 100.0,
        rt.top5_agreement * 100.0
        ));
    }
}

/// The self-contained HTML report: the template with the report's JSON inside.
pub fn html(r: &Report) -> String {
    const TEMPLATE: &str = include_str!("report_template.html");
    // `<` escaped so that no string in the data can close the script element.
    let json = serde_json::to_string(r)
        .unwrap_or_else(|_| "null".into())
        .replace('<', "\\u003c");
    TEMPLATE.replacen("__REPORT_JSON__", &json, 1)
}

/// The acceptance record written into the manifest: the package's gates
/// at the top level (as before Core AI), the `.aimodel`'s under `aimodel`.
pub fn acceptance_record(r: &Report, report_sha256: &str) -> serde_json::Value {
    let mut record = serde_json::json!({
        "accepted": r.accepted,
        "files_digest": r.artifact_digest,
        "gated_unix": r.created_unix,
        "tool": r.tool,
        "skipped": r.skipped,
        "report": "gate/report.json",
        "report_sha256": report_sha256,
        "format": r.format,
        "thresholds": r.thresholds,
    });
    for (k, v) in gates_record(&r.gates) {
        record[k] = v;
    }
    if let Some(a) = &r.aimodel {
        record["aimodel"] = gates_record(a).into_iter().collect();
    }
    record
}

/// The statuses and figures of one format's gates, by gate.
fn gates_record(g: &Gates) -> Vec<(&'static str, serde_json::Value)> {
    vec![
        (
            "residency",
            serde_json::json!({
                "status": g.residency.status,
                "source": g.residency.source,
                "fraction": g.residency.buckets.iter().map(|b| (b.bucket.clone(), b.prediction.fraction)).collect::<BTreeMap<_, _>>(),
            }),
        ),
        (
            "cosine",
            serde_json::json!({
                "status": g.cosine.status,
                "executor": g.cosine.executor,
                "cases": g.cosine.cases.len(),
                "min_cos": g.cosine.cases.iter().fold(BTreeMap::<String, f64>::new(), |mut m, c| {
                    let v = c.outputs.iter().map(|o| o.min_cos).fold(f64::INFINITY, f64::min);
                    if v.is_finite() {
                        let e = m.entry(c.bucket.clone()).or_insert(v);
                        *e = e.min(v);
                    }
                    m
                }),
            }),
        ),
        (
            "vqa",
            serde_json::json!({
                "status": g.vqa.status,
                "agreement": g.vqa.agreement,
            }),
        ),
        (
            "task",
            serde_json::json!({
                "status": g.task.status,
                "agreement": g.task.agreement,
            }),
        ),
    ]
}

/// Record the report in the manifest when it accepts the artifact; a report
/// that does not accept it clears any earlier acceptance.
pub fn record(art: &mut Artifact, r: &Report, gate_dir: &Path) -> Result<()> {
    let sha = crate::artifact::sha256_file(&gate_dir.join("report.json"))?;
    art.write_gates(acceptance_record(r, &sha))
}

/// Seconds since the epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Partial reports that [`check_parts`] found fit to merge, the only thing
/// [`merge`] takes.
pub struct Parts(Vec<(std::path::PathBuf, Report)>);

/// Check partial reports before they are merged: each of this schema and
/// for exactly these artifact files, no bucket gated twice, none missing.
pub fn check_parts(art: &Artifact, parts: Vec<(std::path::PathBuf, Report)>) -> Result<Parts> {
    let digest = art.digest();
    if parts.is_empty() {
        return Err(Error::Invalid(format!(
            "no partial reports under {} to merge: run `ane-export gate {} --bucket NAME` for each bucket first",
            art.dir.join("gate/partial").display(),
            art.dir.display()
        )));
    }
    let mut covered: BTreeMap<&str, &std::path::Path> = BTreeMap::new();
    for (path, r) in &parts {
        if r.schema != SCHEMA {
            return Err(Error::config(
                path,
                format!("schema `{}`, expected `{SCHEMA}`", r.schema),
            ));
        }
        if r.artifact_digest != digest {
            return Err(Error::config(
                path,
                "was made for other artifact files (digest differs): gate that bucket again",
            ));
        }
        for b in &r.buckets {
            if let Some(prev) = covered.insert(b, path) {
                return Err(Error::config(
                    path,
                    format!("bucket {b} is also gated in {}", prev.display()),
                ));
            }
        }
    }
    let missing: Vec<&str> = art
        .buckets
        .iter()
        .map(|b| b.name.as_str())
        .filter(|b| !covered.contains_key(*b))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Invalid(format!(
            "no partial report gates bucket(s) {}: run `ane-export gate {} --bucket NAME` for each",
            missing.join(", "),
            art.dir.display()
        )));
    }
    Ok(Parts(parts))
}

/// The third gates a merge runs over every bucket, for the package and, for
/// an artifact that ships one, the `.aimodel`.
pub struct ThirdGates {
    pub vqa: vqa::VqaGate,
    pub task: task::TaskGate,
    pub aimodel: Option<(vqa::VqaGate, task::TaskGate)>,
}

/// The residency and cosine gates of one format over every part, and
/// whether each was skipped.
fn merge_gates<'a>(parts: impl Iterator<Item = &'a Gates>) -> (ResidencyGate, CosineGate) {
    let mut res = Vec::new();
    let mut cases = Vec::new();
    let mut constants = Vec::new();
    let mut seconds: BTreeMap<String, f64> = BTreeMap::new();
    let mut side_by_side = 0usize;
    let mut headroom = cosine::headroom::Headroom::default();
    let mut executor = String::new();
    let mut source = PlacementSource::Predicted;
    let mut residency_skipped = false;
    let mut cosine_skipped = false;
    for g in parts {
        res.extend(g.residency.buckets.iter().cloned());
        cases.extend(g.cosine.cases.iter().cloned());
        constants.extend(g.cosine.constants.iter().cloned());
        for (k, v) in &g.cosine.seconds {
            *seconds.entry(k.clone()).or_insert(0.0) += v;
        }
        side_by_side = side_by_side.max(g.cosine.side_by_side);
        headroom = cosine::headroom::merge(headroom, g.cosine.headroom.clone());
        executor = g.cosine.executor.clone();
        source = g.residency.source;
        residency_skipped |= g.residency.status == Status::Skipped;
        cosine_skipped |= g.cosine.status == Status::Skipped;
    }
    let (rs, rm) = if residency_skipped {
        (Status::Skipped, "skipped with --skip residency".to_string())
    } else {
        residency_status(&res, source)
    };
    let (cs, cm) = if cosine_skipped {
        (Status::Skipped, "skipped with --skip cosine".to_string())
    } else {
        cosine_status(&cases, &constants)
    };
    (
        ResidencyGate {
            status: rs,
            source,
            message: rm,
            buckets: res,
        },
        CosineGate {
            status: cs,
            executor,
            message: cm,
            headroom,
            cases,
            constants,
            seconds,
            side_by_side,
        },
    )
}

/// Combine partial reports (one per `--bucket` run) into one report over
/// every bucket of the artifact. The VQA and task gates are given by the
/// caller (they run on the whole artifact, not per bucket). The parts must
/// agree on what they gated: all the package (each with the `.aimodel`'s
/// gates where the artifact ships one), or all the `.aimodel` alone.
pub fn merge(art: &Artifact, Parts(parts): Parts, third: ThirdGates) -> Result<Report> {
    let digest = art.digest();
    let mut thresholds = BTreeMap::new();
    let mut source_matches = true;
    // `check_parts` made `Parts` of at least one report.
    let first = parts[0].1.clone();
    for (path, r) in &parts {
        thresholds.extend(r.thresholds.clone());
        source_matches &= r.source_matches;
        if r.format != first.format || r.aimodel.is_some() != first.aimodel.is_some() {
            return Err(Error::config(
                path,
                "gated another way than the other partial reports (another --executor): gate every bucket with the same one",
            ));
        }
    }
    let (residency, cosine) = merge_gates(parts.iter().map(|(_, r)| &r.gates));
    let aimodel = match (&first.aimodel, third.aimodel) {
        (Some(_), Some((vqa, task))) => {
            let (residency, cosine) =
                merge_gates(parts.iter().filter_map(|(_, r)| r.aimodel.as_ref()));
            Some(Gates {
                residency,
                cosine,
                vqa,
                task,
            })
        }
        _ => None,
    };
    // Residency and cosine come from the parts, VQA from this merge (a
    // partial run defers it): a gate is skipped when its results were.
    let skipped_all: Vec<String> = [
        (GateName::Residency, residency.status == Status::Skipped),
        (GateName::Cosine, cosine.status == Status::Skipped),
        (GateName::Vqa, third.vqa.status == Status::Skipped),
        (GateName::Task, third.task.status == Status::Skipped),
    ]
    .iter()
    .filter(|(_, s)| *s)
    .map(|(g, _)| g.name().to_string())
    .collect();
    let mut r = Report {
        schema: SCHEMA.into(),
        tool: Tool {
            name: "ane-export".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        artifact: art.dir.display().to_string(),
        artifact_digest: digest,
        model: first.model.clone(),
        source_matches,
        created_unix: now_unix(),
        passed: false,
        accepted: false,
        buckets: art.buckets.iter().map(|b| b.name.clone()).collect(),
        skipped: skipped_all,
        thresholds,
        test_faults: art.test_faults(),
        vqa_thresholds: first.vqa_thresholds.clone(),
        task_thresholds: first.task_thresholds.clone(),
        format: first.format,
        gates: Gates {
            residency,
            cosine,
            vqa: third.vqa,
            task: third.task,
        },
        aimodel,
    };
    r.finish();
    r.accepted = accepts(&r, art);
    Ok(r)
}
