//! `block-user-agents` and `block-referers`: comma-separated entries, each read as nginx's `map`
//! reads a key (ingress-nginx pastes them into one): `~` starts a case-sensitive regular
//! expression, `~*` a case-insensitive one, anything else is the whole value, compared without
//! regard to case. Surrounding double quotes (which nginx's configuration syntax needed for
//! values with spaces) are dropped.

use weir_dataplane::model::blocklist::HeaderPattern;

use super::Ctx;
use crate::translate::warnings::Reason;

/// One entry; `Err` says why it is refused.
pub(super) fn entry(raw: &str) -> Result<HeaderPattern, String> {
    let raw = raw.trim();
    let raw = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')).unwrap_or(raw);
    let (pattern, caseless) = match raw.strip_prefix("~*") {
        Some(p) => (p, true),
        None => match raw.strip_prefix('~') {
            Some(p) => (p, false),
            None => return Ok(HeaderPattern::Exact(raw.to_string())),
        },
    };
    if pattern.is_empty() {
        return Err("an empty regular expression would match every client".to_string());
    }
    weir_dataplane::proxy::blocklist::check_pattern(pattern)
        .map(|()| HeaderPattern::Regex { pattern: pattern.to_string(), caseless })
        .map_err(|e| {
            format!("not a regular expression (RE2 syntax): {}", e.lines().last().unwrap_or_default())
        })
}

impl Ctx<'_, '_> {
    /// The list under `key`. An entry that is not valid is an error naming it, and the other
    /// entries still apply (dropping the whole list would unblock every client it names).
    pub(super) fn blocklist(&mut self, key: &str) -> Vec<HeaderPattern> {
        let Some(raw) = self.raw(key) else { return Vec::new() };
        let mut list = Vec::new();
        for item in raw.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match entry(item) {
                Ok(pattern) => list.push(pattern),
                Err(why) => self.error(
                    Reason::InvalidSetting,
                    format!("data[{key}]: invalid value {item:?}: {why}; the other entries apply"),
                ),
            }
        }
        list
    }
}
