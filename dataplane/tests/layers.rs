//! The dataplane's layers (the crate doc in `src/lib.rs` says why): every module path a file of
//! `dataplane/src` names (`use crate::…`, `crate::…`, `super::…`, a child module's `name::…`)
//! must lead to a module of its own layer or of a lower floor, never to a higher floor nor to
//! another wing of its own floor, and no files may import each other in a circle.
//!
//! A new module needs one line in [`MODULES`]; a module missing from it fails the check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, bottom to top, each with its floor. A file may import from its own layer and
/// from the layers of lower floors; layers of one floor are wings that may not import each
/// other.
const LAYERS: &[(&str, u8)] = &[
    ("ground", 0),
    ("tls", 1),
    ("echo", 1),
    ("state", 2),
    ("route", 3),
    ("proxy::headers", 4),
    ("proxy::upstream", 5),
    ("proxy", 6),
    ("l4", 7),
];

/// Modules and their layers. A file belongs to the longest entry that is its module or one of
/// its parents. `lib.rs` (the crate root) only declares modules; nothing may import from it.
const MODULES: &[(&str, &str)] = &[
    ("model", "ground"),
    ("http_util", "ground"),
    ("uri_path", "ground"), // request-path normalization
    ("hashkey", "ground"),
    ("vars", "ground"), // the nginx-variables language
    ("fast", "ground"),
    ("metrics", "ground"), // request metrics: per-route handles, sharded counters
    ("stall", "ground"),   // timeouts on I/O that waits without progress
    ("trace", "ground"),   // W3C trace context, sampler, spans, the OTLP exporter
    ("relay", "ground"),   // the bounded copy relay both ways with an idle timeout
    ("echo", "echo"),
    ("tls", "tls"),
    ("state", "state"),
    ("route", "route"),
    ("proxy::headers", "proxy::headers"),
    ("proxy::upstream", "proxy::upstream"),
    ("proxy", "proxy"),
    ("l4", "l4"),
];

#[test]
fn the_dataplane_imports_only_downwards_and_in_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&src, &src, &mut files);
    assert!(files.len() > 10, "no sources found under {}", src.display());
    let problems = check(&files);
    assert!(problems.is_empty(), "layer rule broken (see dataplane/src/lib.rs):\n{}", problems.join("\n"));
}

/// Every `.rs` file under `dir`: (path relative to `src`, with `/`, and its text).
fn collect(src: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path();
        if path.is_dir() {
            collect(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let rel = path.strip_prefix(src).unwrap_or(&path);
            let rel = rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
            out.push((rel, text));
        }
    }
}

// === the check ===

/// One file's imports of another file: the path as written, by the file it leads to.
type Imports = BTreeMap<String, BTreeSet<String>>;

/// The problems of a crate's sources, given as (path relative to `src`, text); empty when the
/// layer rule holds.
fn check(files: &[(String, String)]) -> Vec<String> {
    let modules: BTreeMap<String, &str> =
        files.iter().map(|(path, _)| (module_of(path), path.as_str())).collect();
    let mut problems = Vec::new();
    let mut graph: BTreeMap<&str, Imports> = BTreeMap::new();
    for (path, text) in files {
        let module = module_of(path);
        let from = layer_of(&module);
        if from.is_none() && !module.is_empty() {
            problems.push(format!(
                "{path}: module `{module}` has no layer: add a line for it to MODULES in dataplane/tests/layers.rs"
            ));
        }
        let imports = graph.entry(path.as_str()).or_default();
        for written in paths(text, &module, &modules) {
            let Some(target) = resolve(&written.segments, &modules) else { continue };
            let to_path = modules[&target];
            if to_path == path {
                continue;
            }
            imports.entry(to_path.to_string()).or_default().insert(written.text.clone());
            if target.is_empty() {
                problems.push(format!(
                    "{path}: imports `{}` from the crate root: name the module it comes from",
                    written.text
                ));
                continue;
            }
            let (Some(from), Some(to)) = (from, layer_of(&target)) else { continue };
            if from.0 == to.0 {
                continue;
            }
            if to.1 > from.1 {
                problems.push(format!(
                    "{path}: imports `{}` from a higher layer ({} is floor {}, {} floor {})",
                    written.text, to.0, to.1, from.0, from.1
                ));
            } else if to.1 == from.1 {
                problems.push(format!(
                    "{path}: imports `{}` from another wing ({} and {} are both floor {})",
                    written.text, to.0, from.0, from.1
                ));
            }
        }
    }
    problems.sort();
    problems.dedup();
    for cycle in cycles(&graph) {
        let edges: Vec<String> = cycle
            .iter()
            .flat_map(|from| {
                let imports = &graph[from.as_str()];
                cycle.iter().filter_map(move |to| {
                    let written = imports.get(to)?;
                    Some(format!(
                        "  {from} -> {to}: {}",
                        written.iter().cloned().collect::<Vec<_>>().join(", ")
                    ))
                })
            })
            .collect();
        problems.push(format!("import circle between {}:\n{}", cycle.join(", "), edges.join("\n")));
    }
    problems
}

/// The module a file is: `proxy/upstream/h1.rs` → `proxy::upstream::h1`, `state/mod.rs` →
/// `state`, `lib.rs` → `` (the root).
fn module_of(path: &str) -> String {
    let path = path.strip_suffix(".rs").unwrap_or(path);
    let mut parts: Vec<&str> = path.split('/').collect();
    if matches!(parts.last(), Some(&"mod") | Some(&"lib") | Some(&"main")) {
        parts.pop();
    }
    parts.join("::")
}

/// The layer (name, floor) of a module: that of the longest [`MODULES`] entry it is in.
fn layer_of(module: &str) -> Option<(&'static str, u8)> {
    let (_, layer) = MODULES
        .iter()
        .filter(|(prefix, _)| module == *prefix || module.starts_with(&format!("{prefix}::")))
        .max_by_key(|(prefix, _)| prefix.len())?;
    LAYERS.iter().find(|(name, _)| name == layer).copied()
}

/// The file module a path leads to: the longest known module it starts with (`` when only the
/// root).
fn resolve(segments: &[String], modules: &BTreeMap<String, &str>) -> Option<String> {
    (0..=segments.len()).rev().map(|n| segments[..n].join("::")).find(|m| modules.contains_key(m))
}

/// A module path named in a file: absolute segments, and the text as written.
struct Written {
    segments: Vec<String>,
    text: String,
}

/// The module paths `text` (the file of `module`) names, made absolute.
fn paths(text: &str, module: &str, modules: &BTreeMap<String, &str>) -> Vec<Written> {
    let tokens = tokens(text);
    let file: Vec<String> =
        if module.is_empty() { Vec::new() } else { module.split("::").map(String::from).collect() };
    // Inline modules (`mod tests { … }`) open at a brace depth.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let current = |inline: &[(String, usize)]| -> Vec<String> {
            file.iter().cloned().chain(inline.iter().map(|(name, _)| name.clone())).collect()
        };
        match tokens[i].as_str() {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, at)| *at == depth) {
                    inline.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t == "{") => {
                inline.push((tokens[i + 1].clone(), depth));
                depth += 1;
                i += 3;
                continue;
            }
            "use" => {
                let here = current(&inline);
                let mut trees = Vec::new();
                i = use_tree(&tokens, i + 1, Vec::new(), &mut trees);
                for tree in trees {
                    if let Some(segments) = absolute(&tree, &here, modules) {
                        out.push(Written { segments, text: tree.join("::") });
                    }
                }
                continue;
            }
            _ if tokens.get(i + 1).is_some_and(|t| t == "::")
                && (i == 0 || tokens[i - 1] != "::")
                && is_ident(&tokens[i]) =>
            {
                let here = current(&inline);
                let mut path = vec![tokens[i].clone()];
                let mut j = i + 1;
                while tokens.get(j).is_some_and(|t| t == "::")
                    && tokens.get(j + 1).is_some_and(|t| is_ident(t))
                {
                    path.push(tokens[j + 1].clone());
                    j += 2;
                }
                if let Some(segments) = absolute(&path, &here, modules) {
                    out.push(Written { segments, text: path.join("::") });
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// `path` (as written in module `here`) from the crate root, if it starts in this crate:
/// `crate::`, `super::`, `self::`, or a child module of `here`.
fn absolute(path: &[String], here: &[String], modules: &BTreeMap<String, &str>) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    let mut at: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => here[..here.len().checked_sub(1)?].to_vec(),
        name => {
            let mut child = here.to_vec();
            child.push(name.to_string());
            if !modules.contains_key(&child.join("::")) {
                return None;
            }
            return Some(child.into_iter().chain(rest.iter().cloned()).collect());
        }
    };
    let mut rest = rest.iter().peekable();
    while rest.peek().is_some_and(|s| *s == "super") {
        at.pop()?;
        rest.next();
    }
    at.extend(rest.filter(|s| *s != "self").cloned());
    Some(at)
}

/// Reads one use tree from `tokens[i]` with `prefix` before it, to its end (`;`, `,` or `}`,
/// not consumed except `;`); pushes every path it names.
fn use_tree(tokens: &[String], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    while let Some(t) = tokens.get(i) {
        match t.as_str() {
            "::" => i += 1,
            "{" => {
                i += 1;
                loop {
                    match tokens.get(i).map(String::as_str) {
                        None => return i,
                        Some("}") => {
                            i += 1;
                            break;
                        }
                        Some(",") => i += 1,
                        Some(_) => i = use_tree(tokens, i, prefix.clone(), out),
                    }
                }
                return finish(tokens, i);
            }
            "*" => {
                out.push(prefix);
                return finish(tokens, i + 1);
            }
            "as" => {
                out.push(prefix);
                return finish(tokens, i + 2);
            }
            ";" | "," | "}" => {
                if !prefix.is_empty() {
                    out.push(prefix);
                }
                return if t == ";" { i + 1 } else { i };
            }
            // `a::{self, b}`: `self` is `a` itself.
            "self" if !prefix.is_empty() => i += 1,
            word => {
                prefix.push(word.to_string());
                i += 1;
            }
        }
    }
    i
}

/// Past the end of a use tree: consumes a closing `;`.
fn finish(tokens: &[String], i: usize) -> usize {
    if tokens.get(i).is_some_and(|t| t == ";") { i + 1 } else { i }
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
}

/// The tokens of Rust source that matter here: identifiers, `::` and single punctuation;
/// comments, strings, characters, lifetimes and numbers left out.
fn tokens(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        match c {
            b'/' if next == Some(b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if next == Some(b'*') => {
                let mut nested = 0usize;
                while i < b.len() {
                    if b[i..].starts_with(b"/*") {
                        nested += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
                        nested -= 1;
                        i += 2;
                        if nested == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            b'"' => i = skip_string(b, i + 1, 0),
            b'r' | b'b' if raw_string_start(b, i).is_some() => {
                let (hashes, quote) = raw_string_start(b, i).unwrap_or((0, i));
                i = skip_string(b, quote + 1, hashes);
            }
            b'b' if next == Some(b'\'') => i = skip_char(text, i + 1),
            b'\'' => i = skip_char(text, i),
            b'r' if next == Some(b'#') && b.get(i + 2).is_some_and(|&c| word(c)) => {
                let start = i + 2;
                i = start;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                out.push(String::from_utf8_lossy(&b[start..i]).into_owned());
            }
            c if c.is_ascii_digit() => {
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
            }
            c if word(c) => {
                let start = i;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                out.push(String::from_utf8_lossy(&b[start..i]).into_owned());
            }
            b':' if next == Some(b':') => {
                out.push("::".into());
                i += 2;
            }
            c if c.is_ascii_whitespace() => i += 1,
            c => {
                out.push(char::from(c).to_string());
                i += 1;
            }
        }
    }
    out
}

/// At `r"`, `r#"`, `br"`, `b"`…: the number of `#` and where the opening quote is.
fn raw_string_start(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if b.get(j) == Some(&b'b') {
        j += 1;
        if b.get(j) == Some(&b'"') {
            return Some((0, j)).filter(|_| i == 0 || !b[i - 1].is_ascii_alphanumeric());
        }
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    let quote = j + hashes;
    let starts_word = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    (b.get(quote) == Some(&b'"') && starts_word).then_some((hashes, quote))
}

/// Past a string whose text starts at `i`, closed by `"` and `hashes` `#`.
fn skip_string(b: &[u8], mut i: usize, hashes: usize) -> usize {
    while i < b.len() {
        if b[i] == b'\\' && hashes == 0 {
            i += 2;
        } else if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
            return i + 1 + hashes;
        } else {
            i += 1;
        }
    }
    i
}

/// At a `'`: past a character literal, or past the `'` of a lifetime or label.
fn skip_char(text: &str, i: usize) -> usize {
    let b = text.as_bytes();
    match text.get(i + 1..).and_then(|rest| rest.chars().next()) {
        Some('\\') => {
            // `'\''`, `'\\'`, `'\n'`, `'\u{7f}'`: the escaped character, then up to the `'`.
            let mut j = i + 3;
            while j < b.len() && b[j] != b'\'' {
                j += 1;
            }
            j + 1
        }
        Some(c) if b.get(i + 1 + c.len_utf8()) == Some(&b'\'') => i + 2 + c.len_utf8(),
        _ => i + 1,
    }
}

/// Import circles: the strongly connected components of more than one file (Tarjan).
fn cycles(graph: &BTreeMap<&str, Imports>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<&'a str, Imports>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            let graph = self.graph;
            for w in graph.get(v).into_iter().flat_map(|imports| imports.keys()) {
                let Some((&w, _)) = graph.get_key_value(w.as_str()) else { continue };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

// === the check, checked ===

fn sources(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect()
}

#[test]
fn an_upward_import_is_reported() {
    let problems = check(&sources(&[
        ("lib.rs", "pub mod model; pub mod proxy;"),
        ("model.rs", "//! `crate::proxy` in a comment is no import.\nuse crate::proxy::Proxy;\n"),
        ("proxy/mod.rs", "pub struct Proxy;"),
    ]));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("model.rs: imports `crate::proxy::Proxy` from a higher layer"),
        "{problems:?}"
    );
}

#[test]
fn paths_in_code_and_relative_paths_count() {
    let problems = check(&sources(&[
        ("lib.rs", ""),
        ("route/mod.rs", "pub mod router;"),
        ("route/router.rs", "fn f() -> super::super::proxy::upstream::client::Clients { todo!() }"),
        ("proxy/mod.rs", "mod upstream;"),
        ("proxy/upstream/mod.rs", "mod client; fn g() { client::Clients::new(); }"),
        (
            "proxy/upstream/client.rs",
            "fn h() { let s = \"crate::route::x\"; let c = 'a'; crate::proxy::f(); }",
        ),
        ("state/balance.rs", "mod tests { use super::*; use crate::model::X; }"),
        ("model.rs", ""),
    ]));
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("proxy/upstream/client.rs: imports `crate::proxy::f` from a higher layer")
    );
    assert!(
        problems[1].starts_with("route/router.rs: imports `super::super::proxy::upstream::client::Clients`")
    );
}

#[test]
fn wings_and_circles_and_unknown_modules_are_reported() {
    let problems = check(&sources(&[
        ("lib.rs", ""),
        ("tls/mod.rs", "use crate::echo::serve;"),
        ("echo.rs", "pub fn serve() {}"),
        ("proxy/a.rs", "use super::b::B; pub struct A;"),
        ("proxy/b.rs", "use super::{a::A, c}; pub struct B;"),
        ("proxy/c.rs", ""),
        ("gadget.rs", ""),
    ]));
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].starts_with("gadget.rs: module `gadget` has no layer"));
    assert!(problems[1].starts_with("tls/mod.rs: imports `crate::echo::serve` from another wing"));
    assert!(problems[2].starts_with("import circle between proxy/a.rs, proxy/b.rs:"), "{problems:?}");
    assert!(problems[2].contains("proxy/b.rs -> proxy/a.rs: super::a::A"), "{problems:?}");
}
