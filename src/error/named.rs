//! A name that no value of a named enum has (`named_enum!`'s `FromStr`).

/// A name no value of the enum has; `expected` lists the names it knows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{name}`: expected one of {}", expected.join(", "))]
pub struct UnknownName {
    pub name: String,
    pub expected: Vec<&'static str>,
}
