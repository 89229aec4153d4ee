//! Whether the gates accepted an artifact: the verdict the gates record in
//! a manifest and the runtime requires (`artifact::Cleared`). A named value
//! of the ground floor, so that errors can carry it.

/// Whether the gates accepted an artifact.
///
/// Only [`Acceptance::Accepted`] lets `ane-run` (and the runtime)
/// run an artifact without `--allow-unaccepted`: every gate ran and passed,
/// over every bucket, for exactly these bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acceptance {
    /// Gated, every gate ran and passed, for these bytes.
    Accepted,
    /// Never gated.
    NotGated,
    /// Gated and rejected: a gate failed or could not run.
    Rejected,
    /// Gated with these gates skipped on purpose (`--skip`); every gate that
    /// ran passed, but an artifact is accepted only when all of them ran.
    Incomplete { skipped: Vec<String> },
    /// Gated for other bytes: the files changed since.
    Stale,
    /// Built with deliberate defects (`build --fault`, the gates' own
    /// tests; the manifest's `test_faults`): never accepted, whatever the
    /// gates said.
    Faulty { faults: Vec<String> },
}

impl Acceptance {
    /// What the artifact is and what to do, as the runtime's refusal says
    /// it ("the artifact ...").
    pub fn refusal(&self) -> String {
        match self {
            Acceptance::Accepted => "was accepted by the gates".into(),
            Acceptance::NotGated => "has not been gated (run `ane-export gate` on it)".into(),
            Acceptance::Rejected => "was rejected by the gates (see gate/report.json)".into(),
            Acceptance::Stale => "was gated for other files than it now holds".into(),
            Acceptance::Faulty { faults } => format!(
                "was built with deliberate test faults ({}) and is never accepted: build it again without --fault",
                faults.join(", ")
            ),
            Acceptance::Incomplete { skipped } => format!(
                "was gated with the {} gate{} skipped (--skip), so it is not accepted: run `ane-export gate` on it without --skip",
                skipped.join(", "),
                if skipped.len() == 1 { "" } else { "s" }
            ),
        }
    }
}

impl std::fmt::Display for Acceptance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Acceptance::Accepted => f.write_str("accepted"),
            Acceptance::NotGated => f.write_str("not gated"),
            Acceptance::Rejected => f.write_str("rejected by the gates"),
            Acceptance::Incomplete { skipped } => write!(
                f,
                "not accepted: gated with the {} gate{} skipped",
                skipped.join(", "),
                if skipped.len() == 1 { "" } else { "s" }
            ),
            Acceptance::Stale => f.write_str("gated for other files than it now holds"),
            Acceptance::Faulty { faults } => {
                write!(
                    f,
                    "never accepted: built with test faults ({})",
                    faults.join(", ")
                )
            }
        }
    }
}
