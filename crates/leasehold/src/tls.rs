//! TLS to leaseholdd: `https://` endpoints, the CA to trust, and an optional
//! client certificate for a server started with `--tls-client-ca`.
//!
//! ```no_run
//! # async fn f() -> leasehold::Result<()> {
//! use leasehold::{Client, TlsOptions};
//! let tls = TlsOptions::default()
//!     .ca_file("ca.pem")
//!     .identity_files("client.pem", "client-key.pem");
//! let client = Client::builder("https://10.0.0.1:7419,10.0.0.2:7419")
//!     .tls(tls)
//!     .connect()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Without a CA file the system's roots are trusted. The server's
//! certificate must name the host of the endpoint (a DNS name or an IP
//! address). Every protocol the client speaks (framed calls and gRPC) goes
//! over TLS when the endpoint says `https://`.
//!
//! The options are plain paths and always there; loading them (rustls,
//! tonic) comes with the `leaseholdd` feature, the only backend that
//! speaks TLS.

use std::path::PathBuf;
#[cfg(feature = "leaseholdd")]
use std::{path::Path, sync::Arc};

#[cfg(feature = "leaseholdd")]
use tokio_rustls::rustls::crypto::ring;
#[cfg(feature = "leaseholdd")]
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
#[cfg(feature = "leaseholdd")]
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

#[cfg(feature = "leaseholdd")]
use crate::{Error, Result};

/// Where the CA and the client certificate are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// CA certificates (PEM) to trust instead of the system's.
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM, chain) and its private key (PEM).
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl TlsOptions {
    /// Trusts the CA certificates in `path` (PEM).
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self
    }

    /// Presents this certificate and key (PEM) to servers that ask.
    pub fn identity_files(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    #[cfg(feature = "leaseholdd")]
    /// tonic's TLS settings for a gRPC channel of your own to leaseholdd at
    /// `host` (a DNS name or an IP address).
    pub fn grpc(&self, host: &str) -> Result<tonic::transport::ClientTlsConfig> {
        Ok(ClientTls::load(self)?.grpc(host))
    }

    /// From `LEASEHOLD_CACERT`, `LEASEHOLD_CLIENT_CERT` and
    /// `LEASEHOLD_CLIENT_KEY` (`LEASEHOLD_KEY` is the lock key `leasehold run`
    /// gives its command).
    pub fn from_env() -> Self {
        let var = |name| std::env::var_os(name).map(PathBuf::from);
        TlsOptions {
            ca: var("LEASEHOLD_CACERT"),
            identity: var("LEASEHOLD_CLIENT_CERT").zip(var("LEASEHOLD_CLIENT_KEY")),
        }
    }
}

/// What to do about a connection that failed for TLS, whatever reported it
/// (a framed call, gRPC, an HTTP client): walks `error` and its sources and
/// answers the advice for the first that names a TLS cause, `None` if none
/// does. Every command of the `leasehold` CLI explains its connection
/// failures with it, so one TLS mistake reads the same everywhere.
pub fn explain(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut at = Some(error);
    while let Some(e) = at {
        if let Some(advice) = advice(&e.to_string()).or_else(|| advice(&format!("{e:?}"))) {
            return Some(advice);
        }
        at = e.source();
    }
    None
}

#[cfg(feature = "leaseholdd")]
/// Why a TLS connection to leaseholdd at `addr` (`host:port`) with
/// `options` fails, if it fails for a TLS reason: a handshake is made and
/// what the server answers read (under TLS 1.3 a refused client certificate
/// is only said after the client's handshake is done, and HTTP stacks often
/// report it as a bare "connection closed"). The advice, or `None`.
pub async fn diagnose(addr: &str, options: &TlsOptions) -> Option<&'static str> {
    let tls = ClientTls::load(options).ok()?;
    crate::backend::frames::diagnose_tls(addr, &tls).await
}

/// What to do about a TLS failure, from its text (rustls names the cause:
/// the alert a server sent, or why this client refused the server's
/// certificate); `None` if it is not one.
pub fn advice(error: &str) -> Option<&'static str> {
    let has = |s: &str| error.contains(s);
    Some(if has("CertificateRequired") {
        "the server requires a client certificate: pass --client-cert and --client-key (LEASEHOLD_CLIENT_CERT, LEASEHOLD_CLIENT_KEY)"
    } else if has("UnknownIssuer") || has("BadSignature") {
        "the server's certificate is not signed by a CA this client trusts: pass --cacert with the CA that signed it (LEASEHOLD_CACERT)"
    } else if has("NotValidForName") {
        "the server's certificate does not name the host in the endpoint: connect by a name or address the certificate holds"
    } else if has("Expired") || has("NotValidYet") {
        "a certificate is outside its validity period: renew it (leaseholdd reloads its own on SIGHUP)"
    } else if has("UnknownCA") || has("BadCertificate") || has("DecryptError") {
        "the server does not accept this client certificate: use one signed by the CA of the server's --tls-client-ca"
    } else if has("InvalidContentType") || has("CorruptMessage") || has("corrupt message") {
        "the server does not speak TLS on this port: use http://"
    } else if has("tls handshake eof") || has("HandshakeFailure") {
        "the TLS handshake failed: check --cacert, --client-cert and --client-key against the server's TLS flags"
    } else {
        return None;
    })
}

#[cfg(feature = "leaseholdd")]
/// The options, loaded: what both protocols need.
#[derive(Clone)]
pub(crate) struct ClientTls {
    /// For the framed protocol.
    pub rustls: Arc<ClientConfig>,
    /// For gRPC.
    pub ca_pem: Option<Vec<u8>>,
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "leaseholdd")]
fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::InvalidArgument(format!("read {what} {}: {e}", path.display())))
}

#[cfg(feature = "leaseholdd")]
fn certs(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::InvalidArgument(format!("{}: not PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{}: no certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

#[cfg(feature = "leaseholdd")]
impl ClientTls {
    pub(crate) fn load(options: &TlsOptions) -> Result<ClientTls> {
        let invalid = |e: String| Error::InvalidArgument(e);
        let mut roots = RootCertStore::empty();
        let ca_pem = match &options.ca {
            Some(path) => {
                let pem = read(path, "CA file")?;
                for cert in certs(&pem, path)? {
                    roots
                        .add(cert)
                        .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
                }
                Some(pem)
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                None
            }
        };
        let provider = Arc::new(ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(format!("TLS: {e}")))?
            .with_root_certificates(roots);
        let (config, identity_pem) = match &options.identity {
            Some((cert_path, key_path)) => {
                let cert = read(cert_path, "client certificate")?;
                let key = read(key_path, "client key")?;
                let chain = certs(&cert, cert_path)?;
                let der: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key[..])
                    .ok()
                    .flatten()
                    .ok_or_else(|| {
                        invalid(format!("{}: no PEM private key in it", key_path.display()))
                    })?;
                let config = builder
                    .with_client_auth_cert(chain, der)
                    .map_err(|e| invalid(format!("client certificate: {e}")))?;
                (config, Some((cert, key)))
            }
            None => (builder.with_no_client_auth(), None),
        };
        Ok(ClientTls {
            rustls: Arc::new(config),
            ca_pem,
            identity_pem,
        })
    }

    /// tonic's settings for a server at `host`.
    pub(crate) fn grpc(&self, host: &str) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut config = ClientTlsConfig::new().domain_name(host);
        config = match &self.ca_pem {
            Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity_pem {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }
}
