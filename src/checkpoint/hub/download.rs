//! Downloading what a snapshot lacks from the hub, into the shared cache.
//!
//! One call of the hub's API (`GET /api/models/<org>/<name>/revision/<rev>?blobs=true`)
//! gives the revision's commit and its files with their sizes and hashes: the
//! sha256 of each LFS file (the weights) and the git blob sha1 of the others.
//! What is fetched, from `/<org>/<name>/resolve/<commit>/<path>`, is only what
//! ane-export reads: `config.json`, `preprocessor_config.json`, the tokenizer
//! files, and the weights, `model.safetensors` or the index
//! `model.safetensors.index.json` and the shards its `weight_map` names. A
//! repository that ships only pickled weights (`*.bin`, `*.pt`, ...) is
//! refused before anything is downloaded.
//!
//! Each file goes to `blobs/<etag>.incomplete`, is hashed as it arrives and
//! renamed into place only if its size and hash are the hub's; a corrupt
//! file is deleted and named in the error. An interrupted download keeps its
//! partial file and the next run resumes it with an HTTP `Range` request. A
//! lock file per blob keeps two processes from writing one blob. When the
//! hub cannot be reached and the cache has the revision, the cache is used
//! with a warning. A revision given as a commit hash whose snapshot already
//! holds its config and weights is used without any request.
//!
//! Checking every hash, the offline mode and the cache layout are this
//! module's own, so it speaks HTTP itself (ureq, with the system's TLS)
//! rather than through a hub client library.

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use sha2::Digest;

use super::{HubError, HubEvent, HubEvents, HubSettings, RepoRef, is_commit_hash, resolve_in};
use crate::error::{Error, Result};

/// Files besides the weights that ane-export reads, when the repo has them.
pub const CONFIG_FILES: &[&str] = &[
    "config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
    "generation_config.json",
];
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";
const PICKLES: &[&str] = &[".bin", ".pt", ".pth", ".ckpt", ".pkl"];

/// One file of a revision as the API lists it.
#[derive(Clone, Debug)]
struct Sibling {
    path: String,
    size: u64,
    /// The name of its blob in the cache: the LFS sha256, else the git blob sha1.
    etag: String,
    check: Check,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    Sha256,
    GitSha1,
}

/// Why a request did not give what was asked.
enum Fetch {
    /// No answer from the server (DNS, connection, TLS, timeout).
    Unreachable(String),
    /// An answer with this status.
    Status(u16),
    /// An answer that makes no sense.
    Bad(String),
}

fn hub_err(what: impl Into<String>, error: HubError) -> Error {
    Error::Hub {
        what: what.into(),
        error: Box::new(error),
    }
}

/// Percent-encode everything but unreserved characters (and `/` if `keep_slash`).
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A repository path that stays inside its snapshot directory.
fn safe_relative(p: &str) -> bool {
    !p.is_empty()
        && Path::new(p)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

struct Hub<'a> {
    s: &'a HubSettings,
    agent: ureq::Agent,
}

impl<'a> Hub<'a> {
    fn new(s: &'a HubSettings) -> Self {
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::NativeTls)
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .user_agent(concat!("ane-export/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Hub { s, agent }
    }

    /// GET `url` (from byte `range_from`); the error is why no answer came.
    fn get(
        &self,
        url: &str,
        range_from: u64,
    ) -> std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.s.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if range_from > 0 {
            req = req.header("Range", format!("bytes={range_from}-"));
        }
        req.call()
    }

    /// The revision's commit and files.
    fn info(&self, r: &RepoRef) -> std::result::Result<(String, Vec<Sibling>), Fetch> {
        let url = format!(
            "{}/api/models/{}/{}/revision/{}?blobs=true",
            self.s.endpoint,
            r.org,
            r.name,
            encode(&r.revision, false)
        );
        let mut resp = self
            .get(&url, 0)
            .map_err(|e| Fetch::Unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(Fetch::Status(status));
        }
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| Fetch::Unreachable(e.to_string()))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Fetch::Bad(format!("the API's answer is not JSON: {e}")))?;
        let commit = v["sha"]
            .as_str()
            .filter(|c| is_commit_hash(c))
            .ok_or_else(|| Fetch::Bad("the API's answer has no 40-character `sha`".into()))?;
        let mut files = Vec::new();
        for s in v["siblings"].as_array().into_iter().flatten() {
            let Some(path) = s["rfilename"].as_str() else {
                continue;
            };
            let (etag, size, check) = match s.get("lfs").filter(|l| l.is_object()) {
                Some(l) => (l["sha256"].as_str(), l["size"].as_u64(), Check::Sha256),
                None => (s["blobId"].as_str(), s["size"].as_u64(), Check::GitSha1),
            };
            let want_len = if check == Check::Sha256 { 64 } else { 40 };
            match (etag, size) {
                (Some(e), Some(n))
                    if e.len() == want_len && e.chars().all(|c| c.is_ascii_hexdigit()) =>
                {
                    files.push(Sibling {
                        path: path.to_string(),
                        size: n,
                        etag: e.to_ascii_lowercase(),
                        check,
                    })
                }
                // Listed without a usable hash: never downloaded (it cannot be checked).
                _ => files.push(Sibling {
                    path: path.to_string(),
                    size: 0,
                    etag: String::new(),
                    check,
                }),
            }
        }
        Ok((commit.to_string(), files))
    }
}

/// Resolve a revision, downloading the files ane-export reads that the cache
/// lacks; see the module docs.
pub fn snapshot(s: &HubSettings, r: &RepoRef, events: &HubEvents) -> Result<PathBuf> {
    let id = r.id();
    // A commit names content that never changes: a cached snapshot with its
    // config and weights needs no request.
    if r.is_commit()
        && let Ok(snap) = resolve_in(&s.cache, r)
        && has_weights(&snap)
    {
        return Ok(snap);
    }
    let hub = Hub::new(s);
    let at = format!("revision `{}`", r.revision);
    let (commit, files) = match hub.info(r) {
        Ok(v) => v,
        Err(Fetch::Unreachable(msg)) => {
            return match resolve_in(&s.cache, r) {
                Ok(snap) => {
                    events.send(HubEvent::Note(format!(
                        "warning: the hub at {} cannot be reached ({msg}); using the cached snapshot {}",
                        s.endpoint,
                        snap.display()
                    )));
                    Ok(snap)
                }
                Err(_) => Err(hub_err(
                    &id,
                    HubError::Unreachable {
                        endpoint: s.endpoint.clone(),
                        cause: msg,
                        revision: r.revision.clone(),
                        cache: s.cache.clone(),
                    },
                )),
            };
        }
        Err(Fetch::Status(404)) => {
            return Err(hub_err(
                &id,
                HubError::NotFound {
                    revision: r.revision.clone(),
                    endpoint: s.endpoint.clone(),
                },
            ));
        }
        Err(Fetch::Status(st @ (401 | 403))) => {
            return Err(hub_err(
                &id,
                HubError::Refused {
                    revision: r.revision.clone(),
                    status: st,
                    token_given: s.token.is_some(),
                },
            ));
        }
        Err(Fetch::Status(st)) => {
            return Err(hub_err(&id, HubError::Http { status: st }));
        }
        Err(Fetch::Bad(msg)) => {
            return Err(hub_err(&id, HubError::Protocol(format!("{at}: {msg}"))));
        }
    };
    let repo_dir = r.dir(&s.cache);
    let snap = repo_dir.join("snapshots").join(&commit);
    let by_path: HashMap<&str, &Sibling> = files.iter().map(|f| (f.path.as_str(), f)).collect();
    if !by_path.contains_key("config.json") {
        return Err(hub_err(
            &id,
            HubError::NotAModel {
                revision: r.revision.clone(),
            },
        ));
    }
    let mut want: Vec<&Sibling> = CONFIG_FILES
        .iter()
        .filter_map(|f| by_path.get(f).copied())
        .collect();
    let index = by_path.get(INDEX).copied();
    if index.is_none() && !by_path.contains_key(SINGLE) {
        let pickles: Vec<&str> = files
            .iter()
            .map(|f| f.path.as_str())
            .filter(|p| PICKLES.iter().any(|s| p.ends_with(s)))
            .collect();
        return Err(hub_err(
            &id,
            HubError::NoSafetensors {
                revision: r.revision.clone(),
                pickles: pickles.iter().map(|p| p.to_string()).collect(),
            },
        ));
    }
    if let Some(ix) = index {
        want.push(ix);
    } else {
        want.push(by_path[SINGLE]);
    }
    let fetcher = Fetcher {
        hub: &hub,
        id: &id,
        repo_dir: &repo_dir,
        snap: &snap,
        commit: &commit,
        events,
    };
    fetcher.announce(&want);
    for f in &want {
        fetcher.ensure(f)?;
    }
    if let Some(ix) = index {
        let shards = shard_names(&snap.join(&ix.path))?;
        let mut listed = Vec::new();
        for name in &shards {
            let f = by_path.get(name.as_str()).ok_or_else(|| {
                hub_err(
                    &id,
                    HubError::MissingShard {
                        shard: name.to_string(),
                    },
                )
            })?;
            listed.push(*f);
        }
        fetcher.announce(&listed);
        for f in listed {
            fetcher.ensure(f)?;
        }
    }
    if !r.is_commit() {
        let f = repo_dir.join("refs").join(&r.revision);
        write_atomic(&f, commit.as_bytes())?;
    }
    Ok(snap)
}

/// Whether a snapshot holds `config.json` and its weights (a single file, or
/// an index with every shard it names).
fn has_weights(snap: &Path) -> bool {
    if !snap.join("config.json").is_file() {
        return false;
    }
    if snap.join(SINGLE).is_file() {
        return true;
    }
    shard_names(&snap.join(INDEX)).is_ok_and(|shards| shards.iter().all(|f| snap.join(f).is_file()))
}

/// The shard files an index's `weight_map` names, each once.
fn shard_names(index: &Path) -> Result<BTreeSet<String>> {
    let v = crate::checkpoint::read_json(index)?;
    let map = v["weight_map"]
        .as_object()
        .ok_or_else(|| Error::config(index, "no `weight_map` object"))?;
    let mut out = BTreeSet::new();
    for (tensor, file) in map {
        let f = file
            .as_str()
            .filter(|f| safe_relative(f) && f.ends_with(".safetensors"));
        let f = f.ok_or_else(|| {
            Error::config(
                index,
                format!("weight_map[`{tensor}`]: expected a relative `.safetensors` file name, got {file}"),
            )
        })?;
        out.insert(f.to_string());
    }
    Ok(out)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tmp = path.with_extension("tmp-ane-export");
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

struct Fetcher<'a> {
    hub: &'a Hub<'a>,
    id: &'a str,
    repo_dir: &'a Path,
    snap: &'a Path,
    commit: &'a str,
    events: &'a HubEvents,
}

/// An exclusive lock on a file, released on drop (the file stays).
struct Lock(#[allow(dead_code)] File);

impl Lock {
    fn take(path: &Path) -> Result<Lock> {
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        // SAFETY: flock on a file descriptor this function owns.
        let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
        if rc != 0 {
            return Err(Error::io(path, std::io::Error::last_os_error()));
        }
        Ok(Lock(f))
    }
}

fn human(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GB", bytes as f64 / 1e9)
    } else if bytes >= 1 << 20 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.1} kB", bytes as f64 / 1e3)
    }
}

impl Fetcher<'_> {
    fn blob(&self, f: &Sibling) -> PathBuf {
        self.repo_dir.join("blobs").join(&f.etag)
    }

    fn missing<'b>(&self, files: &[&'b Sibling]) -> Vec<&'b Sibling> {
        files
            .iter()
            .filter(|f| !self.snap.join(&f.path).exists())
            .copied()
            .collect()
    }

    /// Say on stderr what is about to be downloaded, if anything.
    fn announce(&self, files: &[&Sibling]) {
        let todo = self.missing(files);
        if !todo.is_empty() {
            let bytes: u64 = todo
                .iter()
                .filter(|f| !self.blob(f).exists())
                .map(|f| f.size)
                .sum();
            self.events.send(HubEvent::Note(format!(
                "downloading {} file(s) of {} at {} from {} ({} to fetch) into {}",
                todo.len(),
                self.id,
                &self.commit[..12],
                self.hub.s.endpoint,
                human(bytes),
                self.repo_dir.display()
            )));
        }
    }

    /// Make `snapshots/<commit>/<path>` exist, downloading its blob if needed.
    fn ensure(&self, f: &Sibling) -> Result<()> {
        let what = format!("{}/{}", self.id, f.path);
        if !safe_relative(&f.path) {
            return Err(hub_err(
                &what,
                HubError::Protocol("the hub lists a file path outside the repository".into()),
            ));
        }
        let link = self.snap.join(&f.path);
        if link.exists() {
            return Ok(());
        }
        if f.etag.is_empty() {
            return Err(hub_err(
                &what,
                HubError::Protocol(
                    "the hub's API gives no size and hash for this file, so it cannot be checked"
                        .into(),
                ),
            ));
        }
        let blob = self.blob(f);
        if !blob.exists() {
            let dir = blob.parent().expect("blobs dir");
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            let url = format!(
                "{}/{}/resolve/{}/{}",
                self.hub.s.endpoint,
                self.id,
                self.commit,
                encode(&f.path, true)
            );
            let _lock = Lock::take(&blob.with_extension("lock"))?;
            if !blob.exists() {
                self.download(&url, f, &blob, &what, true)?;
            }
        }
        let parent = link.parent().expect("snapshot dir");
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        let depth = Path::new(&f.path).components().count() + 1;
        let target: PathBuf = std::iter::repeat_n("..", depth)
            .collect::<PathBuf>()
            .join("blobs")
            .join(&f.etag);
        let _ = std::fs::remove_file(&link); // a dangling link from an older run
        std::os::unix::fs::symlink(&target, &link).map_err(|e| Error::io(&link, e))
    }

    /// Fetch one blob into `<blob>.incomplete` (resuming it), check, rename.
    fn download(
        &self,
        url: &str,
        f: &Sibling,
        blob: &Path,
        what: &str,
        may_retry: bool,
    ) -> Result<()> {
        let part = blob.with_extension("incomplete");
        let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        let from = if have > 0 && have < f.size { have } else { 0 };
        let mut resp = self.hub.get(url, from).map_err(|e| {
            hub_err(
                what,
                HubError::DownloadFailed {
                    cause: e.to_string(),
                },
            )
        })?;
        let status = resp.status().as_u16();
        let (mut out, mut done) = match status {
            206 if from > 0 => {
                let start = resp
                    .headers()
                    .get("content-range")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("bytes "))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.parse::<u64>().ok());
                if start != Some(from) {
                    return Err(hub_err(
                        what,
                        HubError::Protocol(format!(
                            "asked to resume at byte {from}, the server sent {start:?}"
                        )),
                    ));
                }
                let o = OpenOptions::new()
                    .append(true)
                    .open(&part)
                    .map_err(|e| Error::io(&part, e))?;
                (o, from)
            }
            200 => (File::create(&part).map_err(|e| Error::io(&part, e))?, 0),
            416 if may_retry => {
                std::fs::remove_file(&part).map_err(|e| Error::io(&part, e))?;
                return self.download(url, f, blob, what, false);
            }
            404 => {
                return Err(hub_err(
                    what,
                    HubError::Protocol("the hub lists this file but answers 404 for it".into()),
                ));
            }
            st => return Err(hub_err(what, HubError::Http { status: st })),
        };
        let bytes = |done| {
            self.events.send(HubEvent::Bytes {
                file: &f.path,
                done,
                total: f.size,
            })
        };
        bytes(done);
        let mut sha256 = sha2::Sha256::new();
        let mut sha1 = sha1::Sha1::new();
        if f.check == Check::GitSha1 {
            sha1.update(format!("blob {}\0", f.size).as_bytes());
        }
        if done > 0 {
            // Hash what the earlier run wrote.
            let mut r = File::open(&part).map_err(|e| Error::io(&part, e))?;
            let mut buf = vec![0u8; 1 << 20];
            let mut left = done;
            while left > 0 {
                let n = r.read(&mut buf).map_err(|e| Error::io(&part, e))?;
                if n == 0 {
                    break;
                }
                let n = n.min(left as usize);
                sha256.update(&buf[..n]);
                sha1.update(&buf[..n]);
                left -= n as u64;
            }
        }
        let mut body = resp.body_mut().with_config().limit(u64::MAX).reader();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let _ = out.flush();
                    self.events.send(HubEvent::Finished {
                        file: &f.path,
                        ok: false,
                    });
                    return Err(hub_err(
                        what,
                        HubError::Interrupted {
                            done,
                            size: f.size,
                            cause: e.to_string(),
                            part: part.clone(),
                        },
                    ));
                }
            };
            if done + n as u64 > f.size {
                break; // more than the hub's size: caught below
            }
            out.write_all(&buf[..n]).map_err(|e| Error::io(&part, e))?;
            if f.check == Check::Sha256 {
                sha256.update(&buf[..n]);
            } else {
                sha1.update(&buf[..n]);
            }
            done += n as u64;
            bytes(done);
        }
        out.sync_all().map_err(|e| Error::io(&part, e))?;
        drop(out);
        self.events.send(HubEvent::Finished {
            file: &f.path,
            ok: true,
        });
        let got = match f.check {
            Check::Sha256 => hex(&sha256.finalize()),
            Check::GitSha1 => hex(&sha1.finalize()),
        };
        if done != f.size || got != f.etag {
            let _ = std::fs::remove_file(&part);
            let kind = if f.check == Check::Sha256 {
                "sha256"
            } else {
                "git sha1"
            };
            return Err(hub_err(
                what,
                HubError::Corrupt {
                    check: kind,
                    got_size: done,
                    got,
                    size: f.size,
                    expected: f.etag.clone(),
                },
            ));
        }
        std::fs::rename(&part, blob).map_err(|e| Error::io(blob, e))
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_revisions_and_paths() {
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("sub dir/a+b.json", true), "sub%20dir/a%2Bb.json");
    }

    #[test]
    fn paths_stay_inside_the_snapshot() {
        assert!(safe_relative("model-00001-of-00002.safetensors"));
        assert!(safe_relative("sub/config.json"));
        assert!(!safe_relative("../x"));
        assert!(!safe_relative("/etc/passwd"));
        assert!(!safe_relative("a/../../b"));
        assert!(!safe_relative(""));
    }

    #[test]
    fn git_blob_sha1_is_gits() {
        // `printf 'hello\n' | git hash-object --stdin`
        let mut h = sha1::Sha1::new();
        h.update(b"blob 6\0hello\n");
        assert_eq!(
            hex(&h.finalize()),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }
}
