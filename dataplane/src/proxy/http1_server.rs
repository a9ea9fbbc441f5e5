//! [`Http1Server`]: the `--http1-server` choice (its driver is `h1_idle`).

/// Which HTTP/1 server drives client connections (`--http1-server`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Http1Server {
    /// hyper's, one connection state for the connection's life (the fallback).
    Hyper,
    /// hyper per busy period, nothing held while idle (`h1_idle`): the default.
    #[default]
    Weir,
}

impl std::str::FromStr for Http1Server {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hyper" => Ok(Http1Server::Hyper),
            "weir" => Ok(Http1Server::Weir),
            other => Err(format!("unknown HTTP/1 server {other:?} (hyper or weir)")),
        }
    }
}
