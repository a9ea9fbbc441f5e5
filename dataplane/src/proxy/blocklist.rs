//! `block-user-agents` and `block-referers`: requests whose `User-Agent` or `Referer` matches an
//! entry get 403 before anything else happens (ingress-nginx's `map` and `if ($block_ua)` in
//! every server). An absent or empty header matches nothing, as nginx's `map` skips an empty
//! value.

use http::HeaderMap;
use http::header::{REFERER, USER_AGENT};

use crate::model::blocklist::HeaderPattern;

/// Both lists, compiled.
#[derive(Debug)]
pub struct Blocklists {
    user_agents: Option<Matcher>,
    referers: Option<Matcher>,
}

/// One list: exact values (lower case) and one set of expressions.
#[derive(Debug)]
struct Matcher {
    exact: Box<[Box<str>]>,
    regexes: Option<regex::RegexSet>,
}

impl Matcher {
    fn new(patterns: &[HeaderPattern]) -> Result<Option<Matcher>, regex::Error> {
        if patterns.is_empty() {
            return Ok(None);
        }
        let mut exact = Vec::new();
        let mut regexes = Vec::new();
        for p in patterns {
            match p {
                HeaderPattern::Exact(v) => exact.push(v.to_ascii_lowercase().into_boxed_str()),
                HeaderPattern::Regex { pattern, caseless } => {
                    regexes.push(if *caseless { format!("(?i:{pattern})") } else { format!("(?:{pattern})") })
                }
            }
        }
        let regexes = if regexes.is_empty() {
            None
        } else {
            Some(regex::RegexSetBuilder::new(&regexes).size_limit(1 << 22).build()?)
        };
        Ok(Some(Matcher { exact: exact.into_boxed_slice(), regexes }))
    }

    fn matches(&self, value: &[u8]) -> bool {
        if value.is_empty() {
            return false;
        }
        if self.exact.iter().any(|e| e.as_bytes().eq_ignore_ascii_case(value)) {
            return true;
        }
        // A value that is not UTF-8 is matched as far as it is text (lossy), as PCRE would see
        // the bytes of a printable value.
        self.regexes.as_ref().is_some_and(|set| set.is_match(&String::from_utf8_lossy(value)))
    }
}

impl Blocklists {
    /// Compiles the table's lists; `None` when both are empty. An unusable expression
    /// (translation checks each first) leaves that list out, with a log line.
    pub fn new(user_agents: &[HeaderPattern], referers: &[HeaderPattern]) -> Option<Blocklists> {
        let compile = |name: &str, patterns: &[HeaderPattern]| match Matcher::new(patterns) {
            Ok(m) => m,
            Err(error) => {
                tracing::warn!(list = name, %error, "blocklist unusable; ignored");
                None
            }
        };
        let lists = Blocklists {
            user_agents: compile("block-user-agents", user_agents),
            referers: compile("block-referers", referers),
        };
        (lists.user_agents.is_some() || lists.referers.is_some()).then_some(lists)
    }

    /// Whether a request with `headers` is refused.
    pub fn blocks(&self, headers: &HeaderMap) -> bool {
        let hit = |m: &Option<Matcher>, name| {
            m.as_ref().is_some_and(|m| headers.get_all(name).iter().any(|v| m.matches(v.as_bytes())))
        };
        hit(&self.user_agents, USER_AGENT) || hit(&self.referers, REFERER)
    }
}

/// Checks one expression as the proxy will compile it.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    regex::RegexBuilder::new(pattern).size_limit(1 << 22).build().map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(ua: Option<&str>, referer: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = ua {
            h.insert(USER_AGENT, HeaderValue::from_str(v).unwrap());
        }
        if let Some(v) = referer {
            h.insert(REFERER, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn exact_values_and_expressions_as_nginx_map_reads_them() {
        let lists = Blocklists::new(
            &[
                HeaderPattern::Exact("BadBot/1.0".into()),
                HeaderPattern::Regex { pattern: "^curl/".into(), caseless: false },
                HeaderPattern::Regex { pattern: "scrapy".into(), caseless: true },
            ],
            &[HeaderPattern::Regex { pattern: r"spam\.example".into(), caseless: true }],
        )
        .unwrap();
        for (ua, blocked) in [
            ("BadBot/1.0", true),
            ("badbot/1.0", true), // exact, without regard to case
            ("BadBot/1.0 (extra)", false),
            ("curl/8.0", true),
            ("CURL/8.0", false), // `~`: case-sensitive
            ("Mozilla/5.0 Scrapy/2.11", true),
            ("Mozilla/5.0", false),
        ] {
            assert_eq!(lists.blocks(&headers(Some(ua), None)), blocked, "{ua}");
        }
        assert!(lists.blocks(&headers(None, Some("https://SPAM.example/x"))));
        assert!(!lists.blocks(&headers(None, Some("https://example.org/"))));
        assert!(!lists.blocks(&headers(None, None)), "no header, nothing to match");
        assert!(!lists.blocks(&headers(Some(""), None)), "an empty value matches nothing");
    }

    #[test]
    fn empty_lists_are_none_and_bad_expressions_are_refused() {
        assert!(Blocklists::new(&[], &[]).is_none());
        assert!(check_pattern("a(").is_err());
        assert!(check_pattern("(?i)bot").is_ok());
    }
}
