//! Offline resolution of a repo id in the local Hugging Face cache.
//!
//! Layout (huggingface_hub): `<cache>/models--<org>--<name>/refs/<revision>`
//! holds a commit hash; `snapshots/<commit>/` holds the files. The cache is
//! `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
//! Nothing is downloaded.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The cache directory huggingface_hub would use.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p).join("hub"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
}

fn valid_part(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Resolve `org/name` at `revision` (a branch, tag or commit hash) to a snapshot directory.
pub fn resolve_cached(repo: &str, revision: &str) -> Result<PathBuf> {
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() != 2 || !parts.iter().all(|p| valid_part(p)) {
        return Err(Error::Invalid(format!(
            "--model `{repo}`: not a directory, and not a repo id of the form `org/name`"
        )));
    }
    if !valid_part(revision) && !revision.split('/').all(valid_part) {
        return Err(Error::Invalid(format!(
            "--revision `{revision}`: not a valid revision name"
        )));
    }
    let cache = cache_dir().ok_or_else(|| {
        Error::Invalid("cannot find the Hugging Face cache: set HF_HUB_CACHE or HF_HOME".into())
    })?;
    resolve_in(&cache, parts[0], parts[1], revision)
}

fn resolve_in(cache: &Path, org: &str, name: &str, revision: &str) -> Result<PathBuf> {
    let repo_dir = cache.join(format!("models--{org}--{name}"));
    if !repo_dir.is_dir() {
        return Err(Error::checkpoint(
            &repo_dir,
            format!(
                "`{org}/{name}` is not a directory and not in the local Hugging Face cache (nothing is downloaded)"
            ),
        ));
    }
    let is_commit = revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit());
    let commit = if is_commit {
        revision.to_string()
    } else {
        let r = repo_dir.join("refs").join(revision);
        let text = std::fs::read_to_string(&r).map_err(|_| {
            Error::checkpoint(
                &r,
                format!("revision `{revision}` of `{org}/{name}` is not in the cache"),
            )
        })?;
        let c = text.trim().to_string();
        if c.len() != 40 || !c.chars().all(|ch| ch.is_ascii_hexdigit()) {
            return Err(Error::checkpoint(
                &r,
                format!("expected a 40-character commit hash, got `{c}`"),
            ));
        }
        c
    };
    let snap = repo_dir.join("snapshots").join(&commit);
    if !snap.is_dir() {
        return Err(Error::checkpoint(
            &snap,
            format!("snapshot {commit} of `{org}/{name}` is not in the cache"),
        ));
    }
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_ref_and_commit() {
        let t = tempfile::tempdir().unwrap();
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let repo = t.path().join("models--Org--Tiny-Model");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
        std::fs::write(repo.join("refs/main"), format!("{commit}\n")).unwrap();
        let got = resolve_in(t.path(), "Org", "Tiny-Model", "main").unwrap();
        assert_eq!(got, repo.join("snapshots").join(commit));
        assert_eq!(
            resolve_in(t.path(), "Org", "Tiny-Model", commit).unwrap(),
            got
        );
        let e = resolve_in(t.path(), "Org", "Tiny-Model", "v2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("revision `v2`"), "{e}");
        let e = resolve_in(t.path(), "Org", "Other", "main")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in the local Hugging Face cache"), "{e}");
    }

    #[test]
    fn rejects_bad_repo_ids() {
        assert!(resolve_cached("../etc", "main").is_err());
        assert!(resolve_cached("a/b/c", "main").is_err());
        assert!(resolve_cached("org/name", "../../x").is_err());
    }
}
