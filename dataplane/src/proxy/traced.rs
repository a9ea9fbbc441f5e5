//! OpenTelemetry on the request path: the routed request's span is started (the incoming
//! context continued when trusted, else a new trace), and its context replaces the client's
//! `traceparent`/`tracestate` in the request, so the upstream, the `auth-url` subrequest (which
//! copies the request's headers) and a mirror copy all see this span as their parent. The span
//! ends with the response body ([`super::metered`]). A request no route takes (a 404, a 400
//! before routing) gets a span too when tracing is on globally ([`start_unrouted`]), with no
//! route, Ingress or Service attributes.

use std::net::IpAddr;

use http::Request;

use super::Compiled;
use crate::route::router::CompiledRoute;
use crate::trace::Pipeline;
use crate::trace::context::{TRACEPARENT, TRACESTATE};
use crate::trace::span::{ActiveSpan, RequestInfo};

/// Where a request came in.
pub(super) struct Arrival<'a> {
    pub(super) host: &'a str,
    pub(super) client: IpAddr,
    pub(super) https: bool,
    pub(super) port: u16,
}

/// Starts the span of `req` on `route`, when tracing is on for it, and sets its context in the
/// request's headers.
pub(super) fn start<B>(
    pipeline: &Pipeline,
    state: &Compiled,
    route: &CompiledRoute,
    req: &mut Request<B>,
    arrival: &Arrival<'_>,
) -> Option<ActiveSpan> {
    let path = match &route.path {
        Some(
            crate::model::PathMatch::Exact(p)
            | crate::model::PathMatch::Prefix(p)
            | crate::model::PathMatch::Regex(p),
        ) => Some(p.as_str()),
        None => None,
    };
    let service = state.router.backend_ids().get(route.backend.0 as usize);
    let info = RequestInfo {
        route: path,
        ingress: route.origin.as_ref().map(|o| (o.namespace.as_str(), o.name.as_str())),
        service: service.map(|s| (s.service.as_str(), s.port.to_string())),
        ..request_info(req, arrival)
    };
    let trace = route.policy.as_deref().and_then(|p| p.trace.as_ref());
    let span = pipeline.start(trace, &info)?;
    let headers = req.headers_mut();
    headers.insert(TRACEPARENT, span.traceparent());
    match &span.state {
        Some(state) => {
            headers.insert(TRACESTATE, state.header());
        }
        // A new trace: the client's tracestate belongs to another one.
        None => {
            headers.remove(TRACESTATE);
        }
    }
    Some(span)
}

/// Starts the span of a request no route took, when the table's `enable-opentelemetry` is on
/// (routes' annotations cannot apply: there is no route). Nothing goes upstream, so the request
/// keeps its headers.
pub(super) fn start_unrouted<B>(
    pipeline: &Pipeline,
    req: &Request<B>,
    arrival: &Arrival<'_>,
) -> Option<ActiveSpan> {
    pipeline.start(None, &request_info(req, arrival))
}

/// What the request and its arrival tell a span, without a route.
fn request_info<'a, B>(req: &'a Request<B>, arrival: &Arrival<'a>) -> RequestInfo<'a> {
    RequestInfo {
        headers: req.headers(),
        method: req.method(),
        path: req.uri().path(),
        query: req.uri().query(),
        scheme: if arrival.https { "https" } else { "http" },
        host: arrival.host,
        port: arrival.port,
        client: arrival.client,
        version: req.version(),
        route: None,
        ingress: None,
        service: None,
    }
}
