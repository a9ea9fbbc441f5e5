//! The `CORS` filter (`HTTPCORSFilter`, standard channel) onto weir's CORS machinery (the one
//! ingress-nginx's `enable-cors` keys use): allowed origins (`*`, `scheme://host[:port]`,
//! `scheme://*.suffix` for any number of labels in front), methods, headers, exposed headers,
//! credentials and `maxAge` (default 5 seconds). A preflight from an allowed origin is answered
//! by weir (`204`); other requests from it get the CORS headers on the backend's answer; an
//! origin not allowed gets no CORS headers.

use weir_dataplane::model::Cors;

/// `HTTPRouteFilter.cors`, as given, into [`Cors`]; `Err` says what is wrong.
pub fn cors(value: &serde_json::Value) -> Result<Cors, String> {
    let list = |field: &str| -> Result<Vec<String>, String> {
        match value.get(field) {
            None | Some(serde_json::Value::Null) => Ok(Vec::new()),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| format!("cors.{field}: {v} is not a string"))
                })
                .collect(),
            Some(other) => Err(format!("cors.{field}: {other} is not a list")),
        }
    };
    let allow_origins = list("allowOrigins")?;
    for o in &allow_origins {
        let valid = o == "*"
            || o.split_once("://").is_some_and(|(scheme, host)| {
                matches!(scheme, "http" | "https") && !host.is_empty() && !host.contains('/')
            });
        if !valid {
            return Err(format!("cors.allowOrigins: {o:?} is not `*` or scheme://host[:port]"));
        }
    }
    let header_list = |field: &str| -> Result<String, String> {
        let items = list(field)?;
        for h in &items {
            if h != "*" && http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                return Err(format!("cors.{field}: {h:?} is not a header name"));
            }
        }
        Ok(items.join(", "))
    };
    let methods = list("allowMethods")?;
    for m in &methods {
        if m != "*" && http::Method::from_bytes(m.as_bytes()).is_err() {
            return Err(format!("cors.allowMethods: {m:?} is not a method"));
        }
    }
    let allow_credentials = match value.get("allowCredentials") {
        None | Some(serde_json::Value::Null) => false,
        Some(v) => v.as_bool().ok_or_else(|| format!("cors.allowCredentials: {v} is not a boolean"))?,
    };
    let max_age = match value.get("maxAge") {
        None | Some(serde_json::Value::Null) => 5,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("cors.maxAge: {v} is not a number of seconds from 1"))?,
    };
    Ok(Cors {
        allow_origins,
        // "CORS-safelisted methods are always allowed".
        allow_methods: if methods.is_empty() { "GET, HEAD, POST".into() } else { methods.join(", ") },
        allow_headers: header_list("allowHeaders")?,
        expose_headers: header_list("exposeHeaders")?,
        allow_credentials,
        max_age,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// `HTTPCORSFilter`: the fields, `maxAge` "default value ... is 5", bad values refused.
    #[test]
    fn cors_filter_fields_and_defaults() {
        let c = cors(&serde_json::json!({
            "allowOrigins": ["https://app.example", "https://*.example.com"],
            "allowMethods": ["GET", "PUT"],
            "allowHeaders": ["x-token"],
            "exposeHeaders": ["x-trace"],
            "allowCredentials": true,
            "maxAge": 60,
        }))
        .unwrap();
        assert_eq!(c.allow_origins, ["https://app.example", "https://*.example.com"]);
        assert_eq!((c.allow_methods.as_str(), c.allow_headers.as_str()), ("GET, PUT", "x-token"));
        assert_eq!((c.expose_headers.as_str(), c.allow_credentials, c.max_age), ("x-trace", true, 60));
        let d = cors(&serde_json::json!({"allowOrigins": ["*"]})).unwrap();
        assert_eq!((d.max_age, d.allow_credentials, d.allow_methods.as_str()), (5, false, "GET, HEAD, POST"));
        assert!(cors(&serde_json::json!({"allowOrigins": ["app.example"]})).is_err());
        assert!(cors(&serde_json::json!({"allowMethods": ["BAD METHOD"]})).is_err());
        assert!(cors(&serde_json::json!({"maxAge": 0})).is_err());
    }
}
