//! HTTP/1.1 upgrades (WebSocket and others): after a `101 Switching Protocols` from the upstream,
//! the client's connection is taken over from hyper, the upstream's from our client
//! ([`super::upstream::h1::Upgraded`]), and both are spliced byte for byte.

use std::net::SocketAddr;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

use super::upstream::h1::Upgraded;

/// Spawns the task that waits for the client's side to finish upgrading, passes on what the
/// upstream sent past its 101, then copies both ways until either side closes.
pub(super) fn splice(downstream: OnUpgrade, upstream: Upgraded, peer: SocketAddr) {
    tokio::spawn(async move {
        let down = match downstream.await {
            Ok(down) => down,
            Err(error) => {
                tracing::debug!(%peer, %error, "upgrade failed");
                return;
            }
        };
        let mut down = TokioIo::new(down);
        let Upgraded { io: mut up, read } = upstream;
        if !read.is_empty()
            && let Err(error) = down.write_all(&read).await
        {
            tracing::debug!(%peer, %error, "upgraded connection failed");
            return;
        }
        match tokio::io::copy_bidirectional(&mut down, &mut up).await {
            Ok((from_client, from_upstream)) => {
                tracing::debug!(%peer, from_client, from_upstream, "upgraded connection closed");
            }
            Err(error) => tracing::debug!(%peer, %error, "upgraded connection failed"),
        }
    });
}
