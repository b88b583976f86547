//! Idle, slow and too many connections: real floods of sockets against a
//! real `leaseholdd`, and `/health` keeps answering.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use leasehold_testkit::{http_get, wait_until, Leaseholdd};

fn set_soft_fd_limit(soft: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads and writes only the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        let old = limit.rlim_cur;
        limit.rlim_cur = soft.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        old
    }
}

/// Whether the server closed `s` within `limit` (EOF or reset on read).
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

fn healthy(server: &Leaseholdd) -> bool {
    http_get(&server.addr, "/health").is_some()
}

/// A server started with the common default soft limit of 1,024 open files
/// (here 256, to need fewer sockets) raises it to the hard limit, so 1,100
/// idle sockets do not stop it accepting: `/health` answers throughout.
#[test]
fn a_flood_of_idle_sockets_does_not_exhaust_file_descriptors() {
    let old = set_soft_fd_limit(256);
    let server = Leaseholdd::start();
    set_soft_fd_limit(old.max(4_096));
    let mut idle = Vec::new();
    for _ in 0..1_100 {
        idle.push(TcpStream::connect(&server.addr).expect("connect"));
    }
    // Each is accepted and waiting for its first byte.
    std::thread::sleep(Duration::from_millis(300));
    assert!(healthy(&server), "/health stopped answering");
    assert!(!server.process.output().contains("Too many open files"));
    drop(idle);
}

/// Connections that send nothing, half a request (slow-loris), or nothing
/// after a finished call are all closed by the server; `/health` answers
/// all along.
#[test]
fn idle_and_slow_connections_are_closed() {
    let server = Leaseholdd::start_with(&["--header-timeout", "1s", "--idle-timeout", "2s"]);
    let mut silent: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    let mut partial: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = TcpStream::connect(&server.addr).unwrap();
            s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
            s
        })
        .collect();
    let mut framed = TcpStream::connect(&server.addr).unwrap();
    framed.write_all(leasehold_proto::frame::PREAMBLE).unwrap();
    // HTTP/2 that sent only its preface, and HTTP/2 that opened a stream
    // and sent part of its headers: no call in flight, so both go at the
    // idle timeout, not at the next ping 20-30 s later.
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut h2_preface = TcpStream::connect(&server.addr).unwrap();
    h2_preface.write_all(PREFACE).unwrap();
    let mut h2_partial = TcpStream::connect(&server.addr).unwrap();
    h2_partial.write_all(PREFACE).unwrap();
    // An empty SETTINGS frame, then a HEADERS frame on stream 1 without
    // END_HEADERS, whose CONTINUATION never comes.
    h2_partial.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    h2_partial
        .write_all(&[0, 0, 1, 1, 0, 0, 0, 0, 1, 0x82])
        .unwrap();
    let mut kept = TcpStream::connect(&server.addr).unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    kept.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(healthy(&server));

    let started = Instant::now();
    for s in silent.iter_mut().chain(partial.iter_mut()) {
        assert!(
            closed_within(s, Duration::from_secs(5)),
            "a silent or slow connection stayed open {:?}",
            started.elapsed()
        );
    }
    assert!(
        closed_within(&mut framed, Duration::from_secs(5)),
        "an idle framed connection stayed open"
    );
    assert!(
        closed_within(&mut h2_preface, Duration::from_secs(5)),
        "an HTTP/2 connection that sent only its preface stayed open"
    );
    assert!(
        closed_within(&mut h2_partial, Duration::from_secs(5)),
        "an HTTP/2 connection with a partial request stayed open"
    );
    assert!(
        closed_within(&mut kept, Duration::from_secs(5)),
        "an idle keep-alive connection stayed open"
    );
    assert!(healthy(&server));
}

/// Past `--max-connections` new connections are closed at once, with one
/// log line; once idle ones time out, the server serves again.
#[test]
fn connections_past_the_cap_are_closed_at_once() {
    let server = Leaseholdd::start_with(&["--max-connections", "20", "--header-timeout", "2s"]);
    let mut held: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..20 {
        let mut extra = TcpStream::connect(&server.addr).unwrap();
        assert!(
            closed_within(&mut extra, Duration::from_millis(1_000)),
            "a connection over the cap was kept"
        );
    }
    let log = server.process.output();
    assert_eq!(log.matches("connection cap reached").count(), 1, "{log}");
    // The held ones time out, and there is room again.
    for s in held.iter_mut() {
        assert!(closed_within(s, Duration::from_secs(5)));
    }
    wait_until(Duration::from_secs(5), "/health after the flood", || {
        healthy(&server)
    });
}
