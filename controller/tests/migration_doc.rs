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

#[test]
fn the_configmap_table_matches_the_settings_catalogue() {
    let doc = doc();
    check(&table(&doc, "key"), weir::translate::settings::CATALOGUE);
}
