//! `docs/migrating-from-ingress-nginx.md` tells the truth: it has one row for every annotation
//! and every ConfigMap key weir knows, and each row's status agrees with what translation does.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use weir::translate::annotations::{CATALOGUE, Support};

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/migrating-from-ingress-nginx.md");
    std::fs::read_to_string(path).unwrap()
}

/// The `name → status` rows of the table whose header starts with the cell `header`.
fn table<'a>(doc: &'a str, header: &str) -> BTreeMap<&'a str, &'a str> {
    let mut inside = false;
    let mut rows = BTreeMap::new();
    for line in doc.lines() {
        let mut cells = line.split('|').map(str::trim).skip(1);
        let first = cells.next();
        if !line.starts_with('|') {
            inside = false;
        } else if first == Some(header) {
            inside = true;
        } else if inside
            && let Some(name) = first.and_then(|c| c.strip_prefix('`')?.strip_suffix('`'))
            && let Some(status) = cells.next()
        {
            assert!(rows.insert(name, status).is_none(), "{name}: two rows in the {header} table");
        }
    }
    rows
}

/// Every catalogue entry has a row with a matching status, and every row an entry.
fn check(rows: &BTreeMap<&str, &str>, catalogue: &[(&str, Support)]) {
    let mut problems = Vec::new();
    for (name, support) in catalogue {
        let want: &[&str] = match support {
            Support::Supported => &["supported", "supported with differences"],
            Support::Refused(_) => &["refused"],
            Support::Unsupported => &["not yet"],
            Support::UnsupportedFailClosed => &["not yet, fails closed"],
            Support::NotSupported(_) => &["not supported"],
            // Listed once, in the no-ops paragraph, not in the table.
            Support::NoOp => {
                if rows.contains_key(name) {
                    problems.push(format!("{name}: a no-op has a row; it belongs in the no-ops paragraph"));
                }
                continue;
            }
        };
        match rows.get(name) {
            Some(status) if want.contains(status) => {}
            Some(status) => problems.push(format!("{name}: the doc says {status:?}, weir does {support:?}")),
            None => problems.push(format!("{name}: no row in the doc")),
        }
    }
    for name in rows.keys() {
        if !catalogue.iter().any(|(n, _)| n == name) {
            problems.push(format!("{name}: in the doc but not in the catalogue"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_migration_table_matches_the_catalogue() {
    let doc = doc();
    check(&table(&doc, "annotation"), CATALOGUE);
}

/// The names in backquotes of the paragraph that starts with `**No-ops.**`.
fn no_ops(doc: &str) -> Vec<&str> {
    let Some(start) = doc.find("**No-ops.**") else { return Vec::new() };
    let paragraph = doc[start..].split("\n\n").next().unwrap_or_default();
    paragraph.split('`').skip(1).step_by(2).collect()
}

#[test]
fn the_no_ops_paragraph_lists_exactly_the_no_op_keys() {
    let doc = doc();
    let listed = no_ops(&doc);
    let want: Vec<&str> = weir::translate::settings::CATALOGUE
        .iter()
        .filter(|(_, s)| matches!(s, Support::NoOp))
        .map(|(n, _)| *n)
        .collect();
    assert!(!want.is_empty());
    for name in &want {
        assert!(listed.contains(name), "{name}: a no-op missing from the no-ops paragraph");
    }
    for name in listed.iter().filter(|n| n.contains('-') && !n.starts_with("--")) {
        assert!(want.contains(name), "{name}: in the no-ops paragraph but not a no-op");
    }
}

#[test]
fn the_configmap_table_matches_the_settings_catalogue() {
    let doc = doc();
    check(&table(&doc, "key"), weir::translate::settings::CATALOGUE);
}
