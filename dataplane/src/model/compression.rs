//! Response compression settings (`use-gzip`, `enable-brotli` and their companions, weir's
//! `enable-zstd`), part of the table's [`super::Settings`].

use serde::{Deserialize, Serialize};

/// Which codings the proxy may apply to responses, and to which.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compression {
    /// `use-gzip`, `gzip-level`, `gzip-min-length`, `gzip-types`; `None`: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gzip: Option<Codec>,
    /// `enable-brotli`, `brotli-level`, `brotli-min-length`, `brotli-types`; `None`: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brotli: Option<Codec>,
    /// weir's `enable-zstd`, `zstd-level`, `zstd-min-length`, `zstd-types`; `None`: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zstd: Option<Codec>,
    /// `gzip-disable`: a case-insensitive regular expression on `User-Agent` (or nginx's
    /// `msie6` mask) whose clients get no gzip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gzip_disable: Option<String>,
}

/// One coding's parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Codec {
    /// Compression level, in the codec's own range (gzip 1–9, brotli 0–11, zstd 1–19).
    pub level: u32,
    /// Responses whose `Content-Length` is below this many bytes are sent as they are;
    /// responses without one are compressed.
    pub min_length: u64,
    /// Media types compressed, lower case, without parameters; `*` is any. `text/html` is
    /// always compressed, as nginx does.
    pub types: Vec<String>,
}

impl Compression {
    /// True when no coding is on.
    pub fn is_off(&self) -> bool {
        self.gzip.is_none() && self.brotli.is_none() && self.zstd.is_none()
    }
}
