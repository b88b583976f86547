//! A TCP proxy that injects faults between a client and a server: a reply
//! lost on its way back, replies slowed, requests swallowed (a link that
//! goes quiet without closing), or the connections from one source address
//! refused (with a node per 127.0.0.N, that is one node cut off from
//! another).
//!
//! Each accepted connection gets its own connection to the target and two
//! threads pumping bytes, one each way. Faults act on real sockets, so the
//! client under test sees exactly what a real network fault shows it: a
//! connection reset with a request sent and no answer.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Default)]
struct Faults {
    /// Replies (server-to-client reads) to swallow, each closing its connection.
    drop_replies: AtomicUsize,
    /// Set when the proxy is dropped.
    stopped: AtomicBool,
    /// Every socket the proxy holds, by the client's source address, to
    /// close them on a cut.
    sockets: Mutex<Vec<(IpAddr, TcpStream)>>,
    /// Source addresses whose connections are refused.
    blocked: Mutex<HashSet<IpAddr>>,
    /// Replies swallowed so far.
    dropped: AtomicUsize,
    /// Milliseconds each reply is held back before it is passed on.
    reply_delay_ms: AtomicU64,
    /// Requests (client-to-server bytes) are swallowed, connections kept open.
    swallow_requests: AtomicBool,
}

/// A fault proxy on a free loopback port in front of `target`; stops when dropped.
pub struct FaultProxy {
    /// `127.0.0.1:PORT`: point the client here.
    pub addr: String,
    faults: Arc<Faults>,
}

impl FaultProxy {
    /// Starts forwarding connections to `target` (`host:port`).
    pub fn start(target: &str) -> FaultProxy {
        Self::start_on("127.0.0.1:0", target)
    }

    /// Listens on `listen` (`ip:port`, port 0 for any) and forwards to `target`.
    pub fn start_on(listen: &str, target: &str) -> FaultProxy {
        let listener = TcpListener::bind(listen).expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let faults = Arc::new(Faults::default());
        let (f, target) = (faults.clone(), target.to_string());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if f.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let source = client.peer_addr().map(|a| a.ip()).ok();
                let blocked = source.is_some_and(|ip| f.blocked.lock().contains(&ip));
                if blocked {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let source = source.unwrap_or(IpAddr::from([0, 0, 0, 0]));
                link(&f, source, client, server);
            }
        });
        FaultProxy { addr, faults }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next reply from the server is swallowed and its connection closed:
    /// the request took effect, the client never hears of it.
    pub fn drop_next_reply(&self) {
        self.faults.drop_replies.fetch_add(1, Ordering::SeqCst);
    }

    /// How many replies were swallowed so far.
    pub fn dropped(&self) -> usize {
        self.faults.dropped.load(Ordering::SeqCst)
    }

    /// Holds back every reply for `delay` before passing it on (in order):
    /// the server acts at once, the client hears of it late.
    pub fn delay_replies(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.faults.reply_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Swallows every request from now on (or passes them again), keeping
    /// the connections open: the link goes quiet, as a partition looks to
    /// the client; replies already on their way still arrive.
    pub fn swallow_requests(&self, swallow: bool) {
        self.faults
            .swallow_requests
            .store(swallow, Ordering::SeqCst);
    }

    /// Closes the connections from `source` and refuses new ones from it.
    pub fn block_from(&self, source: IpAddr) {
        self.faults.blocked.lock().insert(source);
        let mut sockets = self.faults.sockets.lock();
        sockets.retain(|(ip, s)| {
            if *ip == source {
                let _ = s.shutdown(Shutdown::Both);
                false
            } else {
                true
            }
        });
    }
}

impl FaultProxy {
    /// Lets every source connect again (connections already cut stay cut).
    pub fn allow_all(&self) {
        self.faults.blocked.lock().clear();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.faults.stopped.store(true, Ordering::SeqCst);
        close_all(&self.faults);
        // Wakes the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(&self.addr);
    }
}

fn close_all(faults: &Faults) {
    let sockets = std::mem::take(&mut *faults.sockets.lock());
    for (_, s) in sockets {
        let _ = s.shutdown(Shutdown::Both);
    }
}

fn link(faults: &Arc<Faults>, source: IpAddr, client: TcpStream, server: TcpStream) {
    let clones = [client.try_clone(), server.try_clone()];
    let [Ok(client2), Ok(server2)] = clones else {
        return;
    };
    {
        let mut sockets = faults.sockets.lock();
        for s in [&client, &server] {
            if let Ok(s) = s.try_clone() {
                sockets.push((source, s));
            }
        }
    }
    let (f1, f2) = (faults.clone(), faults.clone());
    std::thread::spawn(move || pump(client, server, f1, Direction::Requests));
    std::thread::spawn(move || pump(server2, client2, f2, Direction::Replies));
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    /// Client to server.
    Requests,
    /// Server to client.
    Replies,
}

/// Copies `from` to `to` until either closes, with the faults of its direction.
fn pump(mut from: TcpStream, mut to: TcpStream, f: Arc<Faults>, direction: Direction) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => break,
        };
        if direction == Direction::Requests && f.swallow_requests.load(Ordering::SeqCst) {
            continue;
        }
        if direction == Direction::Replies {
            let take = f
                .drop_replies
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if take.is_ok() {
                f.dropped.fetch_add(1, Ordering::SeqCst);
                break;
            }
            let delay = f.reply_delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                std::thread::sleep(Duration::from_millis(delay));
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
