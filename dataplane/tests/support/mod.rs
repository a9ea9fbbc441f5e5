//! Shared test harness: table builders, echo backends and a proxy on ephemeral ports, and a
//! small HTTP client. Every socket is 127.0.0.1 with a port from the OS.
#![allow(dead_code, clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use weir_dataplane::echo::EchoResponse;
use weir_dataplane::model::{
    Backend, BackendId, Endpoint, HostMatch, ObjectRef, PathMatch, Route, RouteAction, RoutePolicy,
    RouteTable, Target, UpstreamProtocol, VirtualHost,
};
use weir_dataplane::proxy::{Proxy, ProxyConfig};

// === backends ===

/// A running echo backend.
pub struct Echo {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The name it reports.
    pub name: String,
}

/// Starts an echo backend named `name` on an ephemeral port; it lives as long as the runtime.
pub async fn echo(name: &str) -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let name = name.to_string();
    tokio::spawn(weir_dataplane::echo::serve(listener, name.clone(), std::future::pending()));
    Echo { addr, name }
}

/// An address nothing listens on (bound then dropped): connecting is refused.
pub async fn dead_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// A backend for the table builder: an id and where it goes.
#[derive(Clone, Debug)]
pub struct Be {
    /// Its id, `test/<name>:80`.
    pub id: BackendId,
    /// Its model.
    pub backend: Backend,
}

/// A backend `name` over `addrs`, weight 1 each.
pub fn backend(name: &str, addrs: &[SocketAddr]) -> Be {
    weighted(name, &addrs.iter().map(|a| (*a, 1)).collect::<Vec<_>>())
}

/// A backend `name` over `(addr, weight)` pairs.
pub fn weighted(name: &str, eps: &[(SocketAddr, u32)]) -> Be {
    Be {
        id: format!("test/{name}:80").parse().unwrap(),
        backend: Backend {
            protocol: UpstreamProtocol::Http1,
            target: Target::Endpoints(
                eps.iter().map(|&(address, weight)| Endpoint { address, weight }).collect(),
            ),
            tls: None,
        },
    }
}

/// A backend `name` with a single echo endpoint.
pub fn to(e: &Echo) -> Be {
    backend(&e.name, &[e.addr])
}

// === tables ===

/// Builds a [`RouteTable`]: `table().host("a.test").prefix("/api", &be).build()`.
#[derive(Default)]
pub struct TableBuilder {
    table: RouteTable,
    host: Option<HostMatch>,
}

/// Starts a table.
pub fn table() -> TableBuilder {
    TableBuilder::default()
}

impl TableBuilder {
    /// Following routes go to this host (`*.x`, `*` or a name).
    pub fn host(mut self, host: &str) -> Self {
        let host = HostMatch::parse(host).unwrap();
        if !self.table.hosts.iter().any(|v| v.host == host) {
            self.table.hosts.push(VirtualHost {
                host: host.clone(),
                routes: Vec::new(),
                fallback: Vec::new(),
            });
        }
        self.host = Some(host);
        self
    }
    /// A `Prefix` route on the current host.
    pub fn prefix(self, path: &str, be: &Be) -> Self {
        self.route(PathMatch::Prefix(path.into()), be)
    }
    /// An `Exact` route on the current host.
    pub fn exact(self, path: &str, be: &Be) -> Self {
        self.route(PathMatch::Exact(path.into()), be)
    }
    /// A `Regex` route on the current host.
    pub fn regex(self, path: &str, be: &Be) -> Self {
        self.route(PathMatch::Regex(path.into()), be)
    }
    /// The default backend.
    pub fn default_backend(mut self, be: &Be) -> Self {
        self.table.default_backend = Some(be.id.clone());
        self.backend(be)
    }
    /// Adds a backend without routing to it.
    pub fn backend(mut self, be: &Be) -> Self {
        self.table.backends.insert(be.id.clone(), be.backend.clone());
        self
    }
    /// Sets the policy of the route added last.
    pub fn policy(mut self, policy: RoutePolicy) -> Self {
        let host = self.host.clone().unwrap_or(HostMatch::Any);
        let vh = self.table.hosts.iter_mut().find(|v| v.host == host).unwrap();
        vh.routes.last_mut().unwrap().policy = policy;
        self
    }
    /// The table.
    pub fn build(self) -> RouteTable {
        self.table
    }

    fn route(mut self, path: PathMatch, be: &Be) -> Self {
        let host = self.host.clone().unwrap_or(HostMatch::Any);
        if !self.table.hosts.iter().any(|v| v.host == host) {
            self.table.hosts.push(VirtualHost {
                host: host.clone(),
                routes: Vec::new(),
                fallback: Vec::new(),
            });
        }
        let vh = self.table.hosts.iter_mut().find(|v| v.host == host).unwrap();
        vh.routes.push(Route {
            path,
            action: RouteAction::Forward(be.id.clone()),
            policy: RoutePolicy::default(),
            origin: ObjectRef::new("test", be.id.service.clone()),
            conditions: None,
            rule: None,
        });
        self.backend(be)
    }
}

// === proxy ===

/// A proxy serving on an ephemeral port, stopped when dropped.
pub struct TestProxy {
    /// The proxy (publish more tables through it).
    pub proxy: Proxy,
    /// Where it listens.
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    /// The serve task; resolves after shutdown and drain.
    pub task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    client: Client<HttpConnector, TestBody>,
}

/// Config for tests: short timeouts so failures are quick.
pub fn test_config() -> ProxyConfig {
    ProxyConfig {
        connect_timeout: Duration::from_secs(2),
        upstream_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(5),
        http1_server: http1_server(),
        ..ProxyConfig::default()
    }
}

/// The HTTP/1 server the tests run: weir's own by default, as `weir serve`'s;
/// `WEIR_HTTP1_SERVER=hyper` runs the suite on the fallback (`--http1-server hyper`), as the
/// `weir` command reads the same variable.
pub fn http1_server() -> weir_dataplane::proxy::Http1Server {
    match std::env::var("WEIR_HTTP1_SERVER") {
        Ok(name) => name.parse().unwrap(),
        Err(_) => Default::default(),
    }
}

/// Starts a proxy with [`test_config`] serving `table`.
pub async fn proxy(table: RouteTable) -> TestProxy {
    proxy_with(test_config(), table).await
}

/// Starts a proxy with `config` serving `table`.
pub async fn proxy_with(config: ProxyConfig, table: RouteTable) -> TestProxy {
    let proxy = Proxy::new(config);
    proxy.publish(table).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let p = proxy.clone();
    let task = tokio::spawn(async move {
        p.serve(listener, async move {
            let _ = rx.await;
        })
        .await
    });
    TestProxy { proxy, addr, shutdown: Some(tx), task: Some(task), client: client() }
}

impl TestProxy {
    /// `GET path` with `Host: host`.
    pub async fn get(&self, host: &str, path: &str) -> Resp {
        self.send(self.req(host, path).body(empty()).unwrap()).await
    }

    /// A request builder aimed at this proxy with `Host: host`.
    pub fn req(&self, host: &str, path: &str) -> http::request::Builder {
        Request::get(format!("http://{}{}", self.addr, path)).header(http::header::HOST, host)
    }

    /// Sends `req`; the whole response is read.
    pub async fn send(&self, req: Request<TestBody>) -> Resp {
        let resp = self.client.request(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Resp { status: parts.status, headers: parts.headers, body }
    }

    /// Sends `req` and returns the raw response (body unread).
    pub async fn send_raw(&self, req: Request<TestBody>) -> http::Response<hyper::body::Incoming> {
        self.client.request(req).await.unwrap()
    }

    /// Asks the proxy to stop (it drains in-flight requests).
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.shutdown();
    }
}

// === client ===

/// The test client's request body.
pub type TestBody = BoxBody<Bytes, Infallible>;

/// An empty body.
pub fn empty() -> TestBody {
    Empty::new().boxed()
}

/// A body with these bytes.
pub fn full(b: impl Into<Bytes>) -> TestBody {
    Full::new(b.into()).boxed()
}

/// A pooled HTTP/1.1 client.
pub fn client() -> Client<HttpConnector, TestBody> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A whole response.
#[derive(Debug)]
pub struct Resp {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Resp {
    /// The echo's description of the request it saw (panics with the body if not JSON).
    pub fn echo(&self) -> EchoResponse {
        assert_eq!(self.status, StatusCode::OK, "body: {:?}", String::from_utf8_lossy(&self.body));
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// Which echo answered.
    pub fn name(&self) -> String {
        self.echo().name
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts this is the proxy's own error response with `code`.
    pub fn assert_local(&self, code: u16) {
        assert_eq!(self.status.as_u16(), code, "body: {}", self.text());
        assert_eq!(self.headers["content-type"], "text/plain; charset=utf-8");
        assert!(self.text().starts_with(&format!("{code} ")), "{}", self.text());
        assert!(self.text().ends_with('\n'));
        assert!(self.headers.contains_key("x-request-id"));
    }
}
pub mod tls;
