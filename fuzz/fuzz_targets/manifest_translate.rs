//! Any text as a manifest (`weir::source::manifest::parse_manifests`), then the snapshot, then
//! `weir::translate::translate`. No panic, and whatever translates compiles in the dataplane
//! (`Router::compile`): bad objects cost warnings, never the table.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir::snapshot::Snapshot;
use weir::source::manifest::parse_manifests;

fuzz_target!(|text: &str| {
    let Ok(objects) = parse_manifests(text) else { return };
    let snapshot: Snapshot = objects.into_iter().collect();
    weir_fuzz::compile_translation(&snapshot);
});
