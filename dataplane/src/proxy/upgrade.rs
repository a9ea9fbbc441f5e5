//! HTTP/1.1 upgrades (WebSocket and others): after a `101 Switching Protocols` from the upstream,
//! both connections are taken over from hyper and spliced byte for byte.

use std::net::SocketAddr;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// Spawns the task that waits for both sides to finish upgrading, then copies both ways until
/// either side closes.
pub(super) fn splice(downstream: OnUpgrade, upstream: OnUpgrade, peer: SocketAddr) {
    tokio::spawn(async move {
        let (down, up) = match tokio::try_join!(downstream, upstream) {
            Ok(pair) => pair,
            Err(error) => {
                tracing::debug!(%peer, %error, "upgrade failed");
                return;
            }
        };
        let mut down = TokioIo::new(down);
        let mut up = TokioIo::new(up);
        match tokio::io::copy_bidirectional(&mut down, &mut up).await {
            Ok((from_client, from_upstream)) => {
                tracing::debug!(%peer, from_client, from_upstream, "upgraded connection closed");
            }
            Err(error) => tracing::debug!(%peer, %error, "upgraded connection failed"),
        }
    });
}
