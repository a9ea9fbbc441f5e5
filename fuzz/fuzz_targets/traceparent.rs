//! The W3C trace context (`weir_dataplane::trace::context`): arbitrary `traceparent` and
//! `tracestate` values. No panic; an accepted `traceparent` has non-zero ids and is written
//! back as the same trace and span in version 00; an accepted `tracestate` parses again to
//! itself and has at most 32 members.
//!
//! The input is lines: `p:VALUE` is a `traceparent` header, `s:VALUE` a `tracestate` one (so
//! the seeds in `corpus/traceparent` are readable requests' headers).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir_dataplane::trace::context::{Incoming, TRACEPARENT, TraceParent, TraceState};

struct Input<'a> {
    parents: Vec<&'a [u8]>,
    states: Vec<&'a [u8]>,
}

fn input(data: &[u8]) -> Input<'_> {
    let mut input = Input { parents: Vec::new(), states: Vec::new() };
    for line in data.split(|b| *b == b'\n') {
        match line {
            [b'p', b':', v @ ..] => input.parents.push(v),
            [b's', b':', v @ ..] => input.states.push(v),
            _ => {}
        }
    }
    input
}

fuzz_target!(|data: &[u8]| {
    let input = input(data);
    for p in &input.parents {
        if let Ok(parsed) = TraceParent::parse(p) {
            assert!(!parsed.trace_id.is_zero() && !parsed.parent_id.is_zero());
            let written = TraceParent::header(parsed.trace_id, parsed.parent_id, parsed.sampled);
            assert_eq!(written.len(), 55);
            assert_eq!(TraceParent::parse(written.as_bytes()), Ok(parsed));
            if p.starts_with(b"00") {
                // Version 00 is written back as it came, unknown flags aside.
                assert_eq!(&written.as_bytes()[..53], &p[..53]);
            }
        }
    }
    if let Ok(Some(state)) = TraceState::parse(input.states.iter().copied()) {
        assert!(state.as_str().split(',').count() <= 32);
        assert_eq!(TraceState::parse([state.as_str().as_bytes()]), Ok(Some(state.clone())));
        assert_eq!(state.header(), state.as_str());
    }
    let headers = weir_fuzz::headers(
        input
            .parents
            .iter()
            .map(|v| ("traceparent", *v))
            .chain(input.states.iter().map(|v| ("tracestate", *v))),
    );
    if let Ok(Some(incoming)) = Incoming::from_headers(&headers) {
        assert_eq!(headers.get_all(TRACEPARENT).iter().count(), 1);
        assert!(!incoming.parent.trace_id.is_zero());
    }
});
