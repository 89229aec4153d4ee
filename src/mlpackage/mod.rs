//! Reading `.mlpackage` directories: `Manifest.json`, the model protobuf and
//! the weight file, each validated, with errors that say what and where.
//!
//! A package is a directory:
//!
//! ```text
//! X.mlpackage/
//!   Manifest.json                      itemInfoEntries: id -> {name, path, ...}; rootModelIdentifier
//!   Data/com.apple.CoreML/model.mlmodel    the root item: Core ML's protobuf (an ML program)
//!   Data/com.apple.CoreML/weights/weight.bin   blobs referenced by `BlobFileValue`s
//! ```
//!
//! Item paths are relative to `Data/`; absolute paths, `..` and symbolic
//! links are refused. Parsing ([`parse_manifest`], [`program::parse_model`],
//! [`blob`]) is a pure function of bytes; only [`Package::open`] reads files.

pub mod blob;
pub mod program;

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value as Json;

pub use crate::error::{PackageError, PathProblem, ProgramError};
pub use program::{Arg, DType, Function, HostData, Named, Op, Program, TensorType, Value};

use crate::error::{Error, Result};

/// Largest `Manifest.json` and `model.mlmodel` read into memory (the weights are mmapped).
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;
pub const MAX_MODEL_BYTES: u64 = 1 << 30;

/// The items of `Manifest.json`.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// id -> path relative to `Data/`.
    pub items: BTreeMap<String, String>,
    pub root: String,
}

/// Parse and validate `Manifest.json`.
pub fn parse_manifest(bytes: &[u8]) -> std::result::Result<Manifest, PackageError> {
    let v: Json = serde_json::from_slice(bytes).map_err(PackageError::ManifestJson)?;
    let missing = |field: String, expected| PackageError::ManifestField { field, expected };
    let entries = v
        .get("itemInfoEntries")
        .and_then(Json::as_object)
        .ok_or_else(|| missing("itemInfoEntries".into(), "an object"))?;
    let mut items = BTreeMap::new();
    for (id, e) in entries {
        let path = e
            .get("path")
            .and_then(Json::as_str)
            .ok_or_else(|| missing(format!("itemInfoEntries.{id}.path"), "a string"))?;
        check_relative(path).map_err(|problem| PackageError::ItemPath {
            id: id.clone(),
            path: path.to_string(),
            problem,
        })?;
        items.insert(id.clone(), path.to_string());
    }
    let root = v
        .get("rootModelIdentifier")
        .and_then(Json::as_str)
        .ok_or_else(|| missing("rootModelIdentifier".into(), "a string"))?
        .to_string();
    if !items.contains_key(&root) {
        return Err(PackageError::NoRootItem(root));
    }
    Ok(Manifest { items, root })
}

fn check_relative(p: &str) -> std::result::Result<(), PathProblem> {
    let path = Path::new(p);
    if p.is_empty() {
        return Err(PathProblem::Empty);
    }
    for c in path.components() {
        match c {
            Component::Normal(_) => {}
            Component::ParentDir => return Err(PathProblem::LeavesPackage),
            Component::RootDir | Component::Prefix(_) => return Err(PathProblem::Absolute),
            Component::CurDir => {}
        }
    }
    Ok(())
}

/// Refuse any symbolic link on the way from `base` to `base/rel`.
fn resolve_inside(base: &Path, rel: &str) -> std::result::Result<PathBuf, PackageError> {
    let mut cur = base.to_path_buf();
    for c in Path::new(rel).components() {
        if let Component::Normal(part) = c {
            cur.push(part);
            if std::fs::symlink_metadata(&cur).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(PackageError::Symlink(cur));
            }
        }
    }
    Ok(cur)
}

/// Every constant an op carries: its attributes and its inline arguments
/// (iOS18 constexpr ops bind blobs directly to their inputs).
fn op_values(op: &Op) -> impl Iterator<Item = (&str, &Value)> {
    let attrs = op.attributes.iter().map(|(k, v)| (k.as_str(), v));
    let args = op.inputs.iter().flat_map(|(k, args)| {
        args.iter().filter_map(move |a| match a {
            Arg::Const(v) => Some((k.as_str(), v)),
            Arg::Var(_) => None,
        })
    });
    attrs.chain(args)
}

/// A decoded blob's key: weight file, offset, the shape it is viewed as, and
/// whether it was decoded as stored (fp16 kept) rather than widened.
type BlobKey = (String, u64, Vec<usize>, bool);

/// A decoded blob, or the place for it while the first run that wants it decodes it.
type DecodedSlot = std::sync::Arc<std::sync::Mutex<Option<candle_core::Tensor>>>;

/// An opened package: the program and its weight files, mmapped.
pub struct Package {
    pub path: PathBuf,
    pub program: Program,
    /// Weight files by the name programs use (`@model_path/weights/weight.bin`).
    weights: BTreeMap<String, Mmap>,
    /// Weights the interpreter has decoded, by [`BlobKey`] (fp16 conv weights
    /// as stored, everything else widened to f32): kept for the package's
    /// lifetime, so later runs, and other functions sharing the weights, do
    /// not decode again. Each behind a lock of its own, held while it is
    /// decoded: runs at once that want it wait for one decoding.
    decoded: std::sync::Mutex<HashMap<BlobKey, DecodedSlot>>,
}

fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>> {
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    if len > max {
        return Err(Error::package(path, PackageError::TooLarge { len, max }));
    }
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

impl Package {
    /// Open and validate a package directory.
    pub fn open(path: &Path) -> Result<Package> {
        let bad = Error::package;
        if !path.is_dir() {
            return Err(bad(path, PackageError::NotADirectory));
        }
        let mpath = path.join("Manifest.json");
        let manifest = parse_manifest(&read_bounded(&mpath, MAX_MANIFEST_BYTES)?)
            .map_err(|m| bad(&mpath, m))?;
        let data = path.join("Data");
        let model_rel = &manifest.items[&manifest.root];
        let model_path = resolve_inside(&data, model_rel).map_err(|m| bad(&mpath, m))?;
        let bytes = read_bounded(&model_path, MAX_MODEL_BYTES)?;
        let program = program::parse_model(&bytes).map_err(|m| bad(&model_path, m))?;
        let model_dir = model_path.parent().unwrap_or(&data).to_path_buf();

        // Every weight file a program names, mapped once and checked.
        let mut weights = BTreeMap::new();
        for f in program.functions.values() {
            for op in &f.ops {
                for (_, v) in op_values(op) {
                    let Value::Blob { file, .. } = v else {
                        continue;
                    };
                    if weights.contains_key(file) {
                        continue;
                    }
                    let rel = file.strip_prefix("@model_path/").ok_or_else(|| {
                        bad(&model_path, PackageError::WeightFileOutside(file.clone()))
                    })?;
                    check_relative(rel).map_err(|problem| {
                        bad(
                            &model_path,
                            PackageError::WeightFilePath {
                                file: file.clone(),
                                problem,
                            },
                        )
                    })?;
                    let wpath = resolve_inside(&model_dir, rel).map_err(|m| bad(&model_path, m))?;
                    let fh = std::fs::File::open(&wpath).map_err(|e| Error::io(&wpath, e))?;
                    // SAFETY: read-only mapping of a file we do not modify.
                    let mmap = unsafe { Mmap::map(&fh) }.map_err(|e| Error::io(&wpath, e))?;
                    blob::parse_header(&mmap).map_err(|m| bad(&wpath, m))?;
                    weights.insert(file.clone(), mmap);
                }
            }
        }
        let pkg = Package {
            path: path.to_path_buf(),
            program,
            weights,
            decoded: Default::default(),
        };
        pkg.check_blobs().map_err(|m| bad(&model_path, m))?;
        Ok(pkg)
    }

    /// Check every blob reference: inside its file, dtype and size matching the declared type.
    fn check_blobs(&self) -> std::result::Result<(), PackageError> {
        for f in self.program.functions.values() {
            for op in &f.ops {
                for (k, v) in op_values(op) {
                    if let Value::Blob { .. } = v {
                        self.blob(v).map_err(|e| PackageError::OpBlob {
                            function: f.name.clone(),
                            op: op.label().to_string(),
                            kind: op.kind.clone(),
                            key: k.to_string(),
                            error: Box::new(e),
                        })?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The bytes of a blob value, checked against its declared type.
    pub fn blob(&self, v: &Value) -> std::result::Result<blob::Blob<'_>, PackageError> {
        let Value::Blob { ty, file, offset } = v else {
            return Err(PackageError::NotABlob);
        };
        let m = self
            .weights
            .get(file)
            .ok_or_else(|| PackageError::WeightFileNotOpen(file.clone()))?;
        let b = blob::blob_at(m, *offset)?;
        let want = ty.elements() as u64;
        if b.elements() != want {
            return Err(PackageError::BlobSize {
                offset: *offset,
                got: b.elements(),
                blob_dtype: format!("{:?}", b.dtype),
                dtype: format!("{:?}", ty.dtype),
                shape: ty.shape.clone(),
                want,
            });
        }
        Ok(b)
    }

    /// The decoded tensor of a blob value, decoding it with `decode` the first
    /// time; `as_stored` tells apart a blob decoded in its own dtype (fp16
    /// weights the interpreter widens as it multiplies) from one widened to
    /// f32. A run that wants a blob another run is decoding waits for it. A
    /// poisoned lock (a panic elsewhere) only disables the cache. The only
    /// failure is `decode`'s.
    pub fn decoded_blob<E>(
        &self,
        v: &Value,
        as_stored: bool,
        decode: impl FnOnce() -> std::result::Result<candle_core::Tensor, E>,
    ) -> std::result::Result<candle_core::Tensor, E> {
        let Value::Blob { file, offset, ty } = v else {
            return decode();
        };
        // The shape is part of the key: two constants may view one blob differently.
        let key = (file.clone(), *offset, ty.shape.clone(), as_stored);
        let Some(slot) = self
            .decoded
            .lock()
            .ok()
            .map(|mut c| c.entry(key).or_default().clone())
        else {
            return decode();
        };
        let Ok(mut slot) = slot.lock() else {
            return decode();
        };
        if let Some(t) = slot.as_ref() {
            return Ok(t.clone());
        }
        let t = decode()?;
        *slot = Some(t.clone());
        self.release(v);
        Ok(t)
    }

    /// Drop a decoded blob's pages from this process's memory: its decoded
    /// tensor is cached, so the mapped bytes are not read again unless the
    /// cache is bypassed, and then they are read from the file again. On a
    /// 2B tower this keeps the fp16 weights (770 MB) out of the peak
    /// resident memory of `exec` and the gate. Linux only.
    fn release(&self, v: &Value) {
        #[cfg(target_os = "linux")]
        if let Value::Blob { file, .. } = v
            && let (Some(m), Ok(b)) = (self.weights.get(file), self.blob(v))
        {
            let start = b.data.as_ptr() as usize - m.as_ptr() as usize;
            // SAFETY: a read-only mapping of a file this process does not
            // write: MADV_DONTNEED only drops its page-table entries, and
            // the next access reads the same bytes from the file, so every
            // slice into the mapping keeps its contents.
            let _ = unsafe {
                m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, b.data.len())
            };
        }
        #[cfg(not(target_os = "linux"))]
        let _ = v;
    }

    /// Bytes the decoded weights hold in memory (what [`Package::decoded_blob`]
    /// has cached so far).
    pub fn decoded_bytes(&self) -> usize {
        self.decoded.lock().map_or(0, |c| {
            c.values()
                .filter_map(|slot| {
                    let t = slot.try_lock().ok()?;
                    t.as_ref()
                        .map(|t| t.elem_count() * t.dtype().size_in_bytes())
                })
                .sum()
        })
    }

    /// Weight bytes by blob dtype, for reports.
    pub fn weight_bytes(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let mut seen = std::collections::BTreeSet::new();
        for f in self.program.functions.values() {
            for op in &f.ops {
                for (_, v) in op_values(op) {
                    let Value::Blob { file, offset, .. } = v else {
                        continue;
                    };
                    if !seen.insert((file.clone(), *offset)) {
                        continue;
                    }
                    if let Ok(b) = self.blob(v) {
                        *out.entry(format!("{:?}", b.dtype).to_lowercase())
                            .or_insert(0) += b.data.len() as u64;
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_refusals_name_the_field() {
        let m = |json: &str| parse_manifest(json.as_bytes());
        assert!(matches!(m("{"), Err(PackageError::ManifestJson(_))));
        assert!(matches!(
            m("{}"),
            Err(PackageError::ManifestField { field, expected: "an object" }) if field == "itemInfoEntries"
        ));
        let e = m(r#"{"itemInfoEntries": {"a": {}}}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "field `itemInfoEntries.a.path`: missing or not a string"
        );
        for (path, problem) in [
            ("", PathProblem::Empty),
            ("x/../../y", PathProblem::LeavesPackage),
            ("/etc/passwd", PathProblem::Absolute),
        ] {
            let json = format!(
                r#"{{"itemInfoEntries": {{"a": {{"path": "{path}"}}}}, "rootModelIdentifier": "a"}}"#
            );
            let e = m(&json).unwrap_err();
            assert!(
                matches!(&e, PackageError::ItemPath { id, path: p, problem: got }
                    if id == "a" && p == path && *got == problem),
                "{e:?}"
            );
        }
        let e = m(r#"{"itemInfoEntries": {"a": {"path": "m"}}, "rootModelIdentifier": "b"}"#)
            .unwrap_err();
        assert!(
            matches!(&e, PackageError::NoRootItem(r) if r == "b"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "field `rootModelIdentifier`: `b` names no item"
        );
        let ok =
            m(r#"{"itemInfoEntries": {"a": {"path": "m"}}, "rootModelIdentifier": "a"}"#).unwrap();
        assert_eq!((ok.root.as_str(), ok.items["a"].as_str()), ("a", "m"));
    }

    #[test]
    fn a_package_that_is_not_a_directory_is_named() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.mlpackage");
        let e = Package::open(&p).err().unwrap();
        assert!(
            matches!(&e, Error::Package { path, error } if path == &p
                && matches!(**error, PackageError::NotADirectory)),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("{}: not an .mlpackage directory", p.display())
        );
    }
}
