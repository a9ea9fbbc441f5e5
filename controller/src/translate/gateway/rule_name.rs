//! `HTTPRouteRule.name` and `GRPCRouteRule.name` (HTTPRouteNamedRouteRule,
//! GRPCRouteNamedRouteRule), validated (pure).
//!
//! A name is a `SectionName` (`shared_types.go`: 1 to 253 characters matching
//! `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`, an RFC 1123
//! subdomain) and "MUST be unique within a Route if it is set" (`HTTPRouteRule.name`). The API
//! server checks the format; uniqueness is a CEL rule of the experimental channel only, and
//! manifests are checked by nobody else: weir checks both. A rule whose name fails still serves
//! (nothing is lost), without the name; the route is not `Accepted` (`UnsupportedValue`, like
//! an unsupported filter) and gets an `InvalidRuleName` error. Of two rules with one name the
//! first keeps it.

use std::collections::BTreeMap;

/// The names carried for each rule (`None`: unnamed or refused) and, for each refused one,
/// what is wrong (`spec.rules[i].name: ...`).
pub fn rule_names<'a>(
    names: impl IntoIterator<Item = Option<&'a str>>,
) -> (Vec<Option<String>>, Vec<String>) {
    let mut out = Vec::new();
    let mut refused = Vec::new();
    let mut first: BTreeMap<&str, usize> = BTreeMap::new();
    for (ri, name) in names.into_iter().enumerate() {
        let Some(name) = name else {
            out.push(None);
            continue;
        };
        if let Err(why) = check(name) {
            refused.push(format!("spec.rules[{ri}].name: {name:?} {why}"));
            out.push(None);
            continue;
        }
        match first.get(name) {
            Some(other) => {
                refused.push(format!(
                    "spec.rules[{ri}].name: {name:?} is the name of spec.rules[{other}] too; a rule name must be unique within a route"
                ));
                out.push(None);
            }
            None => {
                first.insert(name, ri);
                out.push(Some(name.to_string()));
            }
        }
    }
    (out, refused)
}

/// `SectionName`: an RFC 1123 subdomain of 1 to 253 characters.
fn check(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("must have 1 to 253 characters");
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    };
    if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(
            "is not a SectionName (lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SectionName` (`shared_types.go`): the valid and invalid values it lists, and the
    /// pattern's edges.
    #[test]
    fn section_name_format() {
        for ok in ["example", "foo-example", "example.com", "foo.example.com", "a", "0", "a-0.b"] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        let long = "a".repeat(254);
        for bad in ["example.com/bar", "", "Upper", "-a", "a-", "a..b", ".a", "a.", "a_b", "ä", long.as_str()]
        {
            assert!(check(bad).is_err(), "{bad}");
        }
        assert_eq!(check(&"a".repeat(253)), Ok(()));
    }

    /// `HTTPRouteRule.name`: "This name MUST be unique within a Route if it is set": the first
    /// keeps it, later ones and malformed ones are refused and carried as unnamed.
    #[test]
    fn rule_names_unique_within_a_route() {
        let (names, refused) = rule_names([Some("a"), None, Some("b"), Some("a"), Some("B")]);
        assert_eq!(names, vec![Some("a".into()), None, Some("b".into()), None, None]);
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(
            refused[0].starts_with("spec.rules[3].name: \"a\" is the name of spec.rules[0] too"),
            "{refused:?}"
        );
        assert!(refused[1].starts_with("spec.rules[4].name: \"B\" is not a SectionName"), "{refused:?}");
        let (names, refused) = rule_names([None, None]);
        assert_eq!((names, refused), (vec![None, None], Vec::<String>::new()));
    }
}
