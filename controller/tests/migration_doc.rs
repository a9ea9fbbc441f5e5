//! `docs/migrating-from-ingress-nginx.md` tells the truth: it has one row for every annotation
//! weir knows, and each row's status agrees with what translation does.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use weir::translate::annotations::{CATALOGUE, Support};

#[test]
fn the_migration_table_matches_the_catalogue() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/migrating-from-ingress-nginx.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let rows: BTreeMap<&str, &str> = doc
        .lines()
        .filter_map(|line| {
            let mut cells = line.split('|').map(str::trim).skip(1);
            let name = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name, cells.next()?))
        })
        .collect();
    let mut problems = Vec::new();
    for (name, support) in CATALOGUE {
        let want: &[&str] = match support {
            Support::Supported => &["supported", "supported with differences"],
            Support::Refused(_) => &["refused"],
            Support::Unsupported => &["not yet"],
        };
        match rows.get(name) {
            Some(status) if want.contains(status) => {}
            Some(status) => problems.push(format!("{name}: the doc says {status:?}, weir does {support:?}")),
            None => problems.push(format!("{name}: no row in the doc")),
        }
    }
    for name in rows.keys() {
        if !CATALOGUE.iter().any(|(n, _)| n == name) {
            problems.push(format!("{name}: in the doc but not in the catalogue"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
