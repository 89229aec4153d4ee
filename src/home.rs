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

pub use crate::error::HomeError;
use crate::error::Result;

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
pub fn golden(rel: &str, flag: &str) -> Result<PathBuf, HomeError> {
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
    Err(HomeError::NotInstalled {
        rel: rel.to_string(),
        flag: flag.to_string(),
        looked: home.map(|h| h.join(rel)),
    })
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

    #[test]
    fn a_default_not_installed_names_where_it_looked_and_the_flag() {
        let e = HomeError::NotInstalled {
            rel: "golden/images".into(),
            flag: "--images DIR".into(),
            looked: Some(PathBuf::from("/h/golden/images")),
        };
        assert_eq!(
            e.to_string(),
            format!(
                "the default golden/images is not installed: looked in /h/golden/images, \
                 ./golden/images; pass --images DIR, install with `make install PREFIX=DIR`, \
                 or set {HOME_VAR}"
            )
        );
        assert!(
            HomeError::NoVenv
                .to_string()
                .ends_with(&format!("(or {HOME_VAR})"))
        );
        match golden("no/such/file", "--x FILE") {
            Err(HomeError::NotInstalled { rel, flag, .. }) => {
                assert_eq!((rel.as_str(), flag.as_str()), ("no/such/file", "--x FILE"))
            }
            other => panic!("{other:?}"),
        }
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
        None => root
            .as_ref()
            .map(|r| r.join(".venv"))
            .ok_or(HomeError::NoVenv)?,
    };
    let lib = venv.join("lib");
    let site = std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.join("coremltools").is_dir())
        .ok_or_else(|| HomeError::NoCoremltools(venv.clone()))?;
    let package_dir = match &root {
        Some(r) => r.join("python"),
        None => venv.parent().map(|p| p.join("python")).unwrap_or_default(),
    };
    if !package_dir.join("ane_export/__init__.py").is_file() {
        return Err(HomeError::NoPackage(package_dir).into());
    }
    Ok(PythonEnv {
        site_packages: site,
        package_dir,
        python: venv.join("bin/python"),
    })
}
