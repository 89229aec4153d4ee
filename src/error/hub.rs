//! The hub's failures: why the Hugging Face hub could not give a
//! repository or one of its files (`checkpoint::hub` raises them).

use std::path::PathBuf;

/// Why the hub could not give a repository or one of its files (the
/// repository or file is named by the [`super::Error::Hub`] holding it).
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// No answer from the hub (DNS, connection, TLS, timeout), and the
    /// revision is not in the cache either. Running again may work.
    #[error("cannot reach the hub at {endpoint} ({cause}), and the revision `{revision}` is not in the cache {}", cache.display())]
    Unreachable {
        endpoint: String,
        cause: String,
        revision: String,
        cache: PathBuf,
    },
    /// 404: no such repository or revision (or a private one, without a token).
    #[error(
        "revision `{revision}` is not on the hub at {endpoint} (404: no such repository or revision; a private one needs HF_TOKEN)"
    )]
    NotFound { revision: String, endpoint: String },
    /// 401 or 403: a token is needed, or the one given may not read it.
    #[error("revision `{revision}`: the hub refused access ({status}); set HF_TOKEN to a token that may read it{}",
        if *token_given { " (the token given was refused)" } else { "" })]
    Refused {
        revision: String,
        status: u16,
        token_given: bool,
    },
    /// Another HTTP status.
    #[error("the hub answered HTTP {status}")]
    Http { status: u16 },
    /// The revision has no `config.json`.
    #[error("revision `{revision}` has no config.json: not a model repository")]
    NotAModel { revision: String },
    /// No safetensors weights; `pickles` lists the pickled ones it has
    /// instead, which are never read.
    #[error("revision `{revision}` {}", if pickles.is_empty() {
        "has neither model.safetensors nor model.safetensors.index.json".to_string()
    } else {
        format!("has only pickled weights ({}): refused, unpickling can execute arbitrary code; \
                 ane-export reads safetensors only", pickles.join(", "))
    })]
    NoSafetensors {
        revision: String,
        pickles: Vec<String>,
    },
    /// The shard index names a file the revision does not have.
    #[error("model.safetensors.index.json names shard `{shard}`, which the revision does not have")]
    MissingShard { shard: String },
    /// A file's download could not start (no answer); running again resumes.
    #[error("download failed: {cause}; run again to resume")]
    DownloadFailed { cause: String },
    /// A download stopped part way; what arrived is kept, and running again
    /// resumes from it.
    #[error("download interrupted after {done} of {size} bytes ({cause}); run again to resume from {}", part.display())]
    Interrupted {
        done: u64,
        size: u64,
        cause: String,
        part: PathBuf,
    },
    /// A finished download does not hash as the hub says; it was deleted.
    #[error(
        "the download is corrupt and was deleted: {got_size} bytes with {check} {got}, \
             the hub's metadata says {size} bytes with {check} {expected}; run again"
    )]
    Corrupt {
        check: &'static str,
        got_size: u64,
        got: String,
        size: u64,
        expected: String,
    },
    /// An answer that makes no sense (malformed JSON, a path outside the
    /// repository, a file listed without its hash, a bad resume).
    #[error("{0}")]
    Protocol(String),
}
