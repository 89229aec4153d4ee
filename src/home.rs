//! Where the tool's own files are: the Python venv and the `ane_export`
//! package that `build` drives, and the golden sets the gates use by
//! default (images, questions, labelled images).
//!
//! One layout serves a checkout and an installation alike: a directory
//! holding `python/ane_export/`, `.venv/` and `golden/`. It is, in order:
//! `$ANE_EXPORT_HOME`; `share/ane-export` beside the executable's `bin/`
//! (what `make install PREFIX=...` writes); the checkout the executable was
//! built in (an ancestor of `target/release/`); a checkout holding the
//! working directory. Nothing depends on the directory a command is run
//! from once the binaries are installed.

use std::path::{Path, PathBuf};

/// The environment variable that names the home directory explicitly.
pub const HOME_VAR: &str = "ANE_EXPORT_HOME";

/// Whether `dir` has the layout of a home (the Python package at least).
fn is_home(dir: &Path) -> bool {
    dir.join("python/ane_export/__init__.py").is_file()
}

/// The tool's home, if one is found (see the module's documentation).
pub fn find() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os(HOME_VAR) {
        return Some(PathBuf::from(h));
    }
    let exe = std::env::current_exe()
        .ok()
        .map(|e| e.canonicalize().unwrap_or(e));
    if let Some(exe) = &exe
        && let Some(prefix) = exe.parent().and_then(Path::parent)
    {
        let share = prefix.join("share/ane-export");
        if is_home(&share) {
            return Some(share);
        }
    }
    let checkout = |start: &Path| {
        start
            .ancestors()
            .find(|d| is_home(d) && d.join(".venv").is_dir())
            .map(Path::to_path_buf)
    };
    exe.as_deref()
        .and_then(checkout)
        .or_else(|| std::env::current_dir().ok().and_then(|d| checkout(&d)))
}

/// A default data file or folder of the tool (`rel` under its home, e.g.
/// `golden/images`): the home's when it has it, else `rel` under the
/// working directory; the error names every place looked in and the flag
/// that gives one instead.
pub fn golden(rel: &str, flag: &str) -> Result<PathBuf, String> {
    let home = find();
    if let Some(h) = &home {
        let p = h.join(rel);
        if p.exists() {
            return Ok(p);
        }
    }
    let local = PathBuf::from(rel);
    if local.exists() {
        return Ok(local);
    }
    Err(format!(
        "the default {rel} is not installed: looked in {}./{rel}; pass {flag}, install with \
         `make install PREFIX=DIR`, or set {HOME_VAR}",
        home.map(|h| format!("{}, ", h.join(rel).display()))
            .unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_needs_the_python_package() {
        let d = tempfile::tempdir().unwrap();
        assert!(!is_home(d.path()));
        std::fs::create_dir_all(d.path().join("python/ane_export")).unwrap();
        std::fs::write(d.path().join("python/ane_export/__init__.py"), "").unwrap();
        assert!(is_home(d.path()));
    }
}
