//! Checking expectations: real HTTP/1.1 requests to weir and what answered them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use weir_dataplane::echo::EchoResponse;

use crate::scenario::{Expect, Scenario};

/// How long one request may take, head and body.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// An answer from weir, as far as the expectations care.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    /// The echo replica that answered, when the body is an echo description.
    echo: Option<String>,
    /// What the echo replica received, when it answered.
    seen: Option<EchoResponse>,
    /// The response headers.
    headers: http::HeaderMap,
    /// The start of the body, for messages.
    excerpt: String,
    /// A gRPC call that failed: its status code and message.
    grpc_error: Option<String>,
}

/// `upstream_header_names_backend`: what is wrong with the header the answering replica
/// received (`None`: nothing, or no such expectation, or no echo answered).
fn names_backend(expect: &Expect, answer: &Answer) -> Option<String> {
    let header = expect.upstream_header_names_backend.as_ref()?;
    let replica = answer.echo.as_ref()?;
    let got = answer.seen.as_ref().and_then(|seen| seen.headers.get(&header.to_ascii_lowercase()).cloned());
    match &got {
        Some(backend) if replica.strip_prefix(backend.as_str()).is_some_and(|rest| rest.starts_with('-')) => {
            None
        }
        _ => Some(format!("{replica} to receive {header} naming its backend (it got {got:?})")),
    }
}

impl Answer {
    fn describe(&self) -> String {
        match (&self.echo, &self.grpc_error) {
            (_, Some(error)) => format!("gRPC error {error}"),
            (Some(name), None) => format!("{} from echo {name}", self.status.as_u16()),
            (None, None) => format!("{} from weir (body {:?})", self.status.as_u16(), self.excerpt),
        }
    }
}

/// Sends requests to weir's HTTP listener.
#[derive(Clone, Debug)]
pub struct Checker {
    client: Client<HttpConnector, Full<Bytes>>,
    weir: SocketAddr,
}

impl Checker {
    /// A checker for weir listening on `weir`.
    pub fn new(weir: SocketAddr) -> Checker {
        let client = Client::builder(TokioExecutor::new()).build_http();
        Checker { client, weir }
    }

    /// Checks one expectation; `Err` says what was wrong.
    pub async fn check(&self, scenario: &Scenario, expect: &Expect) -> Result<(), String> {
        let wanted = |references: &[String]| -> BTreeSet<String> {
            references.iter().filter_map(|r| scenario.resolve(r)).flatten().collect()
        };
        if let Some(distribution) = &expect.distribution {
            return self
                .check_distribution(scenario, expect, distribution.requests, &distribution.backends)
                .await;
        }
        let answer = self.send(expect).await?;
        let mut problems = Vec::new();
        if answer.status.as_u16() != expect.status {
            problems.push(format!("status {}", expect.status));
        }
        let allowed: Option<(String, BTreeSet<String>)> = if let Some(backend) = &expect.backend {
            Some((format!("backend {backend}"), wanted(std::slice::from_ref(backend))))
        } else if !expect.any_of.is_empty() {
            Some((format!("one of {}", expect.any_of.join(", ")), wanted(&expect.any_of)))
        } else {
            None
        };
        match (&allowed, &answer.echo) {
            (Some((label, names)), Some(echo)) if !names.contains(echo) => {
                problems.push(format!("an answer from {label}"));
            }
            (Some((label, _)), None) => problems.push(format!("an answer from {label}")),
            (None, Some(_)) => problems.push("an answer from weir itself".to_owned()),
            _ => {}
        }
        for (name, value) in &expect.response_headers {
            let got =
                answer.headers.get(name.as_str()).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            if got.as_deref() != Some(value.as_str()) {
                problems.push(format!("response header {name}: {value:?} (got {got:?})"));
            }
        }
        for name in &expect.response_headers_absent {
            if let Some(value) = answer.headers.get(name.as_str()) {
                problems.push(format!("no response header {name} (got {value:?})"));
            }
        }
        for name in &expect.upstream_headers_absent {
            let got = answer.seen.as_ref().and_then(|seen| seen.headers.get(&name.to_ascii_lowercase()));
            if let Some(value) = got {
                problems.push(format!("the backend not to receive {name} (it got {value:?})"));
            }
        }
        for (name, value) in &expect.upstream_headers {
            let got =
                answer.seen.as_ref().and_then(|seen| seen.headers.get(&name.to_ascii_lowercase()).cloned());
            if got.as_deref() != Some(value.as_str()) {
                problems.push(format!("the backend to receive {name}: {value:?} (it got {got:?})"));
            }
        }
        if let Some(problem) = names_backend(expect, &answer) {
            problems.push(problem);
        }
        if let Some(want) = &expect.upstream_path {
            let got = answer.seen.as_ref().map(|seen| match &seen.query {
                Some(query) => format!("{}?{query}", seen.path),
                None => seen.path.clone(),
            });
            if got.as_deref() != Some(want.as_str()) {
                problems.push(format!("the backend to receive path {want:?} (it got {got:?})"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!("expected {}, got {}", problems.join(" and "), answer.describe()))
        }
    }

    async fn check_distribution(
        &self,
        scenario: &Scenario,
        expect: &Expect,
        requests: u32,
        backends: &[String],
    ) -> Result<(), String> {
        let mut seen: BTreeMap<String, u32> = BTreeMap::new();
        let mut unexpected = Vec::new();
        for _ in 0..requests {
            let answer = self.send(expect).await?;
            if let Some(problem) = names_backend(expect, &answer) {
                unexpected.push(format!("{problem}, got {}", answer.describe()));
                continue;
            }
            let matches = answer.status.as_u16() == expect.status && answer.echo.is_some();
            match answer.echo {
                Some(name) if matches => *seen.entry(name).or_default() += 1,
                _ => unexpected.push(answer.describe()),
            }
        }
        let mut problems = Vec::new();
        if !unexpected.is_empty() {
            unexpected.dedup();
            problems.push(format!(
                "{} answers were not {} from an echo backend: {}",
                unexpected.len(),
                expect.status,
                unexpected.join("; ")
            ));
        }
        let mut allowed = BTreeSet::new();
        for reference in backends {
            let names = scenario.resolve(reference).unwrap_or_default();
            for name in names.iter().filter(|n| !seen.contains_key(*n)) {
                problems.push(format!("{name} never answered"));
            }
            allowed.extend(names);
        }
        let strangers: Vec<&String> = seen.keys().filter(|n| !allowed.contains(*n)).collect();
        if !strangers.is_empty() {
            problems.push(format!(
                "unexpected answers from {}",
                strangers.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "over {requests} requests expected answers from each of [{}]; {} (answers per replica: {seen:?})",
                backends.join(", "),
                problems.join("; ")
            ))
        }
    }

    /// Sends the request of `expect` once.
    async fn send(&self, expect: &Expect) -> Result<Answer, String> {
        if expect.grpc {
            return tokio::time::timeout(REQUEST_TIMEOUT, self.send_grpc(expect))
                .await
                .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?;
        }
        if expect.raw {
            return tokio::time::timeout(REQUEST_TIMEOUT, self.send_raw(expect))
                .await
                .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))?;
        }
        let method = Method::from_bytes(expect.method.as_bytes())
            .map_err(|error| format!("invalid method: {error}"))?;
        let mut request =
            Request::builder().method(method).uri(format!("http://{}{}", self.weir, expect.path));
        if let Some(host) = &expect.host {
            request = request.header(http::header::HOST, host.as_str());
        }
        for (name, value) in &expect.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|error| format!("invalid header name {name:?}: {error}"))?;
            let value = HeaderValue::from_str(value)
                .map_err(|error| format!("invalid header value {value:?}: {error}"))?;
            request = request.header(name, value);
        }
        let body = Full::new(Bytes::from(vec![b'x'; expect.body_bytes]));
        let request = request.body(body).map_err(|error| format!("cannot build the request: {error}"))?;

        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| format!("request failed: {}", chain(&error)))?;
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|error| format!("reading the response body failed: {error}"))?
                .to_bytes();
            Ok::<_, String>((parts.status, parts.headers, body))
        };
        let (status, headers, body) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("no answer within {REQUEST_TIMEOUT:?}"))??;
        let body = decoded(&headers, &body)?;
        let seen = serde_json::from_slice::<EchoResponse>(&body).ok();
        let echo = seen.as_ref().map(|echo| echo.name.clone());
        let excerpt = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
        Ok(Answer { status, echo, seen, headers, excerpt, grpc_error: None })
    }
}

// === gRPC calls ===

/// The message of the gRPC calls: field 1, a string (empty in calls; the echo backend's JSON
/// description in its answers).
#[derive(Clone, PartialEq, prost::Message)]
struct GrpcText {
    #[prost(string, tag = "1")]
    text: String,
}

impl Checker {
    /// Makes the unary gRPC call of a `grpc` expectation with tonic over h2c prior knowledge,
    /// on a new connection to weir whose `:authority` is the expectation's host.
    async fn send_grpc(&self, expect: &Expect) -> Result<Answer, String> {
        let weir = self.weir;
        let authority = expect.host.clone().unwrap_or_else(|| weir.to_string());
        let connector = tower::service_fn(move |_: http::Uri| async move {
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::TcpStream::connect(weir).await?))
        });
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|error| format!("invalid host {authority:?}: {error}"))?
            .connect_with_connector(connector)
            .await
            .map_err(|error| format!("cannot connect to weir: {}", chain(&error)))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|error| format!("the gRPC channel is not ready: {}", chain(&error)))?;
        let mut request = tonic::Request::new(GrpcText::default());
        for (name, value) in &expect.headers {
            let key = tonic::metadata::MetadataKey::from_bytes(name.as_bytes())
                .map_err(|error| format!("invalid metadata name {name:?}: {error}"))?;
            let value = tonic::metadata::MetadataValue::try_from(value.as_str())
                .map_err(|error| format!("invalid metadata value {value:?}: {error}"))?;
            request.metadata_mut().insert(key, value);
        }
        let path = http::uri::PathAndQuery::try_from(expect.path.as_str())
            .map_err(|error| format!("invalid gRPC path {:?}: {error}", expect.path))?;
        let codec = tonic_prost::ProstCodec::<GrpcText, GrpcText>::default();
        match grpc.unary(request, path, codec).await {
            Ok(response) => {
                let headers = response.metadata().clone().into_headers();
                let text = response.into_inner().text;
                let seen = serde_json::from_str::<EchoResponse>(&text).ok();
                let echo = seen.as_ref().map(|echo| echo.name.clone());
                let excerpt = text.chars().take(120).collect();
                Ok(Answer { status: StatusCode::OK, echo, seen, headers, excerpt, grpc_error: None })
            }
            Err(status) => Ok(Answer {
                status: StatusCode::OK,
                echo: None,
                seen: None,
                headers: status.metadata().clone().into_headers(),
                excerpt: String::new(),
                grpc_error: Some(format!("{:?}: {}", status.code(), status.message())),
            }),
        }
    }
}

// === raw requests ===

impl Checker {
    /// Writes the request of a `raw` expectation byte for byte and reads the answer to the end
    /// (the request says `Connection: close`).
    async fn send_raw(&self, expect: &Expect) -> Result<Answer, String> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let host = expect.host.clone().unwrap_or_else(|| self.weir.to_string());
        let target =
            if expect.absolute_form { format!("http://{host}{}", expect.path) } else { expect.path.clone() };
        let mut head = format!("{} {target} HTTP/1.1\r\nHost: {host}\r\n", expect.method);
        for (name, value) in &expect.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        for line in &expect.raw_headers {
            head.push_str(line);
            head.push_str("\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", expect.body_bytes));
        let mut stream = tokio::net::TcpStream::connect(self.weir)
            .await
            .map_err(|error| format!("cannot connect to weir: {error}"))?;
        let mut request = head.into_bytes();
        request.resize(request.len() + expect.body_bytes, b'x');
        stream.write_all(&request).await.map_err(|error| format!("cannot send the request: {error}"))?;
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .map_err(|error| format!("reading the answer failed: {error}"))?;
        parse_raw(&answer)
    }
}

/// Parses an HTTP/1.1 response read to the end of the connection (length-delimited, chunked or
/// closed).
fn parse_raw(answer: &[u8]) -> Result<Answer, String> {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) =
        answer.windows(4).position(|w| w == b"\r\n\r\n").map(|at| (&text[..at], &answer[at + 4..]))
    else {
        return Err(format!("no complete response head in {:?}", &text[..text.len().min(200)]));
    };
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut headers = http::HeaderMap::new();
    for line in lines {
        let (name, value) = line.split_once(':').ok_or_else(|| format!("bad header line {line:?}"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|e| format!("{line:?}: {e}"))?;
        let value = HeaderValue::from_str(value.trim()).map_err(|e| format!("{line:?}: {e}"))?;
        headers.append(name, value);
    }
    let chunked = headers
        .get(http::header::TRANSFER_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    let body = if chunked { dechunk(body)? } else { body.to_vec() };
    let body = decoded(&headers, &body)?;
    let seen = serde_json::from_slice::<EchoResponse>(&body).ok();
    let echo = seen.as_ref().map(|echo| echo.name.clone());
    let excerpt = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
    Ok(Answer { status, echo, seen, headers, excerpt, grpc_error: None })
}

/// The body as the application sent it: undoes a `Content-Encoding` weir applied (gzip, br,
/// zstd), as a browser would.
fn decoded(headers: &http::HeaderMap, body: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let coding = headers.get(http::header::CONTENT_ENCODING).map(|v| v.as_bytes().to_ascii_lowercase());
    let mut out = Vec::new();
    let result = match coding.as_deref() {
        None => return Ok(body.to_vec()),
        Some(b"gzip") => flate2::read::GzDecoder::new(body).read_to_end(&mut out),
        Some(b"br") => brotli::Decompressor::new(body, 4096).read_to_end(&mut out),
        Some(b"zstd") => zstd::stream::read::Decoder::new(body).and_then(|mut d| d.read_to_end(&mut out)),
        // Not weir's doing: left as it came.
        Some(_) => return Ok(body.to_vec()),
    };
    result.map(|_| out).map_err(|e| format!("the body does not decode as its Content-Encoding says: {e}"))
}

/// The payload of a chunked body.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end =
            body.windows(2).position(|w| w == b"\r\n").ok_or("a chunk size line without its end")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim().to_owned();
        let size =
            usize::from_str_radix(&size_text, 16).map_err(|e| format!("chunk size {size_text:?}: {e}"))?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = body.get(..size).ok_or("a chunk shorter than its size")?;
        out.extend_from_slice(chunk);
        body = body.get(size + 2..).ok_or("a chunk without its end")?;
    }
}

/// An error with its sources, `outer: inner: innermost`.
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        out.push_str(": ");
        out.push_str(&inner.to_string());
        source = inner.source();
    }
    out
}
