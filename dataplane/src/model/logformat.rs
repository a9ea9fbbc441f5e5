//! The access log's `log-format-upstream` fields: templates of the nginx-variables language
//! ([`crate::vars`]) in its access-log dialect, parsed once when the table is built (translation
//! rejects unknown names), written back as `${name}`, and rendered per request by the proxy.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::vars::{Dialect, Problem};
pub use crate::vars::{Part, Var};

impl Var {
    /// The variable the access log knows by `name` (without `$`), if any.
    pub fn parse(name: &str) -> Option<Var> {
        Dialect::AccessLog.lookup(name).ok()
    }
}

// === impl Template ===

/// Text with `$name` or `${name}` variables, as in an nginx `log_format`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Template(crate::vars::Template);

/// A template naming variables weir does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown or unavailable variables: {}", .0.iter().map(|v| format!("${v}")).collect::<Vec<_>>().join(", "))]
pub struct UnknownVariables(pub Vec<String>);

impl Template {
    /// A template of exactly one variable.
    pub fn var(var: Var) -> Template {
        Template(crate::vars::Template::var(var))
    }

    /// The single variable, when the template is nothing else.
    pub fn as_var(&self) -> Option<&Var> {
        self.0.as_var()
    }

    /// The pieces, in order.
    pub fn parts(&self) -> &[Part] {
        self.0.parts()
    }

    /// The variables it names, in order.
    pub fn vars(&self) -> impl Iterator<Item = &Var> {
        self.0.vars()
    }
}

impl FromStr for Template {
    type Err = UnknownVariables;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // A `$` that starts no variable is text in this dialect: the problems are names.
        crate::vars::Template::parse(s, Dialect::AccessLog).map(Template).map_err(|rejected| {
            let names = rejected.0.into_iter().filter_map(|p| match p {
                Problem::Unsupported(name) | Problem::BadHeader(name) => Some(name),
                Problem::Unclosed | Problem::Lone => None,
            });
            UnknownVariables(names.collect())
        })
    }
}

/// Prints variables as `${name}`, but as `$name` after text that leaves a `${` open (parsing
/// took it as text because no `}` followed; a brace printed after it would close it and make a
/// name of everything between). A variable parsed there was written `$name` and followed by no
/// name character, so `$name` reads back the same.
impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut open = false;
        for part in self.parts() {
            match part {
                Part::Text(t) => {
                    f.write_str(t)?;
                    open = match t.rfind('}') {
                        Some(close) => t[close..].contains("${"),
                        None => open || t.contains("${"),
                    };
                }
                Part::Var(v) if open => write!(f, "${v}")?,
                Part::Var(v) => write!(f, "${{{v}}}")?,
            }
        }
        Ok(())
    }
}

impl Serialize for Template {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http::HeaderName;

    use super::*;

    #[test]
    fn templates_parse_and_round_trip() {
        let t: Template = "$remote_addr - ${status}x $$ $ $http_user_agent".parse().unwrap();
        assert_eq!(t.to_string(), "${remote_addr} - ${status}x $$ $ ${http_user_agent}");
        let back: Template = t.to_string().parse().unwrap();
        assert_eq!(back, t);
        let err = "$remote_addr $upstream_bytes_sent ${nope}".parse::<Template>().unwrap_err();
        assert_eq!(err.0, ["upstream_bytes_sent", "nope"]);
        assert_eq!("$status".parse::<Template>().unwrap().as_var(), Some(&Var::Status));
        assert_eq!(
            Var::parse("http_x_forwarded_for"),
            Some(Var::RequestHeader(HeaderName::from_static("x-forwarded-for")))
        );
    }

    /// Found by the `templates` fuzz target: a `${` that never closes is text, and the braces
    /// of a variable printed after it used to close it (`{``${${args}` does not parse).
    #[test]
    fn a_template_with_an_unclosed_brace_prints_back_to_itself() {
        for text in ["{``${$args", "x ${ $status - $msec", "$$${$remote_addr", "${} $status ${"] {
            let t: Template = text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let back: Template = t.to_string().parse().unwrap_or_else(|e| panic!("{t} from {text:?}: {e}"));
            assert_eq!(back, t, "{text:?} printed as {t}");
        }
        assert_eq!("x ${ $status".parse::<Template>().unwrap().to_string(), "x ${ $status");
    }
}
