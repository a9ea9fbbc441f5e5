#!/usr/bin/env bash
# Time per RSA 2048 signature (RSA-PSS-SHA256, what a TLS 1.3 server signs with an RSA key) in
# ring, in aws-lc (weir's crypto library since the eighth pass, bench/RESULTS.md) and in OpenSSL
# (nginx's and HAProxy's): the cost behind a full handshake with an RSA certificate.
#
#   bench/rsa/run.sh            # 3000 signatures per library
#   SIGNS=10000 bench/rsa/run.sh
#
# The comparison program is a scratch crate outside the workspace (ring is not a dependency of
# weir), built in release mode under $CARGO_TARGET_DIR (default /var/cache/weir/target-rsa).
set -euo pipefail
signs=${SIGNS:-3000}
work=$(mktemp -d /tmp/weir-bench-rsa.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$work/key.pem" 2>/dev/null
openssl pkcs8 -topk8 -nocrypt -in "$work/key.pem" -outform DER -out "$work/key.der"  # PKCS#8 DER: both read it
cat >"$work/Cargo.toml" <<'TOML'
[package]
name = "rsa-sign"
version = "0.0.0"
edition = "2021"
publish = false
[dependencies]
ring = "0.17"
aws-lc-rs = "1"
TOML
cat >"$work/src/main.rs" <<'RUST'
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let der = std::fs::read(args.next().expect("key path")).expect("key");
    let n: u32 = args.next().expect("count").parse().expect("count");
    let msg = [7u8; 200];
    let per = |t: Instant| t.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    let ring_key = ring::signature::RsaKeyPair::from_pkcs8(&der).expect("ring key");
    let mut sig = vec![0; ring_key.public().modulus_len()];
    let rng = ring::rand::SystemRandom::new();
    let t = Instant::now();
    for _ in 0..n {
        ring_key.sign(&ring::signature::RSA_PSS_SHA256, &rng, &msg, &mut sig).expect("sign");
    }
    println!("ring 0.17   {:7.1} us per signature", per(t));
    let lc_key = aws_lc_rs::signature::RsaKeyPair::from_pkcs8(&der).expect("aws-lc key");
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let t = Instant::now();
    for _ in 0..n {
        lc_key.sign(&aws_lc_rs::signature::RSA_PSS_SHA256, &rng, &msg, &mut sig).expect("sign");
    }
    println!("aws-lc-rs 1 {:7.1} us per signature", per(t));
}
RUST
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/cache/weir/target-rsa}
(cd "$work" && cargo build --release --quiet)
"$CARGO_TARGET_DIR/release/rsa-sign" "$work/key.der" "$signs"
openssl speed -seconds 3 rsa2048 2>/dev/null | awk '/^rsa 2048/ {printf "OpenSSL     %7.1f us per signature (openssl speed rsa2048)\n", $4 * 1e6}'
