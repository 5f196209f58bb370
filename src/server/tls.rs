//! TLS for client connections (rustls, its `ring` provider): the server's certificate and
//! client-certificate policy, loaded at startup and again on SIGHUP, and the per-connection
//! record layer that `conn.rs` runs over the non-blocking socket.
//!
//! Where it applies: the RESP TLS listener (`tls_port`, Redis's `tls-port`, beside the plain
//! `resp_port`), and the memcached port when `memcache_tls` is on (memcached's `-Z`: that port
//! then speaks only TLS). Both use one certificate (`tls_cert_file`, `tls_key_file`, PEM; the
//! chain's first certificate is the server's) and one client policy: `tls_auth_clients` `no`
//! (never ask), `optional` (ask, accept none, verify any given against `tls_ca_cert_file`) or
//! `yes` (require one that verifies); unset, it is `yes` with a CA file and `no` without, so
//! `-Z` alone serves TLS the way memcached's default `ssl_verify_mode=0` does.
//!
//! A reload (SIGHUP) builds a new configuration from the same files; connections accepted from
//! then on use it, established ones keep theirs. A reload that fails (a file missing or
//! malformed) is logged and the old configuration stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

use crate::config::{Config, TlsAuth};

/// The files and the policy a configuration is built from.
#[derive(Debug, Clone)]
struct Settings {
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
    auth: TlsAuth,
}

/// The current server configuration, shared by the workers.
pub struct TlsContext {
    settings: Settings,
    current: RwLock<Arc<ServerConfig>>,
}

impl TlsContext {
    /// The TLS context `cfg` asks for: None when no port speaks TLS; an error (one line for
    /// the operator) when one does and its files are missing, unreadable or malformed.
    pub fn from_config(cfg: &Config) -> Result<Option<Arc<TlsContext>>, String> {
        if cfg.tls_port == 0 && !cfg.memcache_tls {
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&cfg.tls_cert_file, &cfg.tls_key_file) else {
            return Err(
                "TLS needs tls_cert_file and tls_key_file (memcached's -o ssl_chain_cert=...,ssl_key=...)"
                    .into(),
            );
        };
        let auth = cfg.tls_auth();
        if auth != TlsAuth::No && cfg.tls_ca_cert_file.is_none() {
            return Err(format!(
                "tls_auth_clients = \"{}\" needs tls_ca_cert_file to verify client certificates against",
                auth.name()
            ));
        }
        let settings = Settings {
            cert: cert.clone(),
            key: key.clone(),
            ca: cfg.tls_ca_cert_file.clone(),
            auth,
        };
        let config = build(&settings)?;
        Ok(Some(Arc::new(TlsContext {
            settings,
            current: RwLock::new(config),
        })))
    }

    /// A server session for a new connection, under the current configuration.
    pub fn session(&self) -> Result<ServerConnection, rustls::Error> {
        let config = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        ServerConnection::new(config)
    }

    /// Reads the certificate, key and CA files again (SIGHUP).
    pub fn reload(&self) -> Result<(), String> {
        let config = build(&self.settings)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = config;
        Ok(())
    }
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let fail =
        |e: &dyn std::fmt::Display| format!("cannot read the {what} {}: {e}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| fail(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(&e))?;
    if certs.is_empty() {
        return Err(fail(&"no PEM certificate in it"));
    }
    Ok(certs)
}

fn build(s: &Settings) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = read_certs(&s.cert, "certificate file")?;
    let key = PrivateKeyDer::from_pem_file(&s.key)
        .map_err(|e| format!("cannot read the key file {}: {e}", s.key.display()))?;
    let verifier = match (&s.ca, s.auth) {
        (Some(ca), TlsAuth::Yes | TlsAuth::Optional) => {
            let mut roots = RootCertStore::empty();
            for c in read_certs(ca, "CA certificate file")? {
                roots
                    .add(c)
                    .map_err(|e| format!("CA certificate in {}: {e}", ca.display()))?;
            }
            let b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let b = if s.auth == TlsAuth::Optional {
                b.allow_unauthenticated()
            } else {
                b
            };
            b.build()
                .map_err(|e| format!("client certificate verifier: {e}"))?
        }
        _ => WebPkiClientVerifier::no_client_auth(),
    };
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS protocol versions: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| {
            format!(
                "the certificate in {} and the key in {} do not make a TLS identity: {e}",
                s.cert.display(),
                s.key.display()
            )
        })?;
    Ok(Arc::new(config))
}
