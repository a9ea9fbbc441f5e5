//! Every annotation value parser (`controller/src/translate/annotations/values.rs`, through
//! `weir::translate::annotations::fuzzing`) on arbitrary text. No panic; text a parser accepts
//! (it ends up in a header or a URL) has no control character, so no value can inject a
//! header line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weir::translate::annotations::fuzzing::{text_values, typed_values};

fuzz_target!(|value: &str| {
    for (parser, answer) in text_values(value) {
        if let Ok(text) = answer {
            assert!(!text.bytes().any(|b| b.is_ascii_control()), "{parser}({value:?}) accepted {text:?}");
        }
    }
    let _ = typed_values(value);
});
