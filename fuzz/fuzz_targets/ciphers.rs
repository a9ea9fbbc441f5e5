//! The OpenSSL cipher-string parser (`weir_dataplane::tls::ciphers::parse`, the ConfigMap's
//! `ssl-ciphers`). No panic; a selection is non-empty, without repeats, and builds a provider.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_dataplane::tls::ciphers::{parse, provider};

fuzz_target!(|s: &str| {
    let Ok(selection) = parse(s) else { return };
    assert!(!selection.tls12.is_empty());
    let mut seen = selection.tls12.clone();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), selection.tls12.len(), "a suite twice: {:?}", selection.tls12);
    for entry in &selection.unmatched {
        assert!(s.contains(entry.as_str()));
    }
    let _ = provider(&selection.tls12);
});
