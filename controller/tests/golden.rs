//! Golden tests of translation: `tests/fixtures/<case>/input.yaml` (manifests) and optional
//! `config.yaml` (a `TranslateConfig`) are translated and compared, as YAML, with
//! `expected.yaml`. Run with `WEIR_BLESS=1` to (re)write the expected files, then read them.
//!
//! No key material is committed: `GENERATED-CERT-n` / `GENERATED-KEY-n` in an input stand for
//! the PEM of certificate and key pair `n` (1 to 3) made with rcgen when the test starts, and
//! the `-B64` forms for their base64 (Secret `data`). The output names them the same way.

// Test helpers outside `#[test]` functions: a failed unwrap is a test failure.
#![allow(clippy::unwrap_used)]

mod support_diff;
use support_diff::diff;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use weir::source::manifest::parse_manifests;
use weir::translate::{Snapshot, TranslateConfig, Translation, translate};

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("input.yaml").is_file())
        .collect();
    cases.sort();
    cases
}

fn config(case: &Path) -> TranslateConfig {
    match std::fs::read_to_string(case.join("config.yaml")) {
        Ok(text) => {
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}/config.yaml: {e}", case.display()))
        }
        Err(_) => TranslateConfig::default(),
    }
}

/// Certificate and key PEM of the generated pairs 1..=3.
fn generated() -> &'static [(String, String)] {
    static PAIRS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    PAIRS.get_or_init(|| {
        (1..=3)
            .map(|n| {
                let c = rcgen::generate_simple_self_signed(vec![format!("generated-{n}.test")]).unwrap();
                (c.cert.pem(), c.signing_key.serialize_pem())
            })
            .collect()
    })
}

fn with_generated(input: &str) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let json = |s: &str| serde_json::to_string(s).unwrap();
    let mut out = input.to_string();
    for (i, (cert, key)) in generated().iter().enumerate().rev() {
        let n = i + 1;
        out = out
            .replace(&format!("GENERATED-CERT-{n}-B64"), &b64(cert))
            .replace(&format!("GENERATED-KEY-{n}-B64"), &b64(key))
            .replace(&format!("GENERATED-CERT-{n}"), &json(cert))
            .replace(&format!("GENERATED-KEY-{n}"), &json(key));
    }
    out
}

fn run(case: &Path, input: &str, config: &TranslateConfig) -> Translation {
    let input = with_generated(input);
    let objects = parse_manifests(&input).unwrap_or_else(|e| panic!("{}/input.yaml: {e}", case.display()));
    let snapshot: Snapshot = objects.into_iter().collect();
    let mut translation = translate(&snapshot, config);
    let marker = |pem: &mut String| {
        if let Some(n) = generated().iter().position(|(c, _)| c == pem) {
            *pem = format!("GENERATED-CERT-{}", n + 1);
        }
    };
    for cert in translation.table.certificates.values_mut() {
        marker(&mut cert.chain_pem);
    }
    for auth in &mut translation.table.client_auth {
        marker(&mut auth.ca_pem);
    }
    for backend in translation.table.backends.values_mut() {
        if let Some(pem) = backend.tls.as_mut().and_then(|t| t.ca_pem.as_mut()) {
            marker(pem);
        }
    }
    translation
}

fn render(translation: &Translation) -> String {
    serde_saphyr::to_string(translation).unwrap()
}

#[test]
fn golden() {
    let bless = std::env::var_os("WEIR_BLESS").is_some_and(|v| v == "1");
    let cases = fixtures();
    assert!(cases.len() >= 25, "expected at least 25 fixtures, found {}", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let input = std::fs::read_to_string(case.join("input.yaml")).unwrap();
        let actual = render(&run(case, &input, &config(case)));
        let expected_path = case.join("expected.yaml");
        if bless {
            std::fs::write(&expected_path, &actual).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if expected != actual {
            failures.push(format!(
                "=== {} (- expected, + actual)\n{}",
                case.file_name().unwrap().to_string_lossy(),
                diff(&expected, &actual)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ (WEIR_BLESS=1 rewrites them):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// A tiny deterministic PRNG (xorshift64*), so shuffles are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = usize::try_from(self.next() % (i as u64 + 1)).unwrap();
            items.swap(i, j);
        }
    }
}

/// Splits manifests at `---` lines (the fixtures use no other document markers).
fn documents(input: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in input.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else if let Some(doc) = docs.last_mut() {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.retain(|d| d.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')));
    docs
}

#[test]
fn translation_does_not_depend_on_input_order() {
    for case in fixtures() {
        let input = std::fs::read_to_string(case.join("input.yaml")).unwrap();
        let config = config(&case);
        let reference = run(&case, &input, &config);
        let mut docs = documents(&input);
        for seed in [1u64, 7, 42, 1234, 0x9e37_79b9_7f4a_7c15] {
            let mut rng = Rng(seed);
            rng.shuffle(&mut docs);
            let shuffled = docs.join("---\n");
            let translation = run(&case, &shuffled, &config);
            assert_eq!(
                translation,
                reference,
                "{} differs with seed {seed}:\n{}",
                case.display(),
                diff(&render(&reference), &render(&translation))
            );
        }
    }
}
