//! Cookie lookup (`weir_dataplane::http_util::cookie`, which `hashkey` re-exports) and canary
//! selection (`weir_dataplane::route::canary`) on arbitrary `Cookie` and canary headers and
//! arbitrary canary settings (as annotations give them). No panic; a cookie found is trimmed
//! and was written as `name=value`; the canary decision follows header, cookie, weight.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use weir_dataplane::hashkey::cookie;
use weir_dataplane::model::{BackendId, Canary, ServicePort};
use weir_dataplane::route::canary::CompiledCanary;
use weir_dataplane::state::balance::BackendIdx;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    cookies: Vec<&'a [u8]>,
    name: &'a str,
    canary_header: Option<&'a str>,
    header_value: Option<&'a str>,
    header_pattern: Option<&'a str>,
    header_sent: Option<&'a [u8]>,
    weight: u32,
    weight_total: u32,
    roll: u32,
}

fuzz_target!(|input: Input<'_>| {
    let mut pairs: Vec<(&str, &[u8])> = input.cookies.iter().map(|c| ("cookie", *c)).collect();
    if let (Some(h), Some(v)) = (input.canary_header, input.header_sent) {
        pairs.push((h, v));
    }
    let headers = weir_fuzz::headers(pairs);
    let found = cookie(&headers, input.name);
    if let Some(value) = found {
        assert_eq!(value, value.trim());
        let written = headers
            .get_all("cookie")
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.contains(input.name) && v.contains(value)));
        assert!(written, "cookie {:?} = {value:?} is not in the header", input.name);
    }
    if input.header_pattern.is_some_and(|p| p.len() > 64) {
        return; // regex compile time is the regex crate's, not ours
    }
    let canary = Canary {
        backend: BackendId {
            namespace: "ns".into(),
            service: "canary".into(),
            port: ServicePort::Number(80),
        },
        weight: input.weight,
        weight_total: input.weight_total,
        header: input.canary_header.map(str::to_string),
        header_value: input.header_value.map(str::to_string),
        header_pattern: input.header_pattern.map(str::to_string),
        cookie: Some(input.name.to_string()),
    };
    let Ok(compiled) = CompiledCanary::compile(&canary, BackendIdx(1)) else { return };
    let selected = compiled.selects(&headers, input.roll);
    if canary.header.is_none() {
        match found {
            Some("always") => assert!(selected),
            Some("never") => assert!(!selected),
            _ => assert_eq!(
                selected,
                input.weight > 0 && input.roll % input.weight_total.max(1) < input.weight
            ),
        }
    }
});
