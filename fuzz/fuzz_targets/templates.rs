//! The nginx-variables language (`weir_dataplane::vars`, one parser for every dialect) through
//! each user's public entry point: the access-log `Template` (round trip through `Display`),
//! `upstream-hash-by`'s `HashKey`, `auth-cache-key`'s `AuthKey`, and the `auth-url` /
//! `mirror-target` expansion, each rendering one `RequestView`. No panic.
#![no_main]

use std::net::IpAddr;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use weir_dataplane::hashkey::HashKey;
use weir_dataplane::model::logformat::Template;
use weir_dataplane::proxy::fuzzing::expand_template;
use weir_dataplane::state::authcache::AuthKey;
use weir_dataplane::vars::RequestView;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    template: &'a str,
    host: &'a str,
    request_uri: &'a str,
    client: IpAddr,
    headers: Vec<(&'a str, &'a [u8])>,
}

/// The request the keys are rendered for.
fn view<'a>(input: &Input<'a>, headers: &'a http::HeaderMap) -> RequestView<'a> {
    RequestView {
        scheme: "https",
        host: input.host,
        method: &http::Method::GET,
        request_uri: input.request_uri,
        client: input.client,
        headers,
    }
}

/// The log format: what parses prints back to a template that parses to the same thing.
fn log_template(input: &Input<'_>) {
    let Ok(template) = input.template.parse::<Template>() else { return };
    let printed = template.to_string();
    let again = printed.parse::<Template>();
    assert_eq!(again.as_ref().ok(), Some(&template), "{:?} printed as {printed:?}", input.template);
}

/// `upstream-hash-by`: parse, then hash one request.
fn hash_key(input: &Input<'_>, headers: &http::HeaderMap) {
    let Ok(key) = HashKey::parse(input.template) else { return };
    let req = view(input, headers);
    assert_eq!(key.hash(&req), key.hash(&req));
}

/// `auth-cache-key`: parse, then key one request.
fn auth_key(input: &Input<'_>, headers: &http::HeaderMap) {
    let Ok(key) = AuthKey::parse(input.template) else { return };
    let _ = key.key(&view(input, headers));
}

/// `auth-url` / `mirror-target`: a template without `$` is sent as written.
fn expand(input: &Input<'_>, headers: &http::HeaderMap) {
    let out = expand_template(input.template, "https", input.host, input.request_uri, input.client, headers);
    if !input.template.contains('$') {
        assert_eq!(out, input.template);
    }
}

fuzz_target!(|input: Input<'_>| {
    let headers = weir_fuzz::headers(input.headers.iter().copied());
    log_template(&input);
    hash_key(&input, &headers);
    auth_key(&input, &headers);
    expand(&input, &headers);
});
