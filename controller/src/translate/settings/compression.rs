//! The ConfigMap's response compression: ingress-nginx's `use-gzip`, `gzip-level`,
//! `gzip-min-length`, `gzip-types`, `gzip-disable`, `enable-brotli`, `brotli-level`,
//! `brotli-min-length`, `brotli-types`, and weir's own `enable-zstd`, `zstd-level`,
//! `zstd-min-length`, `zstd-types` (the names of nginx's zstd module's directives). Defaults are
//! ingress-nginx's (`internal/ingress/controller/config/config.go`).

use weir_dataplane::model::compression::{Codec, Compression};

use super::Ctx;
use crate::translate::annotations::values;

/// ingress-nginx's `gzip-types` default.
pub(super) const GZIP_TYPES: &str = "application/atom+xml application/javascript application/x-javascript application/json application/rss+xml application/vnd.ms-fontobject application/x-font-ttf application/x-web-app-manifest+json application/xhtml+xml application/xml font/opentype image/svg+xml image/x-icon text/css text/javascript text/plain text/x-component";
/// ingress-nginx's `brotli-types` default (also weir's `zstd-types` default).
pub(super) const BROTLI_TYPES: &str = "application/xml+rss application/atom+xml application/javascript application/x-javascript application/json application/rss+xml application/vnd.ms-fontobject application/x-font-ttf application/x-web-app-manifest+json application/xhtml+xml application/xml font/opentype image/svg+xml image/x-icon text/css text/javascript text/plain text/x-component";

/// A whitespace-separated list of media types (`type/subtype`, lower-cased) or `*`.
pub(super) fn media_types(s: &str) -> Result<Vec<String>, String> {
    let token =
        |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b));
    let mut types = Vec::new();
    for t in s.split_ascii_whitespace() {
        let ok = t == "*" || t.split_once('/').is_some_and(|(ty, sub)| token(ty) && token(sub));
        if !ok {
            return Err(format!("{t:?} is not a media type like text/css (or *)"));
        }
        types.push(t.to_ascii_lowercase());
    }
    if types.is_empty() {
        return Err("expected media types like \"text/css application/json\"".to_string());
    }
    Ok(types)
}

/// `gzip-disable`: nginx's `msie6` mask or a regular expression on `User-Agent` (matched
/// without regard to case, as nginx's `gzip_disable`).
fn user_agents(s: &str) -> Result<String, String> {
    weir_dataplane::proxy::compress::check_gzip_disable(s).map(|()| s.to_string()).map_err(|e| {
        format!("not a regular expression (RE2 syntax): {}", e.lines().last().unwrap_or_default())
    })
}

fn level(range: std::ops::RangeInclusive<u32>) -> impl Fn(&str) -> Result<u32, String> {
    move |s| match s.parse::<u32>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!("expected a level from {} to {}", range.start(), range.end())),
    }
}

impl Ctx<'_, '_> {
    /// The compression settings; `None` when every coding is off.
    pub(super) fn compression(&mut self) -> Option<Compression> {
        let gzip = self.codec(
            ["use-gzip", "gzip-level", "gzip-min-length", "gzip-types"],
            1..=9,
            (1, 256),
            GZIP_TYPES,
        );
        let brotli = self.codec(
            ["enable-brotli", "brotli-level", "brotli-min-length", "brotli-types"],
            0..=11,
            (4, 20),
            BROTLI_TYPES,
        );
        let zstd = self.codec(
            ["enable-zstd", "zstd-level", "zstd-min-length", "zstd-types"],
            1..=19,
            (1, 20),
            BROTLI_TYPES,
        );
        let gzip_disable = self.value("gzip-disable", user_agents, "none");
        let compression = Compression { gzip, brotli, zstd, gzip_disable };
        (!compression.is_off()).then_some(compression)
    }

    /// One coding: its switch, level, minimum length and types, each value checked even while the
    /// coding is off (a typo shows before it matters).
    fn codec(
        &mut self,
        [on, level_key, min_key, types_key]: [&str; 4],
        levels: std::ops::RangeInclusive<u32>,
        (default_level, default_min): (u32, u64),
        default_types: &str,
    ) -> Option<Codec> {
        let enabled = self.value(on, values::boolean, "false");
        let level = self.value(level_key, level(levels), &default_level.to_string());
        let min_length = self.value(min_key, values::size, &default_min.to_string());
        let types = self.value(types_key, media_types, "ingress-nginx's list");
        enabled?.then(|| Codec {
            level: level.unwrap_or(default_level),
            min_length: min_length.unwrap_or(default_min),
            types: types
                .unwrap_or_else(|| default_types.split_ascii_whitespace().map(str::to_string).collect()),
        })
    }
}
