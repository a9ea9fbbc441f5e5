//! TLS towards an `https://` `auth-url`: the Ingress's `proxy-ssl-*` annotations apply, as in
//! ingress-nginx, whose authentication location inherits the server's `proxy_ssl_*` directives.
//! Unlike nginx (whose `proxy_ssl_verify` is off unless set), weir verifies the service's
//! certificate by default, against the system's roots; `proxy-ssl-verify: "off"` turns that off.

use k8s_openapi::api::networking::v1::Ingress;
use weir_dataplane::model::{ExternalAuth, ObjectRef, UpstreamTls};

use super::protocol::{
    PROXY_SSL_CIPHERS, PROXY_SSL_NAME, PROXY_SSL_PROTOCOLS, PROXY_SSL_SECRET, PROXY_SSL_VERIFY,
    PROXY_SSL_VERIFY_DEPTH, get, upstream_tls,
};
use crate::snapshot::Snapshot;
use crate::translate::warnings::Warnings;

/// Sets the TLS of the Ingress's own external authentication when its URL may be `https://`
/// and the Ingress has `proxy-ssl-*` annotations (without them the system's roots verify it).
/// The messages about those annotations are the backends' own (the same, deduplicated).
pub(crate) fn apply(
    auth: &mut ExternalAuth,
    ingress: &Ingress,
    object: &ObjectRef,
    snapshot: &Snapshot,
    guards: &super::risk::Guards,
    warnings: &mut Warnings,
) {
    let plain = auth.url.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("http://"));
    let keys = [
        PROXY_SSL_SECRET,
        PROXY_SSL_VERIFY,
        PROXY_SSL_NAME,
        PROXY_SSL_VERIFY_DEPTH,
        PROXY_SSL_CIPHERS,
        PROXY_SSL_PROTOCOLS,
    ];
    if plain || !keys.iter().any(|key| get(ingress, key).is_some()) {
        return;
    }
    let tls = upstream_tls(ingress, object, snapshot, guards, warnings);
    // `proxy-ssl-server-name` does not apply: nginx's authentication location always sends SNI.
    auth.tls = Some(UpstreamTls { no_sni: false, ..tls });
}
