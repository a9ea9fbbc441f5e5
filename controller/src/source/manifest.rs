//! Parsing YAML manifests into typed Kubernetes objects.
//!
//! A manifest file holds any number of `---`-separated documents; a document may also be a
//! `kind: List` (or a typed list such as `IngressList`) whose `items` are objects. Objects of the
//! kinds weir reads are parsed into their k8s-openapi types and normalised the way the API server
//! would store them (namespace defaulted, Secret `stringData` merged into `data`); every other
//! kind is kept as [`Object::Other`] so callers can say what they skipped.
//!
//! Errors carry the 1-based line (and column where known) within the whole file, so an editor
//! can jump to them, and a reason naming the object when it is known.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_saphyr::{MessageFormatter, Spanned};

use super::trim::Trim;
use crate::snapshot::Object;

/// Errors of manifest parsing. Lines and columns are 1-based and count from the start of the
/// text given to [`parse_manifests`], whichever document the problem is in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The text is not well-formed YAML.
    #[error("{}{reason}", at(*.line, *.column))]
    Syntax {
        /// Line of the problem.
        line: Option<usize>,
        /// Column of the problem.
        column: Option<usize>,
        /// What the YAML parser says.
        reason: String,
    },
    /// A document is not a Kubernetes object (not a mapping, or no `apiVersion`/`kind`).
    #[error("{}{reason}", at(Some(*.line), None))]
    NotAnObject {
        /// First line of the document.
        line: usize,
        /// What is missing.
        reason: String,
    },
    /// An object does not match the schema of its kind.
    #[error("{}{object}: {reason}", at(*.line, *.column))]
    Invalid {
        /// Line of the problem.
        line: Option<usize>,
        /// Column of the problem.
        column: Option<usize>,
        /// The object: `Ingress default/web`, or only its kind when the name is unknown.
        object: String,
        /// What the deserializer says.
        reason: String,
    },
    /// An object without `metadata.name`.
    #[error("{}{kind} without metadata.name", at(Some(*.line), None))]
    MissingName {
        /// First line of the object.
        line: usize,
        /// Its kind.
        kind: String,
    },
}

/// A `Result` of this module.
pub type Result<T, E = ManifestError> = std::result::Result<T, E>;

fn at(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("line {l}, column {c}: "),
        (Some(l), None) => format!("line {l}: "),
        _ => String::new(),
    }
}

impl ManifestError {
    /// The 1-based line of the problem, where known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ManifestError::Syntax { line, .. } | ManifestError::Invalid { line, .. } => *line,
            ManifestError::NotAnObject { line, .. } | ManifestError::MissingName { line, .. } => Some(*line),
        }
    }

    /// The 1-based column of the problem, where known.
    pub fn column(&self) -> Option<usize> {
        match self {
            ManifestError::Syntax { column, .. } | ManifestError::Invalid { column, .. } => *column,
            ManifestError::NotAnObject { .. } | ManifestError::MissingName { .. } => None,
        }
    }

    /// What is wrong, without the position.
    pub fn reason(&self) -> String {
        match self {
            ManifestError::Syntax { reason, .. } | ManifestError::NotAnObject { reason, .. } => {
                reason.clone()
            }
            ManifestError::Invalid { object, reason, .. } => format!("{object}: {reason}"),
            ManifestError::MissingName { kind, .. } => format!("{kind} without metadata.name"),
        }
    }
}

// === parsing ===

/// The kinds weir reads, by `apiVersion` and `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Ingress,
    IngressClass,
    Service,
    EndpointSlice,
    Endpoints,
    Secret,
    ConfigMap,
    GatewayClass,
    Gateway,
    HttpRoute,
    GrpcRoute,
    TlsRoute,
    ListenerSet,
    ReferenceGrant,
    Namespace,
}

impl Known {
    fn lookup(api_version: &str, kind: &str) -> Option<Self> {
        Some(match (api_version, kind) {
            ("networking.k8s.io/v1", "Ingress") => Known::Ingress,
            ("networking.k8s.io/v1", "IngressClass") => Known::IngressClass,
            ("v1", "Service") => Known::Service,
            ("discovery.k8s.io/v1", "EndpointSlice") => Known::EndpointSlice,
            ("v1", "Endpoints") => Known::Endpoints,
            ("v1", "Secret") => Known::Secret,
            ("v1", "ConfigMap") => Known::ConfigMap,
            ("v1", "Namespace") => Known::Namespace,
            (version, kind) if crate::gateway::accepted_version(version, kind) => match kind {
                "GatewayClass" => Known::GatewayClass,
                "Gateway" => Known::Gateway,
                "HTTPRoute" => Known::HttpRoute,
                "GRPCRoute" => Known::GrpcRoute,
                "TLSRoute" => Known::TlsRoute,
                "ListenerSet" => Known::ListenerSet,
                "ReferenceGrant" => Known::ReferenceGrant,
                _ => return None,
            },
            _ => return None,
        })
    }

    fn namespaced(self) -> bool {
        !matches!(self, Known::IngressClass | Known::GatewayClass | Known::Namespace)
    }
}

/// What a document says it is: `apiVersion`, `kind` and `metadata.name`/`namespace`.
struct Identity {
    api_version: String,
    kind: String,
    name: Option<String>,
    namespace: Option<String>,
}

impl Identity {
    /// `None` when `apiVersion` or `kind` is missing.
    fn of(map: &serde_json::Map<String, serde_json::Value>) -> Option<Self> {
        fn text(v: Option<&serde_json::Value>) -> Option<&str> {
            v.and_then(|v| v.as_str()).filter(|s| !s.is_empty())
        }
        let meta = map.get("metadata");
        Some(Identity {
            api_version: text(map.get("apiVersion"))?.to_string(),
            kind: text(map.get("kind"))?.to_string(),
            name: text(meta.and_then(|m| m.get("name"))).map(str::to_string),
            namespace: text(meta.and_then(|m| m.get("namespace"))).map(str::to_string),
        })
    }

    /// `Ingress default/web` (namespace defaulted as it will be), or only the kind without a name.
    fn describe(&self, known: Known) -> String {
        match &self.name {
            Some(name) if known.namespaced() => {
                format!("{} {}/{name}", self.kind, self.namespace.as_deref().unwrap_or("default"))
            }
            Some(name) => format!("{} {name}", self.kind),
            None => self.kind.clone(),
        }
    }
}

/// A list document: its items, each with the line it starts on.
#[derive(Deserialize)]
struct ListDoc {
    #[serde(default)]
    items: Option<Vec<Spanned<serde_json::Value>>>,
}

/// Parses every object of a (multi-document) YAML manifest, in document order.
///
/// Empty documents are skipped; `kind: List` documents contribute their items. Namespaced
/// objects without a namespace get `default`.
pub fn parse_manifests(text: &str) -> Result<Vec<Object>> {
    let mut out = Vec::new();
    for doc in split_documents(text) {
        parse_document(&doc, &mut out)?;
    }
    Ok(out)
}

/// One document's text and the number of lines before it in the file.
struct Document<'a> {
    text: &'a str,
    line_offset: usize,
}

/// Splits a YAML stream at its document markers (`---` starts a document, `...` ends one).
/// Markers are only recognised at the start of a line, where YAML forbids them inside content.
fn split_documents(text: &str) -> Vec<Document<'_>> {
    let is_marker = |line: &str, marker: &str| {
        line.strip_prefix(marker).is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r']))
    };
    let mut docs = Vec::new();
    let mut start = 0usize; // byte offset of the current document
    let mut start_line = 0usize; // lines before it
    let mut offset = 0usize;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches('\n');
        if is_marker(bare, "---") && offset > start {
            docs.push(Document { text: &text[start..offset], line_offset: start_line });
            start = offset;
            start_line = index;
        }
        offset += line.len();
        if is_marker(bare, "...") {
            docs.push(Document { text: &text[start..offset], line_offset: start_line });
            start = offset;
            start_line = index + 1;
        }
    }
    if offset > start {
        docs.push(Document { text: &text[start..], line_offset: start_line });
    }
    docs
}

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! { with_snippet: false }
}

/// The deserializer's message without its position (positions are reported separately).
fn message(err: &serde_saphyr::Error) -> String {
    let inner = err.without_snippet();
    let msg = serde_saphyr::DefaultMessageFormatter.format_message(inner);
    msg.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

fn position(err: &serde_saphyr::Error, line_offset: usize) -> (Option<usize>, Option<usize>) {
    match err.location() {
        Some(loc) if loc.line() > 0 => (
            Some(usize::try_from(loc.line()).unwrap_or(usize::MAX).saturating_add(line_offset)),
            usize::try_from(loc.column()).ok().filter(|c| *c > 0),
        ),
        _ => (None, None),
    }
}

/// The field path (`spec.rules[0].http`) of the last key on `line` (1-based, within `text`),
/// for messages. Block-style YAML only: `None` when the line is in flow style or holds no key.
fn field_path(text: &str, line: usize) -> Option<String> {
    enum Segment {
        Key(String),
        Item(usize),
    }
    // Path segments with the column they start at.
    let mut stack: Vec<(usize, Segment)> = Vec::new();
    // While inside a block scalar (`key: |`), lines indented deeper than this are text.
    let mut scalar_indent: Option<usize> = None;
    let mut key_on_line = false;
    for (index, raw) in text.lines().enumerate().take(line) {
        let trimmed = raw.trim_start_matches(' ');
        let mut column = raw.len() - trimmed.len();
        if let Some(indent) = scalar_indent {
            if trimmed.is_empty() || column > indent {
                continue;
            }
            scalar_indent = None;
        }
        if trimmed.is_empty()
            || trimmed.starts_with('#')
            || trimmed.starts_with("---")
            || trimmed.starts_with('%')
        {
            continue;
        }
        let is_last = index + 1 == line;
        let mut rest = trimmed;
        loop {
            if rest == "-" || rest.starts_with("- ") {
                stack.retain(|(c, _)| *c <= column);
                match stack.last_mut() {
                    Some((c, Segment::Item(i))) if *c == column => *i += 1,
                    _ => stack.push((column, Segment::Item(0))),
                }
                let after = rest[1..].trim_start_matches(' ');
                column += rest.len() - after.len();
                rest = after;
                if is_last {
                    key_on_line = true;
                }
                continue;
            }
            if rest.starts_with(['{', '[', '"', '\'', '|', '>', '&', '*', '!']) {
                break; // flow style, quoted keys, scalars, anchors: not followed
            }
            let Some((key, value)) =
                rest.split_once(": ").or_else(|| rest.strip_suffix(':').map(|k| (k, "")))
            else {
                break;
            };
            stack.retain(|(c, _)| *c < column);
            stack.push((column, Segment::Key(key.trim_end().to_string())));
            if is_last {
                key_on_line = true;
            }
            let value = value.trim();
            if value.starts_with('|') || value.starts_with('>') {
                scalar_indent = Some(column);
            }
            break;
        }
    }
    if !key_on_line || stack.is_empty() {
        return None;
    }
    let mut path = String::new();
    for (_, segment) in &stack {
        match segment {
            Segment::Key(k) if path.is_empty() => path.push_str(k),
            Segment::Key(k) => {
                path.push('.');
                path.push_str(k);
            }
            Segment::Item(i) => path.push_str(&format!("[{i}]")),
        }
    }
    Some(path)
}

fn first_content_line(doc: &Document<'_>) -> usize {
    let skip = doc
        .text
        .lines()
        .position(|l| {
            let t = l.trim();
            !(t.is_empty() || t.starts_with('#') || t == "---" || t.starts_with("%"))
        })
        .unwrap_or(0);
    doc.line_offset + skip + 1
}

fn parse_document(doc: &Document<'_>, out: &mut Vec<Object>) -> Result<()> {
    let syntax = |e: serde_saphyr::Error| {
        let (line, column) = position(&e, doc.line_offset);
        ManifestError::Syntax { line, column, reason: message(&e) }
    };
    // Whether the document is empty (only comments, or null).
    let value: Option<serde_json::Value> =
        serde_saphyr::from_str_with_options(doc.text, options()).map_err(syntax)?;
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let line = first_content_line(doc);
    let Some(map) = value.as_object() else {
        return Err(ManifestError::NotAnObject {
            line,
            reason: "a manifest document must be a mapping with apiVersion and kind".into(),
        });
    };
    let Some(id) = Identity::of(map) else {
        return Err(ManifestError::NotAnObject {
            line,
            reason: "a manifest document needs apiVersion and kind".into(),
        });
    };
    if let Some(item_kind) = list_item_kind(&id.api_version, &id.kind) {
        let list: ListDoc = serde_saphyr::from_str_with_options(doc.text, options()).map_err(|e| {
            let (line, column) = position(&e, doc.line_offset);
            ManifestError::Invalid { line, column, object: id.kind.clone(), reason: message(&e) }
        })?;
        for (index, item) in list.items.unwrap_or_default().into_iter().enumerate() {
            let item_line = usize::try_from(item.referenced.line())
                .ok()
                .filter(|l| *l > 0)
                .map_or(line, |l| l + doc.line_offset);
            parse_list_item(item.value, item_kind, &id, index, item_line, out)?;
        }
        return Ok(());
    }
    let Some(known) = Known::lookup(&id.api_version, &id.kind) else {
        out.push(Object::Other { api_version: id.api_version, kind: id.kind });
        return Ok(());
    };
    if id.name.is_none() {
        return Err(ManifestError::MissingName { line, kind: id.kind });
    }
    // The document is already parsed: decode the value. Only when that fails is the text
    // decoded again, for the error's position and for what only YAML's own typing accepts.
    if let Ok(object) = decode_known(known, JsonValue(value)) {
        out.push(normalise(object, known));
        return Ok(());
    }
    let object = decode_known(known, YamlText(doc.text)).map_err(|e| {
        let (line, column) = position(&e, doc.line_offset);
        let path = line.and_then(|l| field_path(doc.text, l.saturating_sub(doc.line_offset)));
        let reason = match path {
            Some(path) => format!("{path}: {}", message(&e)),
            None => message(&e),
        };
        ManifestError::Invalid { line, column, object: id.describe(known), reason }
    })?;
    out.push(normalise(object, known));
    Ok(())
}

/// For `kind: List` (`apiVersion: v1`), `Some(None)`: items name their own kind. For a typed list
/// (`IngressList`...), `Some(Some(kind))`: items may omit `apiVersion`/`kind`.
fn list_item_kind(api_version: &str, kind: &str) -> Option<Option<&'static str>> {
    if kind == "List" {
        return Some(None);
    }
    let item = kind.strip_suffix("List")?;
    let known = Known::lookup(api_version, item)?;
    Some(Some(match known {
        Known::Ingress => "Ingress",
        Known::IngressClass => "IngressClass",
        Known::Service => "Service",
        Known::EndpointSlice => "EndpointSlice",
        Known::Endpoints => "Endpoints",
        Known::Secret => "Secret",
        Known::ConfigMap => "ConfigMap",
        Known::GatewayClass => "GatewayClass",
        Known::Gateway => "Gateway",
        Known::HttpRoute => "HTTPRoute",
        Known::GrpcRoute => "GRPCRoute",
        Known::TlsRoute => "TLSRoute",
        Known::ListenerSet => "ListenerSet",
        Known::ReferenceGrant => "ReferenceGrant",
        Known::Namespace => "Namespace",
    }))
}

fn parse_list_item(
    mut value: serde_json::Value,
    item_kind: Option<&'static str>,
    list: &Identity,
    index: usize,
    line: usize,
    out: &mut Vec<Object>,
) -> Result<()> {
    let list_kind = &list.kind;
    let Some(map) = value.as_object_mut() else {
        return Err(ManifestError::NotAnObject {
            line,
            reason: format!("{list_kind} items[{index}] is not a mapping"),
        });
    };
    if let Some(kind) = item_kind {
        map.entry("apiVersion").or_insert_with(|| list.api_version.clone().into());
        map.entry("kind").or_insert_with(|| kind.into());
    }
    let Some(id) = Identity::of(map) else {
        return Err(ManifestError::NotAnObject {
            line,
            reason: format!("{list_kind} items[{index}] needs apiVersion and kind"),
        });
    };
    let Some(known) = Known::lookup(&id.api_version, &id.kind) else {
        out.push(Object::Other { api_version: id.api_version, kind: id.kind });
        return Ok(());
    };
    if id.name.is_none() {
        return Err(ManifestError::MissingName { line, kind: id.kind });
    }
    // JSON values carry no positions: the item's first line is reported.
    let object = decode_known(known, JsonValue(value)).map_err(|e| ManifestError::Invalid {
        line: Some(line),
        column: None,
        object: format!("{list_kind} items[{index}] ({})", id.describe(known)),
        reason: e.to_string(),
    })?;
    out.push(normalise(object, known));
    Ok(())
}

/// Deserializes one object of a known kind from some source (a YAML document, a JSON value).
trait Decode {
    /// The source's error.
    type Error;
    /// Deserializes a `T`.
    fn decode<T: DeserializeOwned>(self) -> std::result::Result<T, Self::Error>;
}

fn decode_known<D: Decode>(known: Known, d: D) -> std::result::Result<Object, D::Error> {
    Ok(match known {
        Known::Ingress => Object::Ingress(Box::new(d.decode()?)),
        Known::IngressClass => Object::IngressClass(Box::new(d.decode()?)),
        Known::Service => Object::Service(Box::new(d.decode()?)),
        Known::EndpointSlice => Object::EndpointSlice(Box::new(d.decode()?)),
        Known::Endpoints => Object::Endpoints(Box::new(d.decode()?)),
        Known::Secret => Object::Secret(Box::new(d.decode()?)),
        Known::ConfigMap => Object::ConfigMap(Box::new(d.decode()?)),
        Known::GatewayClass => Object::GatewayClass(Box::new(d.decode()?)),
        Known::Gateway => Object::Gateway(Box::new(d.decode()?)),
        Known::HttpRoute => Object::HttpRoute(Box::new(d.decode()?)),
        Known::GrpcRoute => Object::GrpcRoute(Box::new(d.decode()?)),
        Known::TlsRoute => Object::TlsRoute(Box::new(d.decode()?)),
        Known::ListenerSet => Object::ListenerSet(Box::new(d.decode()?)),
        Known::ReferenceGrant => Object::ReferenceGrant(Box::new(d.decode()?)),
        Known::Namespace => Object::Namespace(Box::new(d.decode()?)),
    })
}

struct YamlText<'a>(&'a str);

impl Decode for YamlText<'_> {
    type Error = serde_saphyr::Error;
    fn decode<T: DeserializeOwned>(self) -> std::result::Result<T, Self::Error> {
        serde_saphyr::from_str_with_options(self.0, options())
    }
}

struct JsonValue(serde_json::Value);

impl Decode for JsonValue {
    type Error = serde_json::Error;
    fn decode<T: DeserializeOwned>(self) -> std::result::Result<T, Self::Error> {
        serde_json::from_value(self.0)
    }
}

/// Stores the object the way the API server would: namespace defaulted, `stringData` merged.
fn normalise(mut object: Object, known: Known) -> Object {
    if known.namespaced() {
        let meta = match &mut object {
            Object::Ingress(o) => &mut o.metadata,
            Object::Service(o) => &mut o.metadata,
            Object::EndpointSlice(o) => &mut o.metadata,
            Object::Endpoints(o) => &mut o.metadata,
            Object::Secret(o) => &mut o.metadata,
            Object::ConfigMap(o) => &mut o.metadata,
            Object::Gateway(o) => &mut o.metadata,
            Object::HttpRoute(o) => &mut o.metadata,
            Object::GrpcRoute(o) => &mut o.metadata,
            Object::TlsRoute(o) => &mut o.metadata,
            Object::ListenerSet(o) => &mut o.metadata,
            Object::ReferenceGrant(o) => &mut o.metadata,
            Object::IngressClass(_)
            | Object::GatewayClass(_)
            | Object::Namespace(_)
            | Object::Other { .. } => return object,
        };
        if meta.namespace.as_deref().is_none_or(str::is_empty) {
            meta.namespace = Some("default".to_string());
        }
    }
    if let Object::Secret(secret) = &mut object
        && let Some(string_data) = secret.string_data.take()
    {
        let data = secret.data.get_or_insert_with(BTreeMap::new);
        for (key, value) in string_data {
            data.insert(key, ByteString(value.into_bytes()));
        }
    }
    // What nothing reads goes now, as the API source's reflectors drop it (`super::trim`).
    match &mut object {
        Object::Ingress(o) => o.trim(),
        Object::IngressClass(o) => o.trim(),
        Object::Service(o) => o.trim(),
        Object::EndpointSlice(o) => o.trim(),
        Object::Endpoints(o) => o.trim(),
        Object::Secret(o) => o.trim(),
        Object::ConfigMap(o) => o.trim(),
        Object::GatewayClass(o) => o.trim(),
        Object::Gateway(o) => o.trim(),
        Object::HttpRoute(o) => o.trim(),
        Object::GrpcRoute(o) => o.trim(),
        Object::TlsRoute(o) => o.trim(),
        Object::ListenerSet(o) => o.trim(),
        Object::ReferenceGrant(o) => o.trim(),
        Object::Namespace(o) => o.trim(),
        Object::Other { .. } => {}
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    const INGRESS: &str = "\
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
spec:
  rules:
  - host: example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: web
            port:
              number: 80
";

    #[test]
    fn multi_document_dispatch_and_default_namespace() {
        let text = format!(
            "# leading comment\n{INGRESS}---\n---\n# only a comment\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: prod\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n---\napiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: weir\nspec:\n  controller: weir.dev/ingress-controller\n"
        );
        let objects = parse_manifests(&text).unwrap();
        let described: Vec<String> = objects.iter().map(Object::describe).collect();
        assert_eq!(
            described,
            ["Ingress default/web", "Service prod/web", "apps/v1 Deployment", "IngressClass weir"],
        );
        let Object::IngressClass(class) = &objects[3] else { panic!("{objects:?}") };
        assert_eq!(class.metadata.namespace, None, "cluster-scoped objects get no namespace");
    }

    #[test]
    fn all_kinds_parse() {
        let text = "\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses: [10.0.0.1]
  conditions: {ready: true}
ports:
- name: http
  port: 8080
---
apiVersion: v1
kind: Endpoints
metadata:
  name: web
subsets:
- addresses: [{ip: 10.0.0.1}]
  ports: [{port: 8080}]
";
        let objects = parse_manifests(text).unwrap();
        assert!(matches!(objects[0], Object::EndpointSlice(_)), "{objects:?}");
        assert!(matches!(objects[1], Object::Endpoints(_)), "{objects:?}");
    }

    #[test]
    fn secret_string_data_is_merged_into_data() {
        let text = "\
apiVersion: v1
kind: Secret
metadata:
  name: tls
type: kubernetes.io/tls
data:
  tls.crt: Y2VydA==
  tls.key: b2xk
stringData:
  tls.key: new
";
        let objects = parse_manifests(text).unwrap();
        let Object::Secret(secret) = &objects[0] else { panic!("{objects:?}") };
        assert_eq!(secret.string_data, None);
        let data = secret.data.as_ref().unwrap();
        assert_eq!(data["tls.crt"].0, b"cert");
        assert_eq!(data["tls.key"].0, b"new", "stringData wins over data, as on the API server");
    }

    #[test]
    fn list_items_are_objects() {
        let text = "\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata:
    name: a
- apiVersion: v1
  kind: Deployment
  metadata:
    name: b
---
apiVersion: v1
kind: ServiceList
items:
- metadata:
    name: c
    namespace: other
";
        let objects = parse_manifests(text).unwrap();
        let described: Vec<String> = objects.iter().map(Object::describe).collect();
        assert_eq!(described, ["Service default/a", "v1 Deployment", "Service other/c"]);
    }

    #[test]
    fn error_in_third_document_has_absolute_line() {
        let text = format!(
            "{INGRESS}---\napiVersion: v1\nkind: Service\nmetadata:\n  name: a\n---\n{}",
            INGRESS.replace("number: 80", "number: eighty")
        );
        let err = parse_manifests(&text).unwrap_err();
        // The third document's first line follows the first (16 lines), its `---`, the second
        // (4 lines) and its `---`; `number: eighty` is the document's 16th line.
        let third_start = INGRESS.lines().count() + 1 + 4 + 1 + 1;
        assert_eq!(third_start, 23);
        assert_eq!(err.line(), Some(third_start + 15), "{err}");
        assert_eq!(err.column(), Some(23), "{err}");
        let reason = err.reason();
        assert!(reason.starts_with("Ingress default/web: "), "{reason}");
        assert_eq!(
            reason,
            "Ingress default/web: spec.rules[0].http.paths[0].backend.service.port.number: invalid i32"
        );
        assert!(err.to_string().starts_with("line 38, column 23: Ingress default/web: "), "{err}");
    }

    #[test]
    fn field_paths_follow_block_yaml() {
        let text = "---\nspec:\n  a: |\n    x: 1\n  rules:\n  - host: a\n  - host: b\n    http:\n      paths:\n      - - x\n        - y: 1\n  tls: []\n";
        let at = |line| field_path(text, line);
        assert_eq!(at(2).as_deref(), Some("spec"));
        assert_eq!(at(4).as_deref(), None, "inside a block scalar");
        assert_eq!(at(6).as_deref(), Some("spec.rules[0].host"));
        assert_eq!(at(7).as_deref(), Some("spec.rules[1].host"));
        assert_eq!(at(9).as_deref(), Some("spec.rules[1].http.paths"));
        assert_eq!(at(11).as_deref(), Some("spec.rules[1].http.paths[0][1].y"));
        assert_eq!(at(12).as_deref(), Some("spec.tls"));
    }

    #[test]
    fn syntax_error_has_absolute_line() {
        let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Service\nmetadata: [\n";
        let err = parse_manifests(text).unwrap_err();
        assert!(matches!(err, ManifestError::Syntax { .. }), "{err:?}");
        assert!(err.line().is_some_and(|l| l >= 8), "{err}");
    }

    #[test]
    fn missing_name_is_an_error() {
        let err =
            parse_manifests("---\napiVersion: v1\nkind: Service\nmetadata:\n  namespace: x\n").unwrap_err();
        assert_eq!(err, ManifestError::MissingName { line: 2, kind: "Service".into() });
        assert_eq!(err.to_string(), "line 2: Service without metadata.name");
    }

    #[test]
    fn not_an_object_is_an_error() {
        let err = parse_manifests("a: 1\n---\njust a string\n").unwrap_err();
        assert_eq!(err.line(), Some(1), "{err}");
        assert!(matches!(err, ManifestError::NotAnObject { .. }), "{err:?}");
        let err = parse_manifests("kind: Service\n---\n- 1\n").unwrap_err();
        assert!(matches!(err, ManifestError::NotAnObject { line: 1, .. }), "{err:?}");
    }

    #[test]
    fn json_manifests_parse() {
        let text = r#"{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {"ports": [{"port": 80}]}},
  {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b"}, "spec": {"ports": [{"port": "x"}]}}
]}"#;
        let err = parse_manifests(text).unwrap_err();
        assert_eq!(err.line(), Some(3), "{err}");
        assert!(err.reason().starts_with("List items[1] (Service default/b): "), "{err}");
        let ok = parse_manifests(&text.replace(r#""x""#, "81")).unwrap();
        assert_eq!(ok.len(), 2);
    }

    #[test]
    fn empty_text_and_document_end_markers() {
        assert_eq!(parse_manifests("").unwrap(), vec![]);
        assert_eq!(parse_manifests("\n# nothing\n---\n...\n").unwrap(), vec![]);
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n...\napiVersion: v1\nkind: Service\nmetadata: {name: b}\n";
        assert_eq!(parse_manifests(text).unwrap().len(), 2);
    }

    /// Objects are decoded from the parsed value when it fits their schema, else from the
    /// text: both give the same object for every document of the golden fixtures, and the
    /// fast path never accepts what the text would reject.
    #[test]
    fn decoding_the_value_equals_decoding_the_text() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut compared = 0;
        for case in std::fs::read_dir(&root).unwrap() {
            let Ok(text) = std::fs::read_to_string(case.unwrap().path().join("input.yaml")) else { continue };
            for doc in split_documents(&text) {
                let value: Option<serde_json::Value> =
                    serde_saphyr::from_str_with_options(doc.text, options()).unwrap_or_default();
                let Some(id) = value.as_ref().and_then(|v| v.as_object()).and_then(Identity::of) else {
                    continue;
                };
                let Some(known) = Known::lookup(&id.api_version, &id.kind) else { continue };
                let from_value = decode_known(known, JsonValue(value.unwrap_or_default()));
                let from_text = decode_known(known, YamlText(doc.text));
                if let Ok(object) = from_value {
                    assert_eq!(Some(object), from_text.ok(), "{}", doc.text);
                    compared += 1;
                }
            }
        }
        assert!(compared > 100, "only {compared} documents compared");
    }
}
