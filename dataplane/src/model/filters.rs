//! Gateway API filters of a route (`HTTPRouteFilter`) the Ingress policies do not already
//! cover: header edits on the request and the response, a redirect built from the request,
//! a path rewrite, and a fixed status for rules that cannot be served as written. The host
//! rewrite (`URLRewrite.hostname`) is [`RoutePolicy::upstream_host`](super::RoutePolicy), the
//! mirror [`RoutePolicy::mirror`](super::RoutePolicy), the timeouts
//! [`RoutePolicy::read_timeout_ms`](super::RoutePolicy).

use serde::{Deserialize, Serialize};

/// The Gateway API filters of one route; compiled by `route::filters`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFilters {
    /// `RequestHeaderModifier`: edits of the request sent upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_headers: Option<HeaderEdits>,
    /// `ResponseHeaderModifier`: edits of the response sent to the client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<HeaderEdits>,
    /// `RequestRedirect`: answered instead of proxying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<RequestRedirect>,
    /// `URLRewrite.path`: the path sent upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite_path: Option<PathRewrite>,
    /// Every request is answered with this status instead (a rule with a filter weir does not
    /// support answers 500).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub respond: Option<u16>,
    /// `HTTPRouteRule.retry`: in place of `proxy-next-upstream` and its tries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<Retries>,
}

/// `HTTPRouteRetry` (not a filter, but Gateway API's alone): a try that fails (connecting or sending fails, the response
/// head times out, or the answer has one of `codes`) is followed by another, to an endpoint
/// not tried yet while there is one, then to any, at most `attempts` times, each at least
/// `backoff_ms` after the failed one. As with `proxy-next-upstream`, a request that went out is
/// sent again only when its method is idempotent and its body small enough to keep.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retries {
    /// Statuses (400 to 599) whose answers are retried; the last try's answer stands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<u16>,
    /// Retries after the first try (at most [`Retries::MAX_ATTEMPTS`] are made).
    pub attempts: u32,
    /// Least wait before each retry, in milliseconds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub backoff_ms: u64,
    /// The whole exchange's time, tries and waits together, in milliseconds (`HTTPRouteRule`
    /// `timeouts.request`): no try starts after it and none waits for its answer past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
}

impl Retries {
    /// The most retries the proxy makes after the first try: the endpoints a request tried
    /// live on its stack.
    pub const MAX_ATTEMPTS: u32 = 7;
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `HTTPHeaderFilter`: headers set (replacing), added (appended) and removed, in that order;
/// names in lower case.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderEdits {
    /// Replace the header's values with this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<(String, String)>,
    /// Add this value to the header's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<(String, String)>,
    /// Remove the header.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// `HTTPRequestRedirectFilter`: the `Location` is the request's URL with these parts replaced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestRedirect {
    /// `http` or `https`; `None`: the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// The host; `None`: the request's (without port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The port; `None`: the scheme's well-known port when `scheme` is set, else the Gateway
    /// listener's port the request came through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The path; `None`: the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathRewrite>,
    /// 301, 302, 303, 307 or 308.
    pub code: u16,
    /// The Gateway listener ports of weir's HTTP and HTTPS sockets (`--gateway-http-port`,
    /// `--gateway-https-port`), for the port of redirects without one.
    pub listener_ports: (u16, u16),
}

/// `HTTPPathModifier`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathRewrite {
    /// `ReplaceFullPath`: the whole path.
    Full(String),
    /// `ReplacePrefixMatch`: the route's matched prefix `matched` (element-wise) becomes
    /// `replacement`.
    Prefix {
        /// The PathPrefix the route matched.
        matched: String,
        /// What replaces it.
        replacement: String,
    },
}
