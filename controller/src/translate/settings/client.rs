//! The ConfigMap's client-side limits: `large-client-header-buffers` (the request line and each
//! header line within one buffer, the head within all of them), `client-header-buffer-size`
//! (nginx's first buffer: validated, nothing to change), `http2-max-field-size`,
//! `http2-max-header-size`, `http2-max-concurrent-streams` and `proxy-protocol-header-timeout`.

use weir_dataplane::model::ClientLimits;

use super::Ctx;
use crate::translate::annotations::values;

/// Largest buffer weir accepts for a header line or an HTTP/2 field (nginx has no bound; a
/// megabyte of one header is already far past any client's need).
const MAX_BUFFER: u64 = 1 << 20;

/// A buffer size from 1 byte to [`MAX_BUFFER`].
fn buffer(v: &str) -> Result<u32, String> {
    match values::buffer_size(v)? {
        n if n <= MAX_BUFFER => Ok(n as u32),
        _ => Err("expected at most 1m".into()),
    }
}

/// `large-client-header-buffers`: `NUMBER SIZE`, as nginx's `large_client_header_buffers`.
fn header_buffers(v: &str) -> Result<(u32, u32), String> {
    let mut parts = v.split_whitespace();
    let (Some(number), Some(size), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected a number of buffers and a size, like \"4 8k\"".into());
    };
    let number = values::buffers_number(number)? as u32;
    Ok((number, buffer(size)?))
}

impl Ctx<'_, '_> {
    /// The client-side limits; an invalid value keeps weir's default for that key.
    pub(super) fn client_limits(&mut self) -> ClientLimits {
        let _ = self.value("client-header-buffer-size", buffer, "1k");
        ClientLimits {
            header_buffers: self.value(
                "large-client-header-buffers",
                header_buffers,
                "hyper's ~400 KiB head",
            ),
            h2_max_field_bytes: self.value("http2-max-field-size", buffer, "the header line limit"),
            h2_max_header_bytes: self.value("http2-max-header-size", buffer, "64k"),
            h2_max_concurrent_streams: self.value("http2-max-concurrent-streams", values::rate, "128"),
            proxy_protocol_header_timeout_ms: self.value(
                "proxy-protocol-header-timeout",
                values::timeout_ms,
                "5s",
            ),
            ignore_invalid_headers: self.value("ignore-invalid-headers", values::boolean, "true"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use weir_dataplane::model::ObjectRef;

    use super::*;
    use crate::translate::warnings::{Severity, Warnings};

    fn parse(pairs: &[(&str, &str)]) -> (ClientLimits, Vec<crate::translate::warnings::Warning>) {
        let data: BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut warnings = Warnings::default();
        let parsed = super::super::parse(
            &ObjectRef::new("ingress-nginx", "controller"),
            &data,
            &crate::snapshot::Objects::new(),
            &mut warnings,
        );
        (parsed.settings.client_limits, warnings.finish())
    }

    #[test]
    fn configmap_client_limits() {
        let (limits, w) = parse(&[
            ("client-header-buffer-size", "1k"),
            ("large-client-header-buffers", "4 8k"),
            ("http2-max-field-size", "4k"),
            ("http2-max-header-size", "16k"),
            ("http2-max-concurrent-streams", "128"),
            ("proxy-protocol-header-timeout", "3s"),
            ("ignore-invalid-headers", "false"),
        ]);
        assert!(w.is_empty(), "{w:#?}");
        assert_eq!(
            limits,
            ClientLimits {
                header_buffers: Some((4, 8192)),
                h2_max_field_bytes: Some(4096),
                h2_max_header_bytes: Some(16384),
                h2_max_concurrent_streams: Some(128),
                proxy_protocol_header_timeout_ms: Some(3000),
                ignore_invalid_headers: Some(false),
            }
        );
        // A bad value is an error and keeps the default; the other keys apply.
        let (limits, w) =
            parse(&[("large-client-header-buffers", "8k"), ("http2-max-concurrent-streams", "0")]);
        assert_eq!(w.len(), 2, "{w:#?}");
        assert!(w.iter().all(|w| w.severity == Severity::Error));
        assert_eq!(limits, ClientLimits::default());
        let (_, w) = parse(&[("client-header-buffer-size", "huge")]);
        assert_eq!(w.len(), 1, "{w:#?}");
    }

    #[test]
    fn buffers_parse_as_nginx_writes_them() {
        assert_eq!(header_buffers("4 8k"), Ok((4, 8192)));
        assert_eq!(header_buffers(" 2   16k "), Ok((2, 16384)));
        for bad in ["8k", "4 8k 1", "0 8k", "4 0", "four 8k", "4 2m"] {
            assert!(header_buffers(bad).is_err(), "{bad}");
        }
        assert_eq!(buffer("1k"), Ok(1024));
        assert!(buffer("0").is_err());
    }
}
