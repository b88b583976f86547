//! TLS on the node's one port, with rustls: for clients (gRPC, HTTP and the
//! framed protocol alike) and, with certificates of their own, between peers.
//!
//! - **Clients.** With `--tls-cert`/`--tls-key` the port speaks TLS only: a
//!   plaintext connection is closed at once. With `--tls-client-ca` a client
//!   must also present a certificate signed by that CA (mutual TLS).
//! - **Peers.** With `--peer-tls-cert`/`--peer-tls-key`/`--peer-tls-ca`,
//!   nodes talk mutual TLS under a CA of their own. A node's certificate
//!   names it as the DNS name `ID.node.leasehold` ([`peer_name`]). A node
//!   calling a peer asks for that name (SNI) and accepts only a certificate
//!   for it; a node answering a Raft call accepts it only over a connection
//!   whose certificate, signed by the peer CA, names the node id the call
//!   claims to come from. A certificate of the client CA never passes for a
//!   peer's.
//! - **Reload.** [`Tls::reload`] (on SIGHUP) reads every file again; new
//!   connections get the new certificates, open ones and every lock stay.
//!   A file that does not load leaves the old settings in force.

use parking_lot::RwLock;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpStream;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::{
    ClientHello, ParsedCertificate, ResolvesServerCert, WebPkiClientVerifier,
};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{
    DigitallySignedStruct, DistinguishedName, Error as TlsError, RootCertStore, ServerConfig,
    SignatureScheme,
};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The DNS name a node's peer certificate carries: `ID.node.leasehold`.
pub fn peer_name(id: u64) -> String {
    format!("{id}.{PEER_DOMAIN}")
}

const PEER_DOMAIN: &str = "node.leasehold";

/// The first byte of a TLS connection (a handshake record).
pub const HANDSHAKE: u8 = 0x16;

/// Certificate, key and CA files, as given.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// The certificate (chain) clients see.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
    /// Clients must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
    /// This node's peer certificate (chain), naming `ID.node.leasehold`.
    pub peer_cert: Option<PathBuf>,
    /// Its private key.
    pub peer_key: Option<PathBuf>,
    /// The CA that signs every node's peer certificate.
    pub peer_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether clients must speak TLS.
    pub fn for_clients(&self) -> bool {
        self.cert.is_some()
    }

    /// Whether peers speak mutual TLS.
    pub fn for_peers(&self) -> bool {
        self.peer_cert.is_some()
    }

    /// Checks that the files come in the sets they must.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.cert.is_some() == self.key.is_some(),
            "--tls-cert and --tls-key go together"
        );
        anyhow::ensure!(
            self.client_ca.is_none() || self.cert.is_some(),
            "--tls-client-ca needs --tls-cert and --tls-key (clients can only show certificates over TLS)"
        );
        let peer = [&self.peer_cert, &self.peer_key, &self.peer_ca];
        anyhow::ensure!(
            peer.iter().all(|p| p.is_some()) || peer.iter().all(|p| p.is_none()),
            "--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together"
        );
        Ok(())
    }
}

/// The settings in force, as loaded from the files.
struct Loaded {
    acceptor: TlsAcceptor,
    /// Verifies a connection's certificate as a peer's.
    peer_verifier: Option<Arc<dyn ClientCertVerifier>>,
    /// PEM files a node presents and trusts when it calls a peer.
    peer_client: Option<PeerFiles>,
    /// Counts loads, so callers can tell their copies are stale.
    generation: u64,
}

/// What a node needs to call its peers over mutual TLS.
#[derive(Clone)]
pub struct PeerFiles {
    /// The peer CA, PEM.
    pub ca: Vec<u8>,
    /// This node's peer certificate, PEM.
    pub cert: Vec<u8>,
    /// Its key, PEM.
    pub key: Vec<u8>,
    /// Which load these came from.
    pub generation: u64,
}

/// A node's TLS settings, reloadable.
pub struct Tls {
    files: TlsFiles,
    loaded: RwLock<Arc<Loaded>>,
}

/// A connection's certificate, when it is a peer's (signed by the peer CA);
/// put in each request's extensions for the Raft service to check.
#[derive(Clone, Debug)]
pub struct PeerCertificate(pub CertificateDer<'static>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

impl Tls {
    /// Loads the files; `None` when no TLS is configured.
    pub fn load(files: TlsFiles) -> anyhow::Result<Option<Arc<Tls>>> {
        files.check()?;
        if !files.for_clients() && !files.for_peers() {
            return Ok(None);
        }
        // One provider for the process: rustls, tonic's client and reqwest
        // all use ring.
        let _ = ring::default_provider().install_default();
        let loaded = load(&files, 1)?;
        Ok(Some(Arc::new(Tls {
            files,
            loaded: RwLock::new(Arc::new(loaded)),
        })))
    }

    fn current(&self) -> Arc<Loaded> {
        self.loaded.read().clone()
    }

    /// Reads every file again; on an error the settings in force stay.
    pub fn reload(&self) -> anyhow::Result<()> {
        let generation = self.current().generation + 1;
        let loaded = load(&self.files, generation)?;
        *self.loaded.write() = Arc::new(loaded);
        Ok(())
    }

    /// Whether a plaintext client is turned away.
    pub fn clients_need_tls(&self) -> bool {
        self.files.for_clients()
    }

    /// Whether clients must show a certificate.
    pub fn clients_need_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Whether Raft calls must come over a connection with a peer certificate.
    pub fn peers_need_certificates(&self) -> bool {
        self.files.for_peers()
    }

    /// What this node presents and trusts when it calls a peer.
    pub fn peer_client(&self) -> Option<PeerFiles> {
        self.current().peer_client.clone()
    }

    /// The TLS handshake of an accepted connection, and its certificate if
    /// it is a peer's.
    pub async fn accept(
        &self,
        stream: TcpStream,
        timeout: Duration,
    ) -> anyhow::Result<(TlsStream<TcpStream>, Option<PeerCertificate>)> {
        let loaded = self.current();
        let stream = tokio::time::timeout(timeout, loaded.acceptor.accept(stream))
            .await
            .context("TLS handshake timed out")?
            .context("TLS handshake")?;
        let peer = match (
            &loaded.peer_verifier,
            stream.get_ref().1.peer_certificates(),
        ) {
            (Some(verifier), Some([end, rest @ ..])) => verifier
                .verify_client_cert(end, rest, UnixTime::now())
                .ok()
                .map(|_| PeerCertificate(end.clone().into_owned())),
            _ => None,
        };
        Ok((stream, peer))
    }
}

/// The subject of a client's certificate, as `CN=alice,O=acme`: who made a
/// change, for the audit trail. The certificate has passed the handshake's
/// checks; its subject is still read with every length checked, and
/// `None` comes back for anything unexpected. Only the usual attributes
/// are named (CN, O, OU, L, ST, C); the rest are left out.
pub fn subject(cert: &CertificateDer<'_>) -> Option<String> {
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version
    // OPTIONAL, serialNumber, signature, issuer, validity, subject, ... } }
    let (_, certificate, _) = der::read(cert.as_ref(), der::SEQUENCE)?;
    let (_, mut tbs, _) = der::read(certificate, der::SEQUENCE)?;
    if tbs.first() == Some(&der::VERSION) {
        tbs = der::next(tbs)?;
    }
    for _ in 0..4 {
        tbs = der::next(tbs)?; // serial, signature, issuer, validity
    }
    let (_, mut names, _) = der::read(tbs, der::SEQUENCE)?;
    let mut parts = Vec::new();
    // RDNSequence: SET OF SEQUENCE { type OID, value }.
    while !names.is_empty() {
        let (_, mut set, rest) = der::read(names, der::SET)?;
        names = rest;
        while !set.is_empty() {
            let (_, pair, rest) = der::read(set, der::SEQUENCE)?;
            set = rest;
            let (_, oid, value) = der::read(pair, der::OID)?;
            let (tag, text, _) = der::any(value)?;
            let name = match oid {
                [0x55, 0x04, 0x03] => "CN",
                [0x55, 0x04, 0x0a] => "O",
                [0x55, 0x04, 0x0b] => "OU",
                [0x55, 0x04, 0x07] => "L",
                [0x55, 0x04, 0x08] => "ST",
                [0x55, 0x04, 0x06] => "C",
                _ => continue,
            };
            // UTF8String, PrintableString, IA5String, TeletexString.
            if matches!(tag, 0x0c | 0x13 | 0x16 | 0x14) {
                parts.push(format!("{name}={}", String::from_utf8_lossy(text)));
            }
        }
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// Just enough DER to find a certificate's subject.
mod der {
    pub const SEQUENCE: u8 = 0x30;
    pub const SET: u8 = 0x31;
    pub const OID: u8 = 0x06;
    /// `[0] EXPLICIT Version`.
    pub const VERSION: u8 = 0xa0;

    /// The first element of `input`: its tag, its contents and what follows it.
    pub fn any(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return None;
            }
            let len = rest[..count]
                .iter()
                .fold(0usize, |n, b| (n << 8) | usize::from(*b));
            (len, &rest[count..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }

    /// The first element of `input` if it has tag `tag`.
    pub fn read(input: &[u8], tag: u8) -> Option<(u8, &[u8], &[u8])> {
        any(input).filter(|(t, _, _)| *t == tag)
    }

    /// What follows the first element of `input`.
    pub fn next(input: &[u8]) -> Option<&[u8]> {
        any(input).map(|(_, _, rest)| rest)
    }
}

/// A client certificate's subject ([`subject`]), in a request's extensions
/// for the audit trail.
#[derive(Clone, Debug)]
pub struct ClientSubject(pub Arc<str>);

/// Whether `cert` names node `id` (`ID.node.leasehold`).
pub fn names_node(cert: &PeerCertificate, id: u64) -> bool {
    let Ok(name) = ServerName::try_from(peer_name(id)) else {
        return false;
    };
    ParsedCertificate::try_from(&cert.0)
        .and_then(|parsed| tokio_rustls::rustls::client::verify_server_name(&parsed, &name))
        .is_ok()
}

fn read(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    fs::read(path).with_context(|| format!("read {what} {}", path.display()))
}

fn certs(pem: &[u8], path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not PEM certificates", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{}: no certificate in it",
        path.display()
    );
    Ok(certs)
}

fn key(pem: &[u8], path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    rustls_pemfile::private_key(&mut &pem[..])
        .with_context(|| format!("{}: not a PEM private key", path.display()))?
        .with_context(|| format!("{}: no private key in it", path.display()))
}

fn certified(cert: &Path, key_path: &Path) -> anyhow::Result<Arc<CertifiedKey>> {
    let chain = certs(&read(cert, "certificate")?, cert)?;
    let key = key(&read(key_path, "key")?, key_path)?;
    let signer = ring::sign::any_supported_type(&key)
        .with_context(|| format!("{}: unsupported key", key_path.display()))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().with_context(|| {
        format!(
            "{} is not the key of {}",
            key_path.display(),
            cert.display()
        )
    })?;
    Ok(Arc::new(certified))
}

fn verifier(
    ca: &Path,
    provider: &Arc<CryptoProvider>,
) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    for cert in certs(&read(ca, "CA")?, ca)? {
        roots
            .add(cert)
            .with_context(|| format!("{}: not a CA certificate", ca.display()))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .with_context(|| format!("CA {}", ca.display()))
}

fn load(files: &TlsFiles, generation: u64) -> anyhow::Result<Loaded> {
    let provider = Arc::new(ring::default_provider());
    let server = match (&files.cert, &files.key) {
        (Some(c), Some(k)) => Some(certified(c, k)?),
        _ => None,
    };
    let (peer, peer_verifier, peer_client) =
        match (&files.peer_cert, &files.peer_key, &files.peer_ca) {
            (Some(c), Some(k), Some(ca)) => (
                Some(certified(c, k)?),
                Some(verifier(ca, &provider)?),
                Some(PeerFiles {
                    ca: read(ca, "peer CA")?,
                    cert: read(c, "peer certificate")?,
                    key: read(k, "peer key")?,
                    generation,
                }),
            ),
            _ => (None, None, None),
        };
    let client_verifier = match &files.client_ca {
        Some(ca) => Some(verifier(ca, &provider)?),
        None => None,
    };
    let verifier: Arc<dyn ClientCertVerifier> = match (&peer_verifier, &client_verifier) {
        (None, None) => WebPkiClientVerifier::no_client_auth(),
        _ => Arc::new(EitherCa::new(peer_verifier.clone(), client_verifier)),
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(BySni { server, peer }));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Loaded {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        peer_verifier,
        peer_client,
        generation,
    })
}

/// Shows the peer certificate to a caller that asks for `ID.node.leasehold`,
/// the client one to everyone else.
#[derive(Debug)]
struct BySni {
    server: Option<Arc<CertifiedKey>>,
    peer: Option<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let to_peer = hello
            .server_name()
            .is_some_and(|name| name.ends_with(&format!(".{PEER_DOMAIN}")));
        match to_peer {
            true => self.peer.clone().or_else(|| self.server.clone()),
            false => self.server.clone().or_else(|| self.peer.clone()),
        }
    }
}

/// Accepts a client certificate signed by either CA: the peers' first, then
/// the clients'. A certificate is required only when clients must show one.
#[derive(Debug)]
struct EitherCa {
    verifiers: Vec<Arc<dyn ClientCertVerifier>>,
    mandatory: bool,
    hints: Vec<DistinguishedName>,
}

impl EitherCa {
    fn new(
        peer: Option<Arc<dyn ClientCertVerifier>>,
        client: Option<Arc<dyn ClientCertVerifier>>,
    ) -> EitherCa {
        let mandatory = client.is_some();
        let verifiers: Vec<_> = peer.into_iter().chain(client).collect();
        let hints = verifiers
            .iter()
            .flat_map(|v| v.root_hint_subjects().to_vec())
            .collect();
        EitherCa {
            verifiers,
            mandatory,
            hints,
        }
    }

    /// The signature checks are the provider's, the same in both.
    fn signatures(&self) -> Result<&Arc<dyn ClientCertVerifier>, TlsError> {
        self.verifiers
            .first()
            .ok_or_else(|| TlsError::General("no CA to check a client certificate against".into()))
    }
}

impl ClientCertVerifier for EitherCa {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, TlsError> {
        let mut last = TlsError::General("no CA to check a client certificate against".into());
        for verifier in &self.verifiers {
            match verifier.verify_client_cert(end_entity, intermediates, now) {
                Ok(ok) => return Ok(ok),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.signatures()?
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.signatures()?
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures()
            .map(|v| v.supported_verify_schemes())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(name: &str) -> CertificateDer<'static> {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = leasehold_testkit::pki::Ca::new(dir.path(), "test-ca");
        let cert = ca.issue(name, &["localhost"]);
        let pem = std::fs::read(&cert.cert).expect("read certificate");
        certs(&pem, &cert.cert).expect("parse").remove(0)
    }

    #[test]
    fn a_certificates_subject_is_read() {
        assert_eq!(subject(&issued("alice")).as_deref(), Some("CN=alice"));
    }

    /// Every cut of a real certificate, and every byte of it flipped, is
    /// read without a panic.
    #[test]
    fn damaged_certificates_never_panic() {
        let der = issued("bob").as_ref().to_vec();
        for cut in 0..der.len() {
            let _ = subject(&CertificateDer::from(der[..cut].to_vec()));
        }
        for at in 0..der.len() {
            let mut flipped = der.clone();
            flipped[at] ^= 0xff;
            let _ = subject(&CertificateDer::from(flipped));
        }
    }
}
