//! TLS between the client and a real `leaseholdd`: every protocol over TLS,
//! plaintext turned away, a CA the client does not trust refused, client
//! certificates when the server asks for them, and certificates reloaded on
//! SIGHUP with the locks kept.

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::{Client, Error, LockOptions, TlsOptions};
use leasehold_testkit::pki::{Ca, Issued};
use leasehold_testkit::{http_get, Leaseholdd};

fn opts() -> LockOptions {
    LockOptions::default().ttl(Duration::from_secs(10))
}

fn https(server: &Leaseholdd) -> String {
    format!("https://{}", server.addr)
}

fn trusting(ca: &Path) -> TlsOptions {
    TlsOptions::default().ca_file(ca)
}

/// A server with TLS for clients: `--tls-cert` and `--tls-key`, and more flags.
fn tls_server(cert: &Issued, extra: &[&str]) -> Leaseholdd {
    let mut args = vec![
        "--tls-cert",
        cert.cert.to_str().expect("path"),
        "--tls-key",
        cert.key.to_str().expect("path"),
    ];
    args.extend_from_slice(extra);
    Leaseholdd::spawn_with(&args)
}

async fn connect(server: &Leaseholdd, tls: TlsOptions) -> leasehold::Result<Client> {
    Client::builder(&https(server))
        .holder("tls-test")
        .tls(tls)
        .connect()
        .await
}

/// Connects once the server leads (a first try can meet a server still starting).
async fn ready(server: &Leaseholdd, tls: TlsOptions) -> Client {
    let start = Instant::now();
    loop {
        if let Ok(c) = connect(server, tls.clone()).await {
            if c.status("").await.is_ok() {
                return c;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "server never answered over TLS: {}",
            server.process.output()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn every_protocol_speaks_tls_and_plaintext_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let server = tls_server(&ca.issue("server", &["127.0.0.1", "localhost"]), &[]);
    let a = ready(&server, trusting(&ca.cert)).await;

    // Framed calls (try_acquire, release) and gRPC waits, over TLS.
    let held = a.try_acquire("tls/job", opts()).await.unwrap();
    let first = held.token().unwrap();
    let b = connect(&server, trusting(&ca.cert)).await.unwrap();
    let waiter = tokio::spawn(async move {
        b.acquire("tls/job", opts().wait(Duration::from_secs(10)))
            .await
            .map(|l| l.fence())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap().unwrap();
    assert!(second > first, "the waiter got a higher fence over gRPC");

    // HTTP/JSON over TLS.
    let pem = std::fs::read(&ca.cert).unwrap();
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let health: serde_json::Value = http
        .get(format!("https://{}/health", server.addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["leader"], true);

    // Plaintext gets nothing: HTTP, and the client's framed and gRPC calls.
    assert_eq!(http_get(&server.addr, "/health"), None);
    let plain = Client::connect(&format!("http://{}", server.addr)).await;
    match plain {
        Err(_) => {}
        Ok(c) => assert!(c.try_acquire("tls/other", opts()).await.is_err()),
    }
}

#[tokio::test]
async fn a_server_the_client_cannot_verify_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let other = Ca::new(dir.path(), "other");
    let server = tls_server(&ca.issue("server", &["127.0.0.1"]), &[]);
    ready(&server, trusting(&ca.cert)).await;

    for tls in [trusting(&other.cert), TlsOptions::default()] {
        let refused = match connect(&server, tls.clone()).await {
            Err(e) => e,
            Ok(c) => c.try_acquire("k", opts()).await.map(|_| ()).unwrap_err(),
        };
        assert!(
            refused.to_string().contains("certificate"),
            "{tls:?}: {refused}"
        );
    }

    // A certificate for another name is refused too.
    let wrong_name = tls_server(&ca.issue("elsewhere", &["db.example"]), &[]);
    std::thread::sleep(Duration::from_millis(500));
    match connect(&wrong_name, trusting(&ca.cert)).await {
        Err(e) => assert!(e.to_string().contains("certificate"), "{e}"),
        Ok(c) => {
            let e = c.try_acquire("k", opts()).await.map(|_| ()).unwrap_err();
            assert!(e.to_string().contains("certificate"), "{e}");
        }
    }
}

/// A plain HTTPS client (not ours) that trusts `ca` and shows `me`.
fn https_client(ca: &Path, me: &Issued) -> reqwest::Client {
    let pem = |p: &Path| std::fs::read(p).unwrap();
    let mut identity = pem(&me.cert);
    identity.extend(pem(&me.key));
    reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem(ca)).unwrap())
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn client_certificates_when_the_server_asks() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let clients = Ca::new(dir.path(), "clients");
    let stranger = Ca::new(dir.path(), "stranger");
    let server = tls_server(
        &ca.issue("server", &["127.0.0.1"]),
        &["--tls-client-ca", clients.cert.to_str().unwrap()],
    );
    let worker = clients.issue("worker", &["worker"]);
    let with_cert = trusting(&ca.cert).identity_files(&worker.cert, &worker.key);
    let c = ready(&server, with_cert).await;
    c.try_acquire("mtls/job", opts()).await.unwrap();

    let forged = stranger.issue("forged", &["worker"]);
    for tls in [
        trusting(&ca.cert),
        trusting(&ca.cert).identity_files(&forged.cert, &forged.key),
    ] {
        let refused = match connect(&server, tls.clone()).await {
            Err(e) => Some(e),
            Ok(c) => c.try_acquire("mtls/other", opts()).await.err(),
        };
        assert!(refused.is_some(), "{tls:?} was let in");
    }

    // A change made with a client certificate names its subject in the
    // replicated audit trail, not `anonymous`.
    let http = https_client(&ca.cert, &worker);
    let base = format!("https://{}", server.addr);
    let enabled: serde_json::Value = http
        .post(format!("{base}/v1/auth/enable"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let root = enabled["token"].as_str().expect("root token");
    let auth: serde_json::Value = http
        .get(format!("{base}/v1/auth"))
        .bearer_auth(root)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        auth["audit"][0]["who"], r#"certificate "CN=worker""#,
        "{auth}"
    );
}

#[tokio::test]
async fn sighup_reloads_certificates_and_keeps_locks() {
    let dir = tempfile::tempdir().unwrap();
    let old = Ca::new(dir.path(), "old");
    let new = Ca::new(dir.path(), "new");
    let served = old.issue("server", &["127.0.0.1"]);
    let server = tls_server(&served, &[]);
    let a = ready(&server, trusting(&old.cert)).await;
    let held = a.try_acquire("reload/job", opts()).await.unwrap();

    // The renewed certificate, from another CA, replaces the files; SIGHUP.
    let renewed = new.issue("renewed", &["127.0.0.1"]);
    std::fs::copy(&renewed.cert, &served.cert).unwrap();
    std::fs::copy(&renewed.key, &served.key).unwrap();
    let pid = server.process.pid().expect("running") as i32;
    // SAFETY: sends a signal to the child this test started.
    unsafe { libc::kill(pid, libc::SIGHUP) };

    let b = ready(&server, trusting(&new.cert)).await;
    match b.try_acquire("reload/job", opts()).await {
        Err(Error::Held { fence, .. }) => assert_eq!(fence, held.fence()),
        other => panic!("the lock was not kept: {:?}", other.map(|l| l.fence())),
    }
    // The holder's open connection still works.
    assert!(held.is_live());
    held.release().await.unwrap();
    // New connections no longer accept the old CA.
    assert!(match connect(&server, trusting(&old.cert)).await {
        Err(_) => true,
        Ok(c) => c.try_acquire("reload/x", opts()).await.is_err(),
    });
}

/// A cluster as it would run in production: TLS with client certificates
/// for clients, mutual TLS between peers under their own CA. A client given
/// every `https://` endpoint finds the leader, and after the leader is
/// killed, follows the new one; the lock and its fence survive.
#[tokio::test]
async fn a_cluster_with_client_and_peer_tls_fails_over() {
    use leasehold_testkit::Cluster;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let clients = Ca::new(dir.path(), "clients");
    let peers = Ca::new(dir.path(), "peers");
    let served = ca.issue("server", &["127.0.0.1"]);
    let me = clients.issue("worker", &["worker"]);
    let node_certs = peers.node_certs(3);
    let (clients_ca, peers_ca) = (clients.cert.clone(), peers.cert.clone());
    let path = |p: &Path| p.display().to_string();
    let mut c = Cluster::spawn_each(3, move |id| {
        let node = &node_certs[id as usize - 1];
        vec![
            "--tls-cert".into(),
            path(&served.cert),
            "--tls-key".into(),
            path(&served.key),
            "--tls-client-ca".into(),
            path(&clients_ca),
            "--peer-tls-cert".into(),
            path(&node.cert),
            "--peer-tls-key".into(),
            path(&node.key),
            "--peer-tls-ca".into(),
            path(&peers_ca),
        ]
    });
    let addrs: Vec<String> = c.nodes.iter().map(|n| n.addr.clone()).collect();
    let url = format!("https://{}", addrs.join(","));
    let tls = trusting(&ca.cert).identity_files(&me.cert, &me.key);

    let http = https_client(&ca.cert, &me);
    let leader = || async {
        for (i, addr) in addrs.iter().enumerate() {
            let health: Option<serde_json::Value> =
                match http.get(format!("https://{addr}/health")).send().await {
                    Ok(r) => r.json().await.ok(),
                    Err(_) => None,
                };
            if health.is_some_and(|h| h["leader"] == true) {
                return Some(i);
            }
        }
        None
    };
    let start = Instant::now();
    let first = loop {
        if let Some(i) = leader().await {
            break i;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let client = Client::builder(&url)
        .holder("worker")
        .tls(tls.clone())
        .connect()
        .await
        .unwrap();
    let held = client
        .try_acquire(
            "tls/cluster",
            LockOptions::default().ttl(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let fence = held.fence();

    c.kill(first);
    let other = Client::builder(&url).tls(tls).connect().await.unwrap();
    let start = Instant::now();
    loop {
        match other.try_acquire("tls/cluster", opts()).await {
            Err(Error::Held { fence: f, .. }) => {
                assert_eq!(f, fence, "the new leader holds the same grant");
                break;
            }
            Err(e) if start.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("after failover: {:?}", other.map(|l| l.fence())),
        }
    }
    let next = leader().await.expect("a new leader");
    assert_ne!(next, first);
}
