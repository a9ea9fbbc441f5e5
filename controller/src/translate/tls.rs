//! The TLS processor: `spec.tls` entries → which certificate serves which host.
//!
//! Certificates are checked here (PEM parses, the key is RSA, ECDSA P-256/P-384 or Ed25519 and
//! matches the leaf), with the dataplane's own parser, so that a bad Secret is reported with its
//! reason and never reaches the table.
//!
//! Each host goes to one certificate. An entry without `hosts` covers the hosts of its
//! Ingress's rules (any host for a rule-less, default-backend Ingress). When Ingresses name different secrets for one host, the
//! oldest Ingress wins and the others are told. A missing or unusable secret leaves the host on
//! the default certificate (still TLS, as ingress-nginx does), with a warning.

use std::collections::{BTreeMap, BTreeSet};

use weir_dataplane::fast::HashSet;

use k8s_openapi::api::core::v1::Secret;
use weir_dataplane::model::{Certificate, HostMatch, ObjectRef, TlsEntry};

use super::Ours;
use super::routes::describe_host;
use super::warnings::{ObjectKind, Reason, Warnings};
use crate::snapshot::Snapshot;
use crate::translate::rank::Rank;

/// Key of the certificate chain in a TLS secret.
const TLS_CRT: &str = "tls.crt";
/// Key of the private key in a TLS secret.
const TLS_KEY: &str = "tls.key";

/// Why a secret cannot serve as a certificate.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A key is missing or empty.
    #[error("Secret {secret} has no {key:?} (a kubernetes.io/tls secret needs tls.crt and tls.key)")]
    MissingKey {
        /// The secret.
        secret: ObjectRef,
        /// The key.
        key: &'static str,
    },
    /// A key is not PEM text.
    #[error("Secret {secret} key {key:?} is not UTF-8 text (PEM expected)")]
    NotText {
        /// The secret.
        secret: ObjectRef,
        /// The key.
        key: &'static str,
    },
    /// The PEM does not give a usable certificate and key.
    #[error("Secret {secret}: {source}")]
    Unusable {
        /// The secret.
        secret: ObjectRef,
        /// Why.
        source: weir_dataplane::tls::Error,
    },
}

/// The TLS part of the table.
#[derive(Debug, Default)]
pub(crate) struct TlsPlan {
    /// Entries, grouped by certificate (default certificate first), hosts sorted.
    pub(crate) entries: Vec<TlsEntry>,
    /// Certificates the entries refer to.
    pub(crate) certificates: BTreeMap<ObjectRef, Certificate>,
}

/// One Ingress TLS entry's claim on a host.
struct Claim {
    rank: Rank,
    seq: usize,
    field: String,
    /// The secret as named (namespace/secretName), which decides conflicts.
    declared: Option<ObjectRef>,
    /// The usable certificate, if the secret exists and is valid.
    resolved: Option<ObjectRef>,
}

/// Builds the TLS entries and certificates of our Ingresses.
pub(crate) fn plan(ours: &[Ours<'_>], snapshot: &Snapshot, warnings: &mut Warnings) -> TlsPlan {
    let mut claims: BTreeMap<HostMatch, Vec<Claim>> = BTreeMap::new();
    let mut certificates = BTreeMap::new();
    for ing in ours {
        let object = &ing.rank.object;
        let tls = ing.ingress.spec.as_ref().and_then(|s| s.tls.as_deref()).unwrap_or_default();
        for (i, entry) in tls.iter().enumerate() {
            let field = format!("spec.tls[{i}]");
            let mut hosts = BTreeSet::new();
            let listed = entry.hosts.as_deref().unwrap_or_default();
            if listed.is_empty() {
                hosts.extend(served_hosts(ing));
            }
            for (j, host) in listed.iter().enumerate() {
                match HostMatch::parse(host) {
                    Ok(h) => {
                        hosts.insert(h);
                    }
                    Err(err) => warnings.error(
                        object,
                        Reason::InvalidHost,
                        format!("{field}.hosts[{j}]: {err}; the host is ignored"),
                    ),
                }
            }
            let declared = entry
                .secret_name
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(|name| ObjectRef::new(object.namespace.clone(), name));
            let resolved = declared.as_ref().and_then(|secret_ref| {
                let serves = hosts.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                let Some(secret) = snapshot.secrets.get(secret_ref) else {
                    warnings.error(
                        object,
                        Reason::SecretNotFound,
                        format!(
                            "{field}.secretName: Secret {secret_ref} not found; the default certificate serves {serves}"
                        ),
                    );
                    return None;
                };
                match certificate(secret_ref, secret) {
                    Ok(cert) => {
                        certificates.insert(secret_ref.clone(), cert);
                        Some(secret_ref.clone())
                    }
                    Err(err) => {
                        warnings.error(
                            object,
                            Reason::InvalidSecret,
                            format!("{field}.secretName: {err}; the default certificate serves {serves}"),
                        );
                        None
                    }
                }
            });
            for host in hosts {
                claims.entry(host).or_default().push(Claim {
                    rank: ing.rank.clone(),
                    seq: i,
                    field: field.clone(),
                    declared: declared.clone(),
                    resolved: resolved.clone(),
                });
            }
        }
    }

    let mut by_certificate: BTreeMap<Option<ObjectRef>, BTreeSet<HostMatch>> = BTreeMap::new();
    for (host, mut host_claims) in claims {
        host_claims.sort_by(|a, b| (&a.rank, a.seq).cmp(&(&b.rank, b.seq)));
        let mut host_claims = host_claims.into_iter();
        let Some(winner) = host_claims.next() else { continue };
        for loser in host_claims {
            if loser.declared == winner.declared {
                continue; // the same certificate: no conflict
            }
            let secret = |s: &Option<ObjectRef>| match s {
                Some(s) => format!("Secret {s}"),
                None => "the default certificate".to_string(),
            };
            warnings.error(
                &loser.rank.object,
                Reason::ConflictLost,
                format!(
                    "{}: {} already uses {} from {}; {} is not used for it",
                    loser.field,
                    describe_host(&host),
                    secret(&winner.declared),
                    winner.rank.explain_win(&loser.rank),
                    secret(&loser.declared),
                ),
            );
        }
        by_certificate.entry(winner.resolved).or_default().insert(host);
    }
    let entries: Vec<TlsEntry> = by_certificate
        .into_iter()
        .map(|(certificate, hosts)| TlsEntry {
            hosts: hosts.into_iter().collect(),
            certificate,
            listener: None,
            alternatives: Vec::new(),
        })
        .collect();
    let used: BTreeSet<&ObjectRef> = entries.iter().filter_map(|e| e.certificate.as_ref()).collect();
    certificates.retain(|k, _| used.contains(k));
    TlsPlan { entries, certificates }
}

/// The hosts an Ingress serves, for a TLS entry without `hosts`: those of its (valid) rules, or
/// any host when it has no rules (it is then the default backend). The API leaves this choice
/// to the controller; scoping it to the Ingress's own hosts keeps one Ingress from taking over
/// the fallback certificate of every other host.
fn served_hosts(ing: &Ours<'_>) -> BTreeSet<HostMatch> {
    let rules = ing.ingress.spec.as_ref().and_then(|s| s.rules.as_deref()).unwrap_or_default();
    if rules.is_empty() {
        return BTreeSet::from([HostMatch::Any]);
    }
    // Invalid hosts are reported by the route processor.
    rules.iter().filter_map(|r| HostMatch::parse(r.host.as_deref().unwrap_or("")).ok()).collect()
}

/// The certificate in a secret: any secret type with non-empty `tls.crt` and `tls.key` text.
pub(crate) fn certificate(secret_ref: &ObjectRef, secret: &Secret) -> Result<Certificate, Error> {
    let get = |key: &'static str| {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .filter(|b| !b.0.is_empty())
            .ok_or_else(|| Error::MissingKey { secret: secret_ref.clone(), key })?;
        String::from_utf8(bytes.0.clone()).map_err(|_| Error::NotText { secret: secret_ref.clone(), key })
    };
    let cert = Certificate { chain_pem: get(TLS_CRT)?, key_pem: get(TLS_KEY)? };
    weir_dataplane::tls::certified_key(&cert)
        .map_err(|source| Error::Unusable { secret: secret_ref.clone(), source })?;
    Ok(cert)
}

/// The configured default certificate (`--default-certificate`), if its Secret is usable;
/// otherwise an error on the Secret, and the dataplane's self-signed certificate serves.
pub(crate) fn default_certificate(
    secret_ref: &ObjectRef,
    snapshot: &Snapshot,
    warnings: &mut Warnings,
) -> Option<Certificate> {
    let fallback = "the self-signed default certificate is used instead";
    let Some(secret) = snapshot.secrets.get(secret_ref) else {
        warnings.error_on(
            ObjectKind::Secret,
            secret_ref,
            Reason::SecretNotFound,
            format!("the default certificate Secret {secret_ref} was not found; {fallback}"),
        );
        return None;
    };
    match certificate(secret_ref, secret) {
        Ok(cert) => Some(cert),
        Err(err) => {
            warnings.error_on(
                ObjectKind::Secret,
                secret_ref,
                Reason::InvalidSecret,
                format!("default certificate: {err}; {fallback}"),
            );
            None
        }
    }
}

/// Which route hosts have TLS: those a TLS entry names, and those a wildcard entry covers.
pub(crate) struct Coverage<'a> {
    hosts: HashSet<&'a HostMatch>,
    /// The suffixes of wildcard entries (`example.com` for `*.example.com`).
    wildcards: HashSet<&'a str>,
}

impl<'a> Coverage<'a> {
    pub(crate) fn new(entries: &'a [TlsEntry]) -> Self {
        let hosts: HashSet<&HostMatch> = entries.iter().flat_map(|e| &e.hosts).collect();
        let wildcards = hosts
            .iter()
            .filter_map(|h| match h {
                HostMatch::Wildcard(suffix) => Some(suffix.as_str()),
                _ => None,
            })
            .collect();
        Coverage { hosts, wildcards }
    }

    /// Whether `host` has TLS.
    pub(crate) fn covers(&self, host: &HostMatch) -> bool {
        self.hosts.contains(host)
            || matches!(host, HostMatch::Exact(name) if name
                .split_once('.')
                .is_some_and(|(label, suffix)| !label.is_empty() && self.wildcards.contains(suffix)))
    }
}
