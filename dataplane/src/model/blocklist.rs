//! Client blocklists on request headers (`block-user-agents`, `block-referers`), part of the
//! table's [`super::Settings`].

use serde::{Deserialize, Serialize};

/// One entry of a blocklist, as nginx's `map` reads it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HeaderPattern {
    /// The whole value, compared without regard to case (nginx's `map` lowercases both).
    Exact(String),
    /// A regular expression found anywhere in the value: `~` (case-sensitive) or `~*`
    /// (`caseless`).
    Regex {
        /// The expression, in the `regex` crate's syntax (RE2's).
        pattern: String,
        /// Matched without regard to case (`~*`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        caseless: bool,
    },
}
