//! Where the tool's own files are: the Python venv and the `ane_export`
//! package that `build` drives ([`find_env`]), and the golden sets the gates use by
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

use crate::error::{Error, Result};

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

/// Where the project's Python lives.
#[derive(Clone, Debug)]
pub struct PythonEnv {
    /// `site-packages` of the venv.
    pub site_packages: PathBuf,
    /// The project's `python/` directory (the `ane_export` package).
    pub package_dir: PathBuf,
    /// The venv's interpreter, for work run in a child process (Core ML on a Mac).
    pub python: PathBuf,
}

/// Find the venv and the Python package, or say how to make them.
pub fn find_env() -> Result<PythonEnv> {
    let root = find();
    let venv = match std::env::var_os("ANE_EXPORT_VENV") {
        Some(v) => PathBuf::from(v),
        None => root.as_ref().map(|r| r.join(".venv")).ok_or_else(|| {
            Error::Invalid(format!(
                "no Python venv found: install with `make install PREFIX=DIR`, run `make setup` in \
                 the project, or set ANE_EXPORT_VENV (or {})",
                HOME_VAR
            ))
        })?,
    };
    let lib = venv.join("lib");
    let site = std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.join("coremltools").is_dir())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{}: no coremltools in this venv; run `make setup` to create the project's .venv",
                venv.display()
            ))
        })?;
    let package_dir = match &root {
        Some(r) => r.join("python"),
        None => venv.parent().map(|p| p.join("python")).unwrap_or_default(),
    };
    if !package_dir.join("ane_export/__init__.py").is_file() {
        return Err(Error::Invalid(format!(
            "{}: the ane_export Python package is missing",
            package_dir.display()
        )));
    }
    Ok(PythonEnv {
        site_packages: site,
        package_dir,
        python: venv.join("bin/python"),
    })
}
