//! An artifact directory written by `ane-export build`: its `manifest.json`,
//! the hashes that bind the manifest to every file, and acceptance by the
//! gates.
//!
//! `manifest.json` lists the sha256 of every file in the artifact (`files`).
//! [`Artifact::verify`] recomputes them: a missing or changed file is an error
//! naming it. `ane-export gate` writes its results into the manifest's
//! `gates` field together with [`files_digest`] of the `files` map it
//! checked, so acceptance holds only for exactly those bytes. The hashes
//! detect change; they are not a signature: whoever can write the directory
//! can also rewrite the manifest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub use crate::acceptance::Acceptance;
pub use crate::error::ManifestError;
use crate::error::{Error, Result};
use crate::family::{Family, Input, Processor, VisionConfig};
use crate::host::{HostRecipe, HostTables};
use crate::preprocess::ImageProcessorConfig;

/// Version of the artifact format this build writes and reads.
pub const ARTIFACT_FORMAT: u64 = 1;

/// The largest `manifest.json` read.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// One bucket of an artifact.
#[derive(Clone, Debug)]
pub struct BucketEntry {
    pub name: String,
    pub patches: usize,
    /// Package directory, relative to the artifact, and its function that
    /// runs this bucket; `None` in an artifact that ships the `.aimodel`
    /// alone (`build --format aimodel`).
    pub package: Option<String>,
    pub function: Option<String>,
    /// Function of the artifact's `.aimodel` that runs this bucket (named
    /// like the bucket), where it ships one.
    pub aimodel_function: Option<String>,
    /// The function's inputs and outputs as the manifest records them
    /// (name and shape; the package's signature, which the `.aimodel`
    /// shares); empty where a hand-made manifest leaves them out.
    pub inputs: Vec<(String, Vec<usize>)>,
    pub outputs: Vec<(String, Vec<usize>)>,
}

impl BucketEntry {
    /// The package (relative to the artifact) and its function, where the
    /// artifact ships one.
    pub fn package_function(&self) -> Option<(&str, &str)> {
        Some((self.package.as_deref()?, self.function.as_deref()?))
    }
}

/// The `name` and `shape` of each of a manifest bucket's `inputs` or
/// `outputs` (none when the field is missing).
fn features(v: &serde_json::Value) -> Option<Vec<(String, Vec<usize>)>> {
    match v {
        serde_json::Value::Null => Some(vec![]),
        v => v
            .as_array()?
            .iter()
            .map(|f| {
                let shape = f["shape"]
                    .as_array()?
                    .iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect::<Option<Vec<_>>>()?;
                Some((f["name"].as_str()?.to_string(), shape))
            })
            .collect(),
    }
}

/// An opened artifact: the parsed manifest.
#[derive(Clone, Debug)]
pub struct Artifact {
    pub dir: PathBuf,
    /// The manifest as written (kept whole so that rewriting it loses nothing).
    pub manifest: serde_json::Value,
    /// The family the artifact was built for.
    pub family: Family,
    /// Its vision config.
    pub cfg: VisionConfig,
    /// The image processor's settings, or the tokenizer the artifact ships.
    pub pre: Processor,
    /// What the host computes besides the pixels (manifest `host`; absent in
    /// manifests written before it was recorded, which used the config's).
    pub host: HostRecipe,
    pub buckets: Vec<BucketEntry>,
    /// The Core AI program (`<name>.aimodel`, relative to the artifact),
    /// where the manifest's `formats` lists `aimodel`; manifests without
    /// `formats` (written before Core AI) ship the package alone.
    pub aimodel: Option<String>,
    /// sha256 of every file, by path relative to the artifact.
    pub files: BTreeMap<String, String>,
    /// Path of the source checkpoint recorded at build time (absolute in
    /// manifests written since paths became portable).
    pub source_path: Option<PathBuf>,
    /// The same checkpoint relative to the artifact directory
    /// (`source.path_from_artifact`), which survives moving both together.
    pub source_relative: Option<PathBuf>,
}

/// An artifact cleared to run: its files hash as its manifest lists, and
/// the gates accepted exactly these bytes. The runtime takes nothing else
/// ([`crate::runtime::Runtime::load`]), and there are only two ways to get
/// one: [`Cleared::accepted`], which refuses any artifact the gates did not
/// accept, and the visible escape hatch [`Cleared::without_acceptance`]
/// (`--allow-unaccepted`, the gates running what they judge, tests and
/// benchmarks), whose [`Cleared::acceptance`] says what the artifact is.
pub struct Cleared {
    artifact: Artifact,
    acceptance: Acceptance,
}

impl Cleared {
    /// The artifact at `dir`, its files verified, accepted by the gates;
    /// else [`Error::NotAccepted`] saying what it is and what to do.
    pub fn accepted(dir: &Path) -> Result<Cleared> {
        let c = Cleared::without_acceptance(dir)?;
        if c.acceptance != Acceptance::Accepted {
            return Err(Error::NotAccepted {
                manifest: dir.join("manifest.json"),
                acceptance: c.acceptance,
            });
        }
        Ok(c)
    }

    /// The escape hatch: the artifact at `dir`, its files verified, cleared
    /// whatever the gates said (callers should say so when it is not
    /// [`Acceptance::Accepted`]).
    pub fn without_acceptance(dir: &Path) -> Result<Cleared> {
        let artifact = Artifact::open(dir)?;
        artifact.verify()?;
        Ok(Cleared::verified(artifact))
    }

    /// An artifact whose files the caller has just verified (the gates, at
    /// the start of their run), cleared without hashing them again.
    pub(crate) fn verified(artifact: Artifact) -> Cleared {
        let acceptance = artifact.acceptance();
        Cleared {
            artifact,
            acceptance,
        }
    }

    /// The artifact.
    pub fn artifact(&self) -> &Artifact {
        &self.artifact
    }

    /// What the gates said of it (`Accepted` unless cleared through
    /// [`Cleared::without_acceptance`]).
    pub fn acceptance(&self) -> &Acceptance {
        &self.acceptance
    }

    /// The artifact and what the gates said, for the runtime.
    pub(crate) fn into_parts(self) -> (Artifact, Acceptance) {
        (self.artifact, self.acceptance)
    }
}

/// The gates whose statuses an acceptance record holds, in the order they
/// run. Of the last two exactly one applies to a family (VQA with a
/// language model, task without); the other is `not_applicable`.
pub const GATES: [&str; 4] = ["residency", "cosine", "vqa", "task"];

/// Acceptance from the `gates` record of a manifest whose `files` map has
/// digest `digest`. `Accepted` needs the record to say so *and* to show
/// residency and cosine with status `pass`, one of VQA and task `pass` and
/// the other `not_applicable`, and nothing skipped; a record that claims
/// acceptance while it lists a skipped gate, or a gate that did not pass,
/// is not taken at its word. A record without `task` (written before the
/// task gate existed) counts it as `not_applicable`.
pub fn acceptance_of(gates: &serde_json::Value, digest: &str) -> Acceptance {
    if gates.is_null() {
        return Acceptance::NotGated;
    }
    if gates["files_digest"].as_str() != Some(digest) {
        return Acceptance::Stale;
    }
    let status = |g: &str| recorded_status(gates, g);
    let mut skipped: Vec<String> = gates["skipped"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default();
    for g in GATES {
        if status(g) == "skipped" && !skipped.iter().any(|s| s == g) {
            skipped.push(g.to_string());
        }
    }
    let third = matches!(
        (status("vqa"), status("task")),
        ("pass", "not_applicable") | ("not_applicable", "pass")
    );
    let ran_and_passed = status("residency") == "pass" && status("cosine") == "pass" && third;
    if gates["accepted"].as_bool() == Some(true) && skipped.is_empty() && ran_and_passed {
        return Acceptance::Accepted;
    }
    if !skipped.is_empty() && nothing_failed(gates) {
        Acceptance::Incomplete { skipped }
    } else {
        Acceptance::Rejected
    }
}

/// A gate's status in a `gates` record (`""` when missing; a record
/// without `task`, written before the task gate existed, counts it as
/// `not_applicable`).
fn recorded_status<'a>(gates: &'a serde_json::Value, g: &str) -> &'a str {
    match gates[g]["status"].as_str() {
        None if g == "task" && gates.get("task").is_none() => "not_applicable",
        s => s.unwrap_or(""),
    }
}

/// Whether every gate of a `gates` record passed, was skipped or does not
/// apply: none failed or could not run.
fn nothing_failed(gates: &serde_json::Value) -> bool {
    GATES.iter().all(|g| {
        matches!(
            recorded_status(gates, g),
            "pass" | "skipped" | "not_applicable"
        )
    })
}

/// sha256 of a file, hex.
pub fn sha256_file(p: &Path) -> Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(p).map_err(|e| Error::io(p, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(p, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Every regular file under `dir`, as sorted relative paths.
pub fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let p = e.map_err(|e| Error::io(&d, e))?.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap_or(&p).to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// One digest over a `files` map: sha256 of its `path\thash\n` lines in order.
pub fn files_digest(files: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (k, v) in files {
        h.update(k.as_bytes());
        h.update(b"\t");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl Artifact {
    /// Read and check `DIR/manifest.json` (without hashing the files).
    pub fn open(dir: &Path) -> Result<Artifact> {
        let mpath = dir.join("manifest.json");
        if !dir.is_dir() {
            return Err(Error::checkpoint(
                dir,
                "not an artifact directory (expected a directory with manifest.json)",
            ));
        }
        let len = std::fs::metadata(&mpath)
            .map_err(|e| Error::io(&mpath, e))?
            .len();
        if len > MAX_MANIFEST_BYTES {
            return Err(Error::config(&mpath, "larger than 64 MiB"));
        }
        let bytes = std::fs::read(&mpath).map_err(|e| Error::io(&mpath, e))?;
        Artifact::parse(dir, &bytes)
    }

    /// Check the bytes of a manifest for the artifact at `dir`: a pure
    /// function of the bytes (`dir` only names files in errors and results).
    pub fn parse(dir: &Path, bytes: &[u8]) -> Result<Artifact> {
        let mpath = dir.join("manifest.json");
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(Error::config(&mpath, "larger than 64 MiB"));
        }
        let v: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::config(&mpath, format!("invalid JSON: {e}")))?;
        let manifest = |error| Error::Manifest {
            path: mpath.clone(),
            error,
        };
        let bad = |f: &str| manifest(ManifestError::Malformed(f.to_string()));
        let format = v["artifact_format"]
            .as_u64()
            .ok_or_else(|| bad("artifact_format"))?;
        if format > ARTIFACT_FORMAT {
            return Err(Error::config(
                &mpath,
                format!(
                    "artifact format {format} was written by a newer ane-export ({}); this is {} and reads format {ARTIFACT_FORMAT}",
                    v["tool"]["version"].as_str().unwrap_or("unknown version"),
                    env!("CARGO_PKG_VERSION")
                ),
            ));
        }
        let family = v["family"]
            .as_str()
            .and_then(Family::from_name)
            .ok_or_else(|| {
                Error::config(
                    &mpath,
                    format!(
                        "field `family`: {}; this version runs artifacts of {}",
                        v["family"],
                        crate::family::REGISTRY
                            .iter()
                            .map(|e| e.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
        let cfg = family
            .manifest_config(&v["config"])
            .map_err(|e| Error::field(&mpath, e))?;
        let pre = match cfg.input() {
            Input::Pixels(px) => {
                Processor::Image(preprocessing(&v["preprocessing"], px).map_err(manifest)?)
            }
            Input::Tokens(_) => {
                let rel = v["preprocessing"]["tokenizer"]
                    .as_str()
                    .ok_or_else(|| bad("preprocessing.tokenizer"))?;
                check_relative(rel).map_err(manifest)?;
                Processor::Text(Box::new(crate::preprocess::TextProcessor::open(
                    &dir.join(rel),
                )?))
            }
        };
        let host = if v["host"].is_null() {
            cfg.host_recipe()
        } else {
            let h: HostRecipe =
                serde_json::from_value(v["host"].clone()).map_err(|_| bad("host"))?;
            h.validate()
                .map_err(|m| Error::config(&mpath, m.to_string()))?;
            h
        };
        let buckets = v["buckets"]
            .as_array()
            .ok_or_else(|| bad("buckets"))?
            .iter()
            .map(|b| {
                let text = |k: &str| match &b[k] {
                    serde_json::Value::Null => Some(None),
                    f => f.as_str().map(|s| Some(s.to_string())),
                };
                Some(BucketEntry {
                    name: b["name"].as_str()?.to_string(),
                    // Slots: a text encoder's bucket records them as `tokens`.
                    patches: usize::try_from(b["patches"].as_u64().or(b["tokens"].as_u64())?)
                        .ok()?,
                    package: text("package")?,
                    function: text("function")?,
                    aimodel_function: text("aimodel_function")?,
                    inputs: features(&b["inputs"])?,
                    outputs: features(&b["outputs"])?,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("buckets"))?;
        if buckets.is_empty() {
            return Err(bad("buckets"));
        }
        for b in &buckets {
            if b.patches > crate::buckets::MAX_PATCHES as usize
                || cfg.check_bucket(b.patches).is_err()
            {
                return Err(bad("buckets[].patches"));
            }
            if let Some(p) = &b.package {
                check_relative(p).map_err(manifest)?;
            }
        }
        let aimodel = aimodel_entry(&v, &buckets).map_err(manifest)?;
        let files: BTreeMap<String, String> =
            serde_json::from_value(v["files"].clone()).map_err(|_| bad("files"))?;
        for k in files.keys() {
            check_relative(k).map_err(manifest)?;
        }
        // The tokenizer is part of what the gates judge: hashed with the rest.
        if let Some(rel) = v["preprocessing"]["tokenizer"].as_str()
            && matches!(pre, Processor::Text(_))
            && !files.contains_key(rel)
        {
            return Err(bad("preprocessing.tokenizer (not in files)"));
        }
        let source_path = v["source"]["path"].as_str().map(PathBuf::from);
        let source_relative = v["source"]["path_from_artifact"]
            .as_str()
            .map(PathBuf::from);
        Ok(Artifact {
            dir: dir.to_path_buf(),
            manifest: v,
            family,
            cfg,
            pre,
            host,
            buckets,
            aimodel,
            files,
            source_path,
            source_relative,
        })
    }

    /// The image processor, or the error that this is a text encoder.
    pub fn image_processor(&self) -> Result<&ImageProcessorConfig> {
        self.cfg.pixels()?;
        match &self.pre {
            Processor::Image(p) => Ok(p),
            Processor::Text(_) => Err(Error::Invalid("no image processor".into())),
        }
    }

    /// The tokenizer, or the error that this is an image tower.
    pub fn text_processor(&self) -> Result<&crate::preprocess::TextProcessor> {
        self.cfg.tokens()?;
        match &self.pre {
            Processor::Text(p) => Ok(p),
            Processor::Image(_) => Err(Error::Invalid("no tokenizer".into())),
        }
    }

    /// Recompute the sha256 of every file the manifest lists; the first
    /// missing or changed file is an error naming it. Files under `gate/`
    /// (reports) are not part of the artifact and are not listed.
    pub fn verify(&self) -> Result<()> {
        for (rel, want) in &self.files {
            let p = self.dir.join(rel);
            let got = sha256_file(&p)?;
            if &got != want {
                return Err(Error::Modified {
                    path: p,
                    got,
                    want: want.clone(),
                });
            }
        }
        Ok(())
    }

    /// The digest of this manifest's `files` map.
    pub fn digest(&self) -> String {
        files_digest(&self.files)
    }

    /// Acceptance recorded in the manifest, judged against its current `files`
    /// (call [`Artifact::verify`] first to bind those to the bytes on disk).
    ///
    /// An artifact built with test faults is [`Acceptance::Faulty`], never
    /// accepted, unless its gates caught the fault (a gate that did not
    /// pass, for these bytes): then it is `Rejected`, as their record says.
    pub fn acceptance(&self) -> Acceptance {
        let gates = &self.manifest["gates"];
        let mut verdict = acceptance_of(gates, &self.digest());
        // The record's gates must have judged the artifact's primary
        // format (the package, or the .aimodel where it ships alone), and,
        // for an artifact with both, the .aimodel's gates passed too.
        let primary = if self.ships_package() {
            "mlpackage"
        } else {
            "aimodel"
        };
        let both = self.ships_package() && self.aimodel.is_some();
        if verdict == Acceptance::Accepted
            && !(gates["format"].as_str().unwrap_or("mlpackage") == primary
                && (!both
                    || ["residency", "cosine"]
                        .iter()
                        .all(|g| recorded_status(&gates["aimodel"], g) == "pass")
                        && matches!(
                            (
                                recorded_status(&gates["aimodel"], "vqa"),
                                recorded_status(&gates["aimodel"], "task")
                            ),
                            ("pass", "not_applicable") | ("not_applicable", "pass")
                        )))
        {
            verdict = Acceptance::Rejected;
        }
        let faults = self.test_faults();
        if faults.is_empty() || (verdict == Acceptance::Rejected && !nothing_failed(gates)) {
            return verdict;
        }
        Acceptance::Faulty { faults }
    }

    /// The deliberate defects the artifact was built with (the manifest's
    /// `test_faults`; empty for a real build). A manifest whose
    /// `test_faults` is not a list of names counts as faulty too.
    pub fn test_faults(&self) -> Vec<String> {
        match &self.manifest["test_faults"] {
            serde_json::Value::Null => vec![],
            serde_json::Value::Array(a) if a.is_empty() => vec![],
            serde_json::Value::Array(a) => a
                .iter()
                .map(|f| f.as_str().unwrap_or("?").to_string())
                .collect(),
            other => vec![other.to_string()],
        }
    }

    /// The source checkpoint's directory: the path recorded relative to the
    /// artifact when it is there (the two moved together), else the path
    /// recorded (absolute; relative to the working directory in manifests
    /// written before). The error names every place looked in.
    pub fn source_dir(&self) -> Result<PathBuf> {
        let mut tried = Vec::new();
        for p in [
            self.source_relative.as_ref().map(|r| self.dir.join(r)),
            self.source_path.clone(),
        ]
        .into_iter()
        .flatten()
        {
            if p.is_dir() {
                // Named without the `..`s of the relative path.
                return Ok(p.canonicalize().unwrap_or(p));
            }
            tried.push(p.display().to_string());
        }
        let m = self.dir.join("manifest.json");
        Err(if tried.is_empty() {
            Error::config(&m, "records no source checkpoint; pass --model")
        } else {
            Error::config(
                &m,
                format!(
                    "the source checkpoint it records is not here (looked for {}); pass --model",
                    tried.join(" and ")
                ),
            )
        })
    }

    /// Path of a bucket's package, where the artifact ships one.
    pub fn package_path(&self, b: &BucketEntry) -> Option<PathBuf> {
        b.package.as_ref().map(|p| self.dir.join(p))
    }

    /// Whether the artifact ships its package (every manifest but one of
    /// `build --format aimodel`).
    pub fn ships_package(&self) -> bool {
        self.buckets.iter().all(|b| b.package_function().is_some())
    }

    /// Path of the Core AI program, where the artifact ships one.
    pub fn aimodel_path(&self) -> Option<PathBuf> {
        self.aimodel.as_ref().map(|a| self.dir.join(a))
    }

    /// The bucket named `name`.
    pub fn bucket(&self, name: &str) -> Result<&BucketEntry> {
        self.buckets
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| Error::UnknownBucket {
                name: name.to_string(),
                known: self.buckets.iter().map(|b| b.name.clone()).collect(),
            })
    }

    /// The tables the host needs (`host.safetensors`), each checked against
    /// the shape the family's config gives it.
    pub fn host_tables(&self) -> Result<HostTables> {
        let p = self.dir.join("host.safetensors");
        let bytes = std::fs::read(&p).map_err(|e| Error::io(&p, e))?;
        let mut tables = HostTables::default();
        for (name, shape) in self.cfg.host_table_shapes() {
            let t = crate::tensor_file::read_tensor(&bytes, &p, &name)?;
            let want: usize = shape.iter().product();
            match t.f32 {
                Some(v) if v.len() == want => tables.insert(name, v),
                _ => {
                    return Err(Error::tensor(&p, &name, format!("expected f32 {shape:?}")));
                }
            }
        }
        Ok(tables)
    }

    /// Rewrite `manifest.json` with `gates` set, atomically.
    pub fn write_gates(&mut self, gates: serde_json::Value) -> Result<()> {
        self.manifest["gates"] = gates;
        let text = serde_json::to_string_pretty(&self.manifest)
            .map_err(|e| Error::Invalid(format!("manifest: {e}")))?;
        crate::tensor_file::write_atomic(&self.dir.join("manifest.json"), text.as_bytes())
    }
}

/// The manifest's Core AI program: `None` unless `formats` lists
/// `aimodel` (a manifest without `formats` ships the package alone); then
/// `aimodel` must name it and every bucket its `aimodel_function`. Where
/// `formats` lists `mlpackage`, every bucket names its `package` and
/// `function`; where it does not, none does.
fn aimodel_entry(
    v: &serde_json::Value,
    buckets: &[BucketEntry],
) -> std::result::Result<Option<String>, ManifestError> {
    let bad = |f: &str| ManifestError::Malformed(f.to_string());
    let formats: Vec<&str> = match &v["formats"] {
        serde_json::Value::Null => vec!["mlpackage"],
        f => f
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_str()).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad("formats"))?,
    };
    if formats.is_empty()
        || formats
            .iter()
            .any(|f| !matches!(*f, "mlpackage" | "aimodel"))
    {
        return Err(bad("formats"));
    }
    let package = formats.contains(&"mlpackage");
    if buckets
        .iter()
        .any(|b| b.package.is_some() != package || b.function.is_some() != package)
    {
        return Err(bad("buckets[].package"));
    }
    if !formats.contains(&"aimodel") {
        return Ok(None);
    }
    let name = v["aimodel"].as_str().ok_or_else(|| bad("aimodel"))?;
    check_relative(name)?;
    if buckets.iter().any(|b| b.aimodel_function.is_none()) {
        return Err(bad("buckets[].aimodel_function"));
    }
    Ok(Some(name.to_string()))
}

/// `to` relative to the directory `from` (both absolute, without `.` or
/// `..`): `..` for each component of `from` past their common prefix, then
/// the rest of `to`. `None` when they share no root.
pub fn relative_path(from: &Path, to: &Path) -> Option<PathBuf> {
    use std::path::Component;
    if !from.is_absolute() || !to.is_absolute() {
        return None;
    }
    let (f, t): (Vec<Component>, Vec<Component>) =
        (from.components().collect(), to.components().collect());
    if f.iter()
        .chain(&t)
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return None;
    }
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    Some(if out.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        out
    })
}

/// A relative path inside the artifact: no absolute paths, no `..`.
fn check_relative(p: &str) -> std::result::Result<(), ManifestError> {
    let path = Path::new(p);
    if p.is_empty()
        || path.is_absolute()
        || path
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(ManifestError::Escapes(p.to_string()));
    }
    Ok(())
}

/// The preprocessing recorded in a manifest; the error names the field.
fn preprocessing(
    pp: &serde_json::Value,
    px: &dyn crate::family::Pixels,
) -> std::result::Result<ImageProcessorConfig, ManifestError> {
    let mut pre = px.default_preprocessor();
    let f = |k: &str| ManifestError::Malformed(format!("preprocessing.{k}"));
    pre.min_pixels = pp["min_pixels"].as_u64().ok_or_else(|| f("min_pixels"))?;
    pre.max_pixels = pp["max_pixels"].as_u64().ok_or_else(|| f("max_pixels"))?;
    for c in 0..3 {
        pre.image_mean[c] = pp["image_mean"][c]
            .as_f64()
            .ok_or_else(|| f("image_mean"))? as f32;
        pre.image_std[c] = pp["image_std"][c].as_f64().ok_or_else(|| f("image_std"))? as f32;
    }
    pre.rescale_factor = pp["rescale_factor"]
        .as_f64()
        .ok_or_else(|| f("rescale_factor"))?;
    pre.kernel = serde_json::from_value(pp["kernel"].clone()).map_err(|_| f("kernel"))?;
    if pre.fixed.is_some() {
        let fixed: crate::preprocess::FixedResize =
            serde_json::from_value(pp["fixed"].clone()).map_err(|_| f("fixed"))?;
        fixed.validate().map_err(ManifestError::Fixed)?;
        pre.fixed = Some(fixed);
    }
    if pre.max_num_patches.is_some() {
        let n = pp["max_num_patches"]
            .as_u64()
            .filter(|&n| n > 0)
            .ok_or_else(|| f("max_num_patches"))?;
        pre.max_num_patches = Some(n as usize);
    }
    // Written only when not bicubic (so older manifests read as they were written).
    pre.filter = match pp.get("filter") {
        Some(r) => serde_json::from_value(r.clone()).map_err(|_| f("filter"))?,
        None => crate::preprocess::Filter::Bicubic,
    };
    for k in ["do_resize", "do_rescale", "do_normalize"] {
        if pp[k].as_bool() == Some(false) {
            return Err(ManifestError::Unsupported(format!("preprocessing.{k}")));
        }
    }
    if pre.image_std.iter().any(|&s| !(s.is_finite() && s > 0.0)) || pre.min_pixels > pre.max_pixels
    {
        return Err(f("image_std / min_pixels"));
    }
    Ok(pre)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A gates record as `ane-export gate` writes it: each gate's status,
    /// the gates skipped, and `accepted` as the gate decided it.
    fn record(status: [&str; 3], skipped: &[&str], accepted: bool) -> serde_json::Value {
        json!({
            "accepted": accepted,
            "files_digest": "d",
            "skipped": skipped,
            "residency": {"status": status[0]},
            "cosine": {"status": status[1]},
            "vqa": {"status": status[2]},
        })
    }

    #[test]
    fn relative_paths_climb_to_the_common_prefix() {
        let rel = |a: &str, b: &str| relative_path(Path::new(a), Path::new(b));
        assert_eq!(
            rel("/w/out/art", "/w/models/m"),
            Some(PathBuf::from("../../models/m"))
        );
        assert_eq!(rel("/w/art", "/w/art/m"), Some(PathBuf::from("m")));
        assert_eq!(rel("/w/art", "/w/art"), Some(PathBuf::from(".")));
        assert_eq!(rel("/a", "/b/c"), Some(PathBuf::from("../b/c")));
        // Not absolute, or with `..` left in: no answer rather than a wrong one.
        assert_eq!(rel("w/art", "/w/m"), None);
        assert_eq!(rel("/w/../art", "/w/m"), None);
        // Joined back, it names the target.
        let (from, to) = (Path::new("/x/y/art"), Path::new("/x/z/m"));
        let joined = from.join(relative_path(from, to).unwrap());
        assert_eq!(joined, Path::new("/x/y/art/../../z/m"));
    }

    #[test]
    fn every_combination_of_skipped_gates_is_not_accepted() {
        for mask in 0u8..8 {
            let skipped: Vec<&str> = GATES
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, g)| *g)
                .collect();
            let st = |i: usize| {
                if mask & (1 << i) != 0 {
                    "skipped"
                } else {
                    "pass"
                }
            };
            let status = [st(0), st(1), st(2)];
            // Even a record that claims acceptance is not taken at its word.
            for claimed in [false, true] {
                let got = acceptance_of(&record(status, &skipped, claimed), "d");
                if skipped.is_empty() {
                    let want = if claimed {
                        Acceptance::Accepted
                    } else {
                        Acceptance::Rejected
                    };
                    assert_eq!(got, want, "nothing skipped, claimed {claimed}");
                } else {
                    assert_eq!(
                        got,
                        Acceptance::Incomplete {
                            skipped: skipped.iter().map(|s| s.to_string()).collect()
                        },
                        "skipped {skipped:?}, claimed {claimed}"
                    );
                }
            }
            // A gate that ran and failed (or could not run) rejects, skips or not.
            for bad in ["fail", "error", "not_run"] {
                for i in 0..3 {
                    if mask & (1 << i) != 0 {
                        continue;
                    }
                    let mut s = status;
                    s[i] = bad;
                    assert_eq!(
                        acceptance_of(&record(s, &skipped, true), "d"),
                        Acceptance::Rejected,
                        "{} {bad}, skipped {skipped:?}",
                        GATES[i]
                    );
                }
            }
        }
    }

    #[test]
    fn a_gate_marked_skipped_counts_even_when_the_list_omits_it() {
        let got = acceptance_of(&record(["pass", "pass", "skipped"], &[], true), "d");
        assert_eq!(
            got,
            Acceptance::Incomplete {
                skipped: vec!["vqa".into()]
            }
        );
        assert_eq!(
            got.to_string(),
            "not accepted: gated with the vqa gate skipped"
        );
        // A record missing a gate's status is not an acceptance either.
        let mut r = record(["pass", "pass", "pass"], &[], true);
        r["cosine"] = serde_json::Value::Null;
        assert_eq!(acceptance_of(&r, "d"), Acceptance::Rejected);
    }

    #[test]
    fn exactly_one_of_vqa_and_task_applies() {
        let with_task = |vqa: &str, task: &str| {
            let mut r = record(["pass", "pass", vqa], &[], true);
            r["task"] = json!({"status": task});
            acceptance_of(&r, "d")
        };
        // An encoder: VQA does not apply, the task gate passed.
        assert_eq!(with_task("not_applicable", "pass"), Acceptance::Accepted);
        // A VLM gated after the task gate existed.
        assert_eq!(with_task("pass", "not_applicable"), Acceptance::Accepted);
        // Neither third gate passed, or both claim to apply: not accepted.
        for (v, t) in [
            ("not_applicable", "not_applicable"),
            ("not_applicable", "fail"),
            ("not_applicable", "not_run"),
            ("pass", "pass"),
            ("fail", "not_applicable"),
        ] {
            assert_eq!(with_task(v, t), Acceptance::Rejected, "vqa {v}, task {t}");
        }
        assert_eq!(
            with_task("not_applicable", "skipped"),
            Acceptance::Incomplete {
                skipped: vec!["task".into()]
            }
        );
    }

    #[test]
    fn acceptance_holds_only_for_the_digest_it_was_recorded_for() {
        let r = record(["pass", "pass", "pass"], &[], true);
        assert_eq!(acceptance_of(&r, "d"), Acceptance::Accepted);
        assert_eq!(acceptance_of(&r, "other"), Acceptance::Stale);
        assert_eq!(
            acceptance_of(&serde_json::Value::Null, "d"),
            Acceptance::NotGated
        );
    }

    #[test]
    fn manifest_failures_name_the_field_or_path() {
        assert_eq!(
            check_relative("../x"),
            Err(ManifestError::Escapes("../x".into()))
        );
        assert_eq!(
            check_relative("/x").unwrap_err().to_string(),
            "path `/x` must be relative and stay inside the artifact"
        );
        assert!(check_relative("b1024.mlpackage").is_ok());
        let e = Artifact::parse(Path::new("art"), b"{}").unwrap_err();
        assert!(
            matches!(&e, Error::Manifest { error: ManifestError::Malformed(f), .. } if f == "artifact_format"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "art/manifest.json: field `artifact_format`: missing or malformed"
        );
    }
}
