//! Why the language model cannot answer: a question it refuses, visual
//! tokens that do not fit it, its tokenizer failing (`lm` raises it).

/// Why the language model cannot answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LmError {
    /// A question of whitespace only.
    #[error("the question is empty")]
    EmptyQuestion,
    /// A question longer than accepted, in characters.
    #[error("the question has {chars} characters; at most {max} are accepted")]
    QuestionChars { chars: usize, max: usize },
    /// A question longer than accepted, in tokens.
    #[error("the question is {tokens} tokens; at most {max} are accepted")]
    QuestionTokens { tokens: usize, max: usize },
    /// Visual tokens of another width or count than the model and grid say.
    #[error(
        "visual tokens [{tokens}, {width}] with grid {grid:?} do not fit this language model (hidden {hidden}, merge {merge})"
    )]
    Features {
        tokens: usize,
        width: usize,
        grid: [usize; 3],
        hidden: usize,
        merge: usize,
    },
    /// Another number of deepstack features than the model takes.
    #[error("{given} deepstack features given, the model takes {want}")]
    Deepstack { given: usize, want: usize },
    /// The tokenizer failed (its message).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}
