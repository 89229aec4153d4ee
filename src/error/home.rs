//! Why the tool's own files are not found: a default golden set, the venv,
//! the Python package (`home` raises it).

use std::path::PathBuf;

/// Why one of the tool's own files is not found.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    /// A default data file or folder (`rel`, e.g. `golden/images`) is in
    /// neither the home (`looked`, when there is one) nor the working
    /// directory; `flag` gives one instead.
    #[error("the default {rel} is not installed: looked in {}./{rel}; pass {flag}, install with \
             `make install PREFIX=DIR`, or set ANE_EXPORT_HOME",
        looked.as_ref().map(|p| format!("{}, ", p.display())).unwrap_or_default())]
    NotInstalled {
        rel: String,
        flag: String,
        looked: Option<PathBuf>,
    },
    /// No venv: no home, and `ANE_EXPORT_VENV` unset.
    #[error(
        "no Python venv found: install with `make install PREFIX=DIR`, run `make setup` in \
             the project, or set ANE_EXPORT_VENV (or ANE_EXPORT_HOME)"
    )]
    NoVenv,
    /// The venv (its path) has no coremltools.
    #[error("{}: no coremltools in this venv; run `make setup` to create the project's .venv", .0.display())]
    NoCoremltools(PathBuf),
    /// The `ane_export` Python package is not in this directory.
    #[error("{}: the ane_export Python package is missing", .0.display())]
    NoPackage(PathBuf),
}
