//! `enable-auth-access-log`: a line of its own for each auth-url subrequest, as ingress-nginx
//! logs its auth location when the key is on (none by default). The line has the log's format;
//! it describes the request it was made for (`$request`, `$host`, `$req_id`...), with the
//! subrequest's status, the authentication service as the upstream, its time as
//! `$request_time`, `$request_end` `auth_subrequest`, and no bytes to or from the client.

use http::{HeaderValue, Request};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::Compiled;
use super::accesslog::Ssl;
use super::accesslog::{End, Ending, Format, Outcome, Upstream};
use super::extauth::Asked;
use crate::model::ObjectRef;

/// The request an auth subrequest was made for, as its line needs it.
pub(super) struct For<'a, B> {
    /// The request.
    pub(super) req: &'a Request<B>,
    /// Its client, as the proxy believes.
    pub(super) client: IpAddr,
    /// Its `X-Request-ID`.
    pub(super) request_id: &'a HeaderValue,
    /// The route's Ingress.
    pub(super) origin: Option<&'a ObjectRef>,
    /// Its connection's client (the PROXY protocol address when there is one).
    pub(super) peer: SocketAddr,
    /// Its connection's TLS parameters, on HTTPS.
    pub(super) ssl: Option<Ssl>,
    /// Its connection came over TLS.
    pub(super) https: bool,
    /// Its listener's port.
    pub(super) listener_port: &'a HeaderValue,
}

/// The access log's format when it logs auth subrequests.
pub(super) fn format(state: &Compiled) -> Option<&Arc<Format>> {
    state.config.access_log.as_ref().filter(|format| format.logs_auth_subrequests())
}

/// Writes the line of one auth subrequest (unless `skip-access-log-urls` skips the request).
pub(super) fn write<B>(state: &Compiled, format: &Arc<Format>, of: For<'_, B>, asked: Asked) {
    let Some(captured) = format.capture(of.req, of.client) else { return };
    let upstream = asked.service.map(|addr| Upstream {
        addr,
        status: asked.status.as_u16(),
        elapsed: asked.elapsed,
        backend: None,
        origin: of.origin.cloned(),
        connect: asked.connect,
        earlier_connect: String::new(),
    });
    let headers = http::HeaderMap::new();
    let outcome = Outcome {
        peer: of.peer,
        https: of.https,
        ssl: of.ssl,
        listener_port: of.listener_port,
        request_id: of.request_id,
        status: asked.status,
        response_headers: &headers,
        upstream,
    };
    let entry = format.entry(captured, outcome);
    let end = End {
        elapsed: asked.elapsed,
        head_bytes: 0,
        body_bytes: 0,
        request_length: 0,
        how: Ending::AuthSubrequest,
    };
    entry.write(&end, &state.log);
}
