//! Models by name: a repo id (`org/name`) resolved in the local Hugging Face
//! cache, with what is missing downloaded from the hub.
//!
//! The cache layout is huggingface_hub's, so both tools share one cache:
//! `<cache>/models--<org>--<name>/refs/<revision>` holds a commit hash,
//! `blobs/<etag>` the files' contents (the etag is the sha256 of an LFS file,
//! the git blob sha1 of any other), and `snapshots/<commit>/<path>` relative
//! symlinks into `blobs/`. The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`,
//! else `~/.cache/huggingface/hub`.
//!
//! Settings come from the environment as huggingface_hub reads it:
//! `HF_ENDPOINT` (default `https://huggingface.co`), `HF_TOKEN` (else the
//! token file `$HF_HOME/token`), and `HF_HUB_OFFLINE=1`, which never touches
//! the network and resolves from the cache alone. What is downloaded, and
//! how it is checked, is in [`download`].

pub mod download;

use std::path::{Path, PathBuf};

pub use crate::error::HubError;
use crate::error::{Error, Result};

/// Where and how a repo id is resolved, from the environment.
#[derive(Clone, Debug)]
pub struct HubSettings {
    /// The cache directory huggingface_hub would use.
    pub cache: PathBuf,
    /// The hub's base URL, without a trailing slash.
    pub endpoint: String,
    /// A user access token, sent as `Authorization: Bearer`.
    pub token: Option<String>,
    /// Resolve from the cache only.
    pub offline: bool,
}

/// What the hub reports while it resolves a repository: notes for the user
/// and the bytes of each download. The library does not print; the caller
/// shows them (the CLI: lines on stderr and a progress bar per file).
#[derive(Debug)]
pub enum HubEvent<'a> {
    /// A line for the user: what is about to be downloaded, or a warning
    /// (the hub unreachable, the cached snapshot used instead).
    Note(String),
    /// `done` of the `total` bytes of `file` are here.
    Bytes {
        file: &'a str,
        done: u64,
        total: u64,
    },
    /// The download of `file` ended: complete (`ok`), or stopped by an error.
    Finished { file: &'a str, ok: bool },
}

/// What receives [`HubEvent`]s.
type HubSink = std::sync::Arc<dyn Fn(HubEvent<'_>) + Send + Sync>;

/// Where [`HubEvent`]s go; [`HubEvents::default`] drops them.
#[derive(Clone, Default)]
pub struct HubEvents(Option<HubSink>);

impl HubEvents {
    pub fn new(f: impl Fn(HubEvent<'_>) + Send + Sync + 'static) -> Self {
        HubEvents(Some(std::sync::Arc::new(f)))
    }

    /// Report one event.
    pub fn send(&self, e: HubEvent<'_>) {
        if let Some(f) = &self.0 {
            f(e)
        }
    }
}

impl std::fmt::Debug for HubEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "HubEvents(..)"
        } else {
            "HubEvents(none)"
        })
    }
}

fn env_nonempty(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

/// huggingface_hub's reading of a boolean variable (`1`, `ON`, `YES`, `TRUE`).
fn env_true(key: &str) -> bool {
    env_nonempty(key).is_some_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

fn hf_home() -> Option<PathBuf> {
    env_nonempty("HF_HOME").map(PathBuf::from).or_else(|| {
        env_nonempty("XDG_CACHE_HOME")
            .map(|x| PathBuf::from(x).join("huggingface"))
            .or_else(|| env_nonempty("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface")))
    })
}

/// The cache directory huggingface_hub would use.
pub fn cache_dir() -> Option<PathBuf> {
    env_nonempty("HF_HUB_CACHE")
        .map(PathBuf::from)
        .or_else(|| hf_home().map(|h| h.join("hub")))
}

impl HubSettings {
    /// The settings huggingface_hub would use in this environment.
    pub fn from_env() -> Result<Self> {
        let cache = cache_dir().ok_or_else(|| {
            Error::Invalid("cannot find the Hugging Face cache: set HF_HUB_CACHE or HF_HOME".into())
        })?;
        let endpoint = env_nonempty("HF_ENDPOINT")
            .unwrap_or_else(|| "https://huggingface.co".into())
            .trim_end_matches('/')
            .to_string();
        if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
            return Err(Error::Invalid(format!(
                "HF_ENDPOINT `{endpoint}`: expected an http:// or https:// URL"
            )));
        }
        let token = env_nonempty("HF_TOKEN").or_else(|| {
            let f = hf_home()?.join("token");
            std::fs::read_to_string(f)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        Ok(HubSettings {
            cache,
            endpoint,
            token,
            offline: env_true("HF_HUB_OFFLINE"),
        })
    }
}

fn valid_part(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// A checked repo id and revision.
#[derive(Clone, Debug)]
pub struct RepoRef {
    pub org: String,
    pub name: String,
    /// A branch, a tag, `refs/pr/N` or a 40-character commit hash.
    pub revision: String,
}

impl RepoRef {
    /// Check `org/name` and the revision name (no path traversal possible).
    pub fn parse(repo: &str, revision: &str) -> Result<Self> {
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2 || !parts.iter().all(|p| valid_part(p)) {
            return Err(Error::Invalid(format!(
                "--model `{repo}`: not a directory, and not a repo id of the form `org/name`"
            )));
        }
        if !revision.split('/').all(valid_part) {
            return Err(Error::Invalid(format!(
                "--revision `{revision}`: not a valid revision name"
            )));
        }
        Ok(RepoRef {
            org: parts[0].into(),
            name: parts[1].into(),
            revision: revision.into(),
        })
    }

    /// `org/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.org, self.name)
    }

    /// `models--org--name` under the cache.
    pub fn dir(&self, cache: &Path) -> PathBuf {
        cache.join(format!("models--{}--{}", self.org, self.name))
    }

    /// Whether the revision is a commit hash itself.
    pub fn is_commit(&self) -> bool {
        is_commit_hash(&self.revision)
    }
}

pub(crate) fn is_commit_hash(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// Resolve `org/name` at `revision` to a snapshot directory: from the cache,
/// downloading what is missing unless `HF_HUB_OFFLINE` is set; what happens
/// goes to `events`.
pub fn resolve(repo: &str, revision: &str, events: &HubEvents) -> Result<PathBuf> {
    let r = RepoRef::parse(repo, revision)?;
    let s = HubSettings::from_env()?;
    if s.offline {
        return resolve_in(&s.cache, &r).map_err(|e| match e {
            Error::Checkpoint { path, msg } => Error::Checkpoint {
                path,
                msg: format!("{msg} (HF_HUB_OFFLINE is set: nothing is downloaded)"),
            },
            e => e,
        });
    }
    download::snapshot(&s, &r, events)
}

/// Resolve from the cache alone: the snapshot the revision's ref names.
pub fn resolve_in(cache: &Path, r: &RepoRef) -> Result<PathBuf> {
    let id = r.id();
    let repo_dir = r.dir(cache);
    if !repo_dir.is_dir() {
        return Err(Error::checkpoint(
            &repo_dir,
            format!("`{id}` is not a directory and not in the local Hugging Face cache"),
        ));
    }
    let commit = if r.is_commit() {
        r.revision.clone()
    } else {
        let f = repo_dir.join("refs").join(&r.revision);
        let text = std::fs::read_to_string(&f).map_err(|_| {
            Error::checkpoint(
                &f,
                format!("revision `{}` of `{id}` is not in the cache", r.revision),
            )
        })?;
        let c = text.trim().to_string();
        if !is_commit_hash(&c) {
            return Err(Error::checkpoint(
                &f,
                format!("expected a 40-character commit hash, got `{c}`"),
            ));
        }
        c
    };
    let snap = repo_dir.join("snapshots").join(&commit);
    if !snap.is_dir() {
        return Err(Error::checkpoint(
            &snap,
            format!("snapshot {commit} of `{id}` is not in the cache"),
        ));
    }
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(repo: &str, rev: &str) -> RepoRef {
        RepoRef::parse(repo, rev).unwrap()
    }

    #[test]
    fn resolves_ref_and_commit() {
        let t = tempfile::tempdir().unwrap();
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let repo = t.path().join("models--Org--Tiny-Model");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        std::fs::write(repo.join("refs/main"), format!("{commit}\n")).unwrap();
        let got = resolve_in(t.path(), &r("Org/Tiny-Model", "main")).unwrap();
        assert_eq!(got, repo.join("snapshots").join(commit));
        assert_eq!(
            resolve_in(t.path(), &r("Org/Tiny-Model", commit)).unwrap(),
            got
        );
        let e = resolve_in(t.path(), &r("Org/Tiny-Model", "v2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("revision `v2`"), "{e}");
        let e = resolve_in(t.path(), &r("Org/Other", "main"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in the local Hugging Face cache"), "{e}");
    }

    #[test]
    fn rejects_bad_repo_ids() {
        assert!(RepoRef::parse("../etc", "main").is_err());
        assert!(RepoRef::parse("a/b/c", "main").is_err());
        assert!(RepoRef::parse("org/name", "../../x").is_err());
        assert!(RepoRef::parse("org/name", "refs/pr/1").is_ok());
    }
}
