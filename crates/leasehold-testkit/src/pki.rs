//! Certificate authorities and certificates for TLS tests, written as PEM
//! files into a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// A CA that signs certificates for tests.
pub struct Ca {
    /// Its certificate (PEM): what a client or server trusts.
    pub cert: PathBuf,
    dir: PathBuf,
    certificate: Certificate,
    key: KeyPair,
}

impl Ca {
    /// A new CA named `name`, its files in `dir`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let certificate = params.self_signed(&key).expect("self-sign the CA");
        let cert = dir.join(format!("{name}.pem"));
        std::fs::write(&cert, certificate.pem()).expect("write the CA");
        Ca {
            cert,
            dir: dir.to_path_buf(),
            certificate,
            key,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses), for servers
    /// and clients alike, as `file.pem` and `file-key.pem`.
    pub fn issue(&self, file: &str, names: &[&str]) -> Issued {
        let key = KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("certificate params");
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let certificate = params
            .signed_by(&key, &self.certificate, &self.key)
            .expect("sign");
        let issued = Issued {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}-key.pem")),
        };
        std::fs::write(&issued.cert, certificate.pem()).expect("write certificate");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write key");
        issued
    }

    /// Peer certificates for nodes 1..=n, node N's naming `N.node.leasehold`
    /// (index N - 1).
    pub fn node_certs(&self, n: u64) -> Vec<Issued> {
        (1..=n)
            .map(|id| self.issue(&format!("node{id}"), &[&format!("{id}.node.leasehold")]))
            .collect()
    }
}
