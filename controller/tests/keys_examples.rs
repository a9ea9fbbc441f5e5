//! `weir check` over our own minimal copies of ingress-nginx's `docs/examples` that matter most to
//! migrating users (oauth2-proxy and vouch-proxy over `https://$host`, external auth, cookie
//! affinity): they check clean, without an error or a warning.
#![allow(clippy::unwrap_used)]

mod support_proc;

use std::process::Command;

#[test]
fn ingress_nginx_examples_check_clean() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/nginx_examples");
    let out = Command::new(support_proc::WEIR)
        .args([
            "check",
            "--manifests",
            dir,
            "--ingress-class",
            "nginx",
            "--controller-name",
            "k8s.io/ingress-nginx",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weir check failed:\n{stdout}\n{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.ends_with("0 errors, 0 warnings"), "{stdout}");
    assert!(summary.contains("5 ingresses"), "every example was read: {summary}");
}
