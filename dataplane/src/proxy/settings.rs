//! The table's global settings applied to the proxy: each key set in the ConfigMap overrides
//! the [`ProxyConfig`] value (a command-line flag or the built-in default) for as long as the
//! table is live, so a settings change takes effect with the next publish, without a restart.

use std::sync::Arc;
use std::time::Duration;

use super::accesslog::{Format, Output};
use super::{Proxy, ProxyConfig, Publisher};
use crate::model::Settings;
use crate::route::realip::RealIp;
use crate::tls;

/// Upper bound of `proxy-next-upstream-tries` (`0` means every endpoint, up to this many).
const MAX_TRIES: usize = 8;

impl ProxyConfig {
    /// This configuration with `settings` applied over it.
    pub fn with_settings(&self, settings: &Settings) -> ProxyConfig {
        let mut config = self.clone();
        if let Some(forwarded) = &settings.forwarded {
            match RealIp::new(forwarded) {
                Ok(real_ip) => config.real_ip = Some(real_ip),
                Err(error) => {
                    tracing::warn!(header = forwarded.client_header, %error, "forwarded-for-header unusable; ignored")
                }
            }
        }
        if let Some(hsts) = &settings.hsts {
            config.hsts = hsts.header_value().and_then(|v| http::HeaderValue::from_str(&v).ok());
        }
        if let Some(limit) = settings.max_body_bytes {
            config.max_request_body = (limit > 0).then_some(limit);
        }
        if let Some(ms) = settings.read_timeout_ms {
            config.upstream_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = settings.connect_timeout_ms {
            config.connect_timeout = Duration::from_millis(ms);
        }
        if let Some(tries) = settings.connect_tries {
            config.connect_tries = if tries == 0 { MAX_TRIES } else { (tries as usize).min(MAX_TRIES) };
        }
        if let Some(yes) = settings.retry_non_idempotent {
            config.retry_non_idempotent = yes;
        }
        if let Some(on) = &settings.next_upstream {
            config.next_upstream = super::Retry::new(on);
        }
        config.next_upstream = config.next_upstream.with_non_idempotent(config.retry_non_idempotent);
        if let Some(ms) = settings.next_upstream_timeout_ms {
            config.next_upstream_timeout = (ms > 0).then(|| Duration::from_millis(ms));
        }
        if let Some(ms) = settings.send_timeout_ms {
            config.send_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = settings.client_header_timeout_ms {
            config.header_read_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = settings.client_body_timeout_ms {
            config.client_body_timeout = Duration::from_millis(ms);
        }
        if let Some(max) = settings.upstream_idle_max {
            config.pool_max_idle_per_host = max as usize;
        }
        if let Some(ms) = settings.upstream_idle_timeout_ms {
            config.pool_idle_timeout = Duration::from_millis(ms);
        }
        if let Some(n) = settings.upstream_conn_requests {
            config.pool_max_requests = (n > 0).then_some(n);
        }
        if let Some(ms) = settings.upstream_conn_lifetime_ms {
            config.pool_max_lifetime = (ms > 0).then(|| Duration::from_millis(ms));
        }
        if let Some(secs) = settings.keepalive_secs {
            config.keepalive = Some(Duration::from_secs(secs));
        }
        if let Some(requests) = settings.keepalive_requests {
            config.keepalive_requests = Some(requests);
        }
        if let Some(reuse) = settings.upstream_keepalive {
            config.upstream_keepalive = reuse;
        }
        if let Some(secs) = settings.drain_secs {
            config.drain_timeout = Duration::from_secs(secs);
        }
        if let Some(pass) = settings.underscores_in_headers {
            config.underscores_in_headers = pass;
        }
        if let Some(merge) = settings.merge_slashes {
            config.paths.merge_slashes = merge;
        }
        if let Some(reject) = settings.reject_encoded_slashes {
            config.paths.reject_encoded_slashes = reject;
        }
        if let Some(on) = settings.proxy_protocol {
            config.proxy_protocol = on;
        }
        if let Some(compression) = &settings.compression {
            config.compression = super::compress::Config::new(compression).map(Arc::new);
        }
        if settings.allow_backend_server_header.is_some() || !settings.hide_headers.is_empty() {
            let mut hidden =
                super::headers::hidden_by_default(settings.allow_backend_server_header == Some(true));
            for name in &settings.hide_headers {
                match http::HeaderName::from_bytes(name.as_bytes()) {
                    Ok(name) if !hidden.contains(&name) => hidden.push(name),
                    Ok(_) => {}
                    Err(_) => tracing::warn!(header = name, "hide-headers: not a header name; ignored"),
                }
            }
            config.hidden_response_headers = hidden.into();
        }
        if let Some(on) = settings.original_uri_header {
            config.original_uri_header = on;
        }
        config.client_limits.clone_from(&settings.client_limits);
        config.blocklists =
            super::blocklist::Blocklists::new(&settings.block_user_agents, &settings.block_referers)
                .map(Arc::new);
        config.access_log = access_log(&mut config.access_log_output, settings);
        for (list, field, headers) in [
            (&mut config.response_headers, "add-headers", &settings.response_headers),
            (&mut config.upstream_headers, "proxy-set-headers", &settings.upstream_headers),
        ] {
            for (name, value) in headers {
                let one = std::collections::BTreeMap::from([(name.clone(), value.clone())]);
                match crate::route::policy::compile_headers(field, &one) {
                    Ok(parsed) => list.extend(parsed),
                    Err(error) => tracing::warn!(%error, "header unusable; ignored"),
                }
            }
        }
        config
    }
}

/// The access log's format under `settings` (`None`: no access log), and its destination
/// (`access-log-path` over the flag's).
fn access_log(output: &mut Output, settings: &Settings) -> Option<Arc<Format>> {
    let logging = &settings.logging;
    if let Some(path) = &logging.path {
        match path.parse::<Output>() {
            Ok(path) => *output = path,
            Err(error) => tracing::warn!(%error, "access-log-path unusable; ignored"),
        }
    }
    // `enable-syslog`: the access log goes to syslog instead, as ingress-nginx sends it.
    if let Some(syslog) = &logging.syslog {
        *output = Output::Syslog { host: syslog.host.clone(), port: syslog.port };
    }
    if logging.access_log_off || *output == Output::Off {
        return None;
    }
    let format = match &settings.access_log {
        Some(fields) => Format::new(fields),
        None => Format::new(&Format::default_fields()),
    };
    Some(Arc::new(
        format
            .skipping(&logging.skip_urls)
            .with_default_backend(logging.default_backend)
            .with_auth_subrequests(logging.auth),
    ))
}

impl Proxy {
    /// The TLS server config offering the table's `ssl-protocols`, reused (with its session
    /// cache) while they stay the same; `None`: the listener's own (TLS 1.2 and 1.3).
    pub(super) fn tls_config(
        &self,
        settings: &Settings,
        publisher: &mut Publisher,
    ) -> Option<Arc<rustls::ServerConfig>> {
        let versions = settings.tls_versions.clone().filter(|v| !v.is_empty());
        let ciphers = settings.tls_ciphers.clone().filter(|c| !c.is_empty());
        let options = tls::options::choice(&settings.tls_keys);
        if versions.is_none() && ciphers.is_none() && options == tls::options::Choice::default() {
            return None;
        }
        let wanted = (versions.unwrap_or_default(), ciphers.unwrap_or_default(), options);
        if let Some((current, config)) = &publisher.tls
            && *current == wanted
        {
            return Some(config.clone());
        }
        match self.server_config(settings) {
            Ok(config) => {
                let config = Arc::new(config);
                publisher.tls = Some((wanted, config.clone()));
                Some(config)
            }
            Err(error) => {
                tracing::error!(%error, "ssl-protocols/ssl-ciphers: building the TLS configuration failed; every version and suite stays offered");
                None
            }
        }
    }

    /// The TLS config of the names `table` terminates and relays as plain TCP
    /// ([`crate::model::Passthrough::relay`]): the table's (`ssl-protocols`, `ssl-ciphers`),
    /// offering no ALPN, since the bytes it carries are no HTTP of weir's (a client's ALPN is
    /// then ignored, not refused). `None` when the table relays nothing, or the config cannot
    /// be built (logged; the listener's own serves them).
    pub(super) fn relay_tls_config(
        &self,
        table: &crate::model::RouteTable,
    ) -> Option<Arc<rustls::ServerConfig>> {
        if !table.passthrough.iter().any(|p| p.relay && !p.terminate) {
            return None;
        }
        match self.server_config(&table.settings) {
            Ok(mut config) => {
                config.alpn_protocols.clear();
                Some(Arc::new(config))
            }
            Err(error) => {
                tracing::error!(%error, "building the TLS configuration of relayed TLS names failed; they are served with ALPN");
                None
            }
        }
    }

    /// The client certificate policies of `table`, reused while they, the hosts' own TLS
    /// options, the listener's TLS settings (and the Gateway listeners' TLS entries) stay the same: the host configs' session caches
    /// live on across tables that change only routes or endpoints.
    pub(super) fn client_auth(
        &self,
        table: &crate::model::RouteTable,
        publisher: &mut Publisher,
    ) -> Arc<tls::mtls::ClientAuthIndex> {
        if table.client_auth.is_empty() {
            publisher.client_auth = None;
            return Arc::default();
        }
        let settings = &table.settings;
        let options = tls::options::choice(&settings.tls_keys);
        // Compared in place: the policies (CA certificates) are cloned only when they changed.
        // Which names belong to which Gateway listener decides the policy of a name; the TLS
        // entries are part of what the index is built from when the table has listeners.
        let listeners = table.tls.iter().any(|t| t.listener.is_some());
        let entries: &[crate::model::TlsEntry] = if listeners { &table.tls } else { &[] };
        if let Some(((auth, hosts, versions, ciphers, choice, tls), index)) = &publisher.client_auth
            && (auth, hosts, versions, ciphers, choice, tls.as_slice())
                == (
                    &table.client_auth,
                    &table.host_tls,
                    &settings.tls_versions,
                    &settings.tls_ciphers,
                    &options,
                    entries,
                )
        {
            return index.clone();
        }
        let index = Arc::new(tls::mtls::ClientAuthIndex::compile(table, &self.resolver()));
        let wanted = (
            table.client_auth.clone(),
            table.host_tls.clone(),
            settings.tls_versions.clone(),
            settings.tls_ciphers.clone(),
            options,
            entries.to_vec(),
        );
        publisher.client_auth = Some((wanted, index.clone()));
        index
    }

    /// A server config without client authentication over the live certificates, offering the
    /// versions and suites of `settings`: the listener's own (default settings) and the one of
    /// `ssl-protocols`/`ssl-ciphers`. All of them share the proxy's session cache, which is
    /// safe because they differ in nothing a resumed session skips.
    pub(super) fn server_config(&self, settings: &Settings) -> Result<rustls::ServerConfig, tls::Error> {
        let mut config = tls::server_config_for(self.resolver(), settings)?;
        config.session_storage = self.inner.sessions.clone();
        config.ticketer = self.inner.tickets.clone();
        Ok(config)
    }

    /// Applies the table's `ssl-session-*` settings to the session cache.
    pub(super) fn configure_sessions(&self, settings: &Settings) {
        use crate::tls::sessions::{DEFAULT_SESSIONS, DEFAULT_TIMEOUT};
        let capacity = settings.tls_sessions.map_or(DEFAULT_SESSIONS, |n| n as usize);
        let timeout =
            settings.tls_session_timeout_secs.map_or(DEFAULT_TIMEOUT, |s| Duration::from_secs(s.into()));
        self.inner.sessions.configure(capacity, timeout);
        let keys = &settings.tls_keys;
        let secret = keys.session_ticket_key.as_ref().map(|k| k.0.as_slice());
        self.inner.tickets.configure(keys.session_tickets == Some(true), secret, timeout);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::{Forwarded, Hsts};

    #[test]
    fn settings_override_the_flags_and_none_keeps_them() {
        let base =
            ProxyConfig { hsts: Some(http::HeaderValue::from_static("max-age=5")), ..ProxyConfig::default() };
        let same = base.with_settings(&Settings::default());
        assert_eq!(same.hsts, base.hsts);
        assert_eq!(same.max_request_body, None);
        assert!(same.upstream_keepalive);

        let settings = Settings {
            hsts: Some(Hsts { enabled: true, max_age: 100, include_subdomains: false, preload: true }),
            max_body_bytes: Some(1024),
            connect_tries: Some(0),
            keepalive_secs: Some(0),
            upstream_keepalive: Some(false),
            drain_secs: Some(7),
            forwarded: Some(Forwarded {
                trust_headers: true,
                client_header: "x-forwarded-for".into(),
                trusted: vec!["10.0.0.0/8".parse().unwrap()],
                full_chain: false,
            }),
            ..Settings::default()
        };
        let c = base.with_settings(&settings);
        assert_eq!(c.hsts.unwrap(), "max-age=100; preload");
        assert_eq!(c.max_request_body, Some(1024));
        assert_eq!(c.connect_tries, MAX_TRIES);
        assert_eq!(c.keepalive, Some(Duration::ZERO));
        assert!(!c.upstream_keepalive);
        assert_eq!(c.drain_timeout, Duration::from_secs(7));
        assert!(c.real_ip.unwrap().is_trusted("10.1.2.3".parse().unwrap()));

        let off = Settings {
            hsts: Some(Hsts { enabled: false, max_age: 1, include_subdomains: true, preload: false }),
            max_body_bytes: Some(0),
            ..Settings::default()
        };
        let c = base.with_settings(&off);
        assert_eq!(c.hsts, None);
        assert_eq!(c.max_request_body, None);
    }

    #[test]
    fn retries_and_upstream_connections() {
        use crate::model::RetryOn;
        let base = ProxyConfig::default();
        assert_eq!(base.with_settings(&Settings::default()).next_upstream, super::super::Retry::DEFAULT);
        let settings = Settings {
            next_upstream: Some(vec![RetryOn::Http502]),
            retry_non_idempotent: Some(true),
            next_upstream_timeout_ms: Some(0),
            send_timeout_ms: Some(1_500),
            upstream_idle_max: Some(16),
            upstream_idle_timeout_ms: Some(5_000),
            upstream_conn_requests: Some(100),
            upstream_conn_lifetime_ms: Some(60_000),
            ..Settings::default()
        };
        let c = base.with_settings(&settings);
        assert!(c.next_upstream.on_status(http::StatusCode::BAD_GATEWAY));
        assert!(!c.next_upstream.on(RetryOn::Error));
        assert!(c.next_upstream.may_resend(&http::Method::POST));
        assert_eq!(c.next_upstream_timeout, None);
        assert_eq!(c.send_timeout, Duration::from_millis(1_500));
        assert_eq!(c.pool_max_idle_per_host, 16);
        assert_eq!(c.pool_idle_timeout, Duration::from_secs(5));
        assert_eq!(c.pool_max_requests, Some(100));
        assert_eq!(c.pool_max_lifetime, Some(Duration::from_secs(60)));
        let limited = Settings { next_upstream_timeout_ms: Some(250), ..Settings::default() };
        assert_eq!(base.with_settings(&limited).next_upstream_timeout, Some(Duration::from_millis(250)));
    }
}
