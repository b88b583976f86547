//! The least a replicated commit costs on this machine, for comparison with
//! leaseholdd (`bench/floor.py` builds and runs it; no dependencies).
//!
//! A leader takes requests from its clients, appends every request waiting
//! as one batch to its log file (`pwrite` + `fdatasync`) while it sends the
//! batch to its followers, which append and flush it and answer with the
//! batch's last sequence number. A request is answered once the leader's own
//! flush covers it and, with followers, one follower's answer does too. A
//! leader with no followers is the single node. Threads and blocking I/O:
//! no framework, no encoding, no state machine.
//!
//!     floor follower PORT DIR
//!     floor leader PORT DIR [FOLLOWER_ADDR...]
//!     floor client ADDR CLIENTS SECONDS   (prints ops/s and latency, JSON)

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

fn read_frame(s: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

fn write_frame(s: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(4 + bytes.len());
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
    s.write_all(&out)
}

fn sequence(frame: &[u8]) -> io::Result<u64> {
    let head = frame
        .get(..8)
        .ok_or_else(|| io::Error::other("a frame shorter than its sequence number"))?;
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(head);
    Ok(u64::from_le_bytes(bytes))
}

/// A log file of 1 GiB, allocated up front as leaseholdd's segments are.
fn log_file(dir: &str) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(format!("{dir}/log"))?;
    file.set_len(1 << 30)?;
    file.sync_all()?;
    Ok(file)
}

/// A reader thread queues the leader's frames; this thread takes every frame
/// waiting, writes them, flushes once and answers with the last one's number.
fn follower(port: u16, dir: &str) -> io::Result<()> {
    let (stream, _) = TcpListener::bind(("127.0.0.1", port))?.accept()?;
    stream.set_nodelay(true)?;
    let mut reader = stream.try_clone()?;
    let mut writer = stream;
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        while let Ok(frame) = read_frame(&mut reader) {
            if tx.send(frame).is_err() {
                break;
            }
        }
    });
    let file = log_file(dir)?;
    let mut offset = 0u64;
    while let Ok(first) = rx.recv() {
        let mut bytes = first;
        let mut last = sequence(&bytes)?;
        while let Ok(frame) = rx.try_recv() {
            last = sequence(&frame)?;
            bytes.extend_from_slice(&frame);
        }
        file.write_all_at(&bytes, offset)?;
        offset += bytes.len() as u64;
        file.sync_data()?;
        write_frame(&mut writer, &last.to_le_bytes())?;
    }
    Ok(())
}

struct Log {
    waiting: VecDeque<Vec<u8>>,
    /// The clients waiting for their request to commit, by sequence number
    /// (in order: numbers are given out under the lock). Each is woken
    /// alone, so no client wakes for another's commit.
    waiters: VecDeque<(u64, mpsc::Sender<()>)>,
    /// The sequence number the next request gets.
    next: u64,
    /// The highest sequence number the leader's own flush covers.
    flushed: u64,
    /// The highest sequence number a follower has answered for.
    replicated: u64,
    has_followers: bool,
}

impl Log {
    /// Wakes every client whose request is now committed.
    fn wake_committed(&mut self) {
        let committed = if self.has_followers {
            self.flushed.min(self.replicated)
        } else {
            self.flushed
        };
        while self
            .waiters
            .front()
            .is_some_and(|(seq, _)| *seq <= committed)
        {
            if let Some((_, waiter)) = self.waiters.pop_front() {
                let _ = waiter.send(());
            }
        }
    }
}

/// The log, and a signal for the writer (requests waiting).
type Shared = Arc<(Mutex<Log>, Condvar)>;

fn lock(shared: &Shared) -> io::Result<std::sync::MutexGuard<'_, Log>> {
    shared
        .0
        .lock()
        .map_err(|_| io::Error::other("a thread panicked holding the log"))
}

fn leader(port: u16, dir: &str, followers: &[String]) -> io::Result<()> {
    let shared: Shared = Arc::new((
        Mutex::new(Log {
            waiting: VecDeque::new(),
            waiters: VecDeque::new(),
            next: 1,
            flushed: 0,
            replicated: 0,
            has_followers: !followers.is_empty(),
        }),
        Condvar::new(),
    ));
    let mut links = Vec::new();
    for addr in followers {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let mut answers = stream.try_clone()?;
        links.push(stream);
        let shared = shared.clone();
        std::thread::spawn(move || -> io::Result<()> {
            loop {
                let seq = sequence(&read_frame(&mut answers)?)?;
                let mut log = lock(&shared)?;
                if seq > log.replicated {
                    log.replicated = seq;
                    log.wake_committed();
                }
            }
        });
    }
    let file = log_file(dir)?;
    let writer = shared.clone();
    std::thread::spawn(move || -> io::Result<()> {
        let mut offset = 0u64;
        loop {
            let (batch, last) = {
                let mut log = lock(&writer)?;
                while log.waiting.is_empty() {
                    log = writer
                        .1
                        .wait(log)
                        .map_err(|_| io::Error::other("poisoned"))?;
                }
                // Every request waiting was numbered below `next`.
                let last = log.next - 1;
                (log.waiting.drain(..).collect::<Vec<_>>(), last)
            };
            // One frame a batch: the last request's number, then the requests.
            let mut frame = last.to_le_bytes().to_vec();
            for request in &batch {
                frame.extend_from_slice(request);
            }
            for link in &mut links {
                write_frame(link, &frame)?;
            }
            file.write_all_at(&frame, offset)?;
            offset += frame.len() as u64;
            file.sync_data()?;
            let mut log = lock(&writer)?;
            log.flushed = last;
            log.wake_committed();
        }
    });
    for client in TcpListener::bind(("127.0.0.1", port))?.incoming() {
        let mut client = client?;
        client.set_nodelay(true)?;
        let shared = shared.clone();
        std::thread::spawn(move || -> io::Result<()> {
            loop {
                let request = read_frame(&mut client)?;
                let (tx, committed) = mpsc::channel();
                let seq = {
                    let mut log = lock(&shared)?;
                    let seq = log.next;
                    log.next += 1;
                    log.waiting.push_back(request);
                    log.waiters.push_back((seq, tx));
                    shared.1.notify_one();
                    seq
                };
                committed
                    .recv()
                    .map_err(|_| io::Error::other("the log stopped"))?;
                write_frame(&mut client, &seq.to_le_bytes())?;
            }
        });
    }
    Ok(())
}

/// CLIENTS connections, each sending a 100-byte request and waiting for its
/// answer, for SECONDS.
fn client(addr: &str, clients: usize, seconds: u64) -> io::Result<()> {
    let stop = Instant::now() + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let addr = addr.to_string();
            std::thread::spawn(move || -> io::Result<Vec<u64>> {
                let mut stream = TcpStream::connect(&addr)?;
                stream.set_nodelay(true)?;
                let request = [7u8; 100];
                let mut latencies = Vec::new();
                while Instant::now() < stop {
                    let sent = Instant::now();
                    write_frame(&mut stream, &request)?;
                    read_frame(&mut stream)?;
                    latencies.push(sent.elapsed().as_micros() as u64);
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut all = Vec::new();
    for thread in threads {
        let latencies = thread
            .join()
            .map_err(|_| io::Error::other("a client thread panicked"))??;
        all.extend(latencies);
    }
    all.sort_unstable();
    if all.is_empty() {
        return Err(io::Error::other("no request was answered"));
    }
    println!(
        "{{\"ops_per_sec\": {:.0}, \"p50_us\": {}, \"p99_us\": {}}}",
        all.len() as f64 / seconds as f64,
        all[all.len() / 2],
        all[all.len() * 99 / 100]
    );
    Ok(())
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = || {
        io::Error::other("usage: floor follower PORT DIR | leader PORT DIR [FOLLOWER...] | client ADDR CLIENTS SECONDS")
    };
    let number = |i: usize| -> io::Result<u64> {
        args.get(i).and_then(|a| a.parse().ok()).ok_or_else(usage)
    };
    let text = |i: usize| args.get(i).map(String::as_str).ok_or_else(usage);
    match args.get(1).map(String::as_str) {
        Some("follower") => follower(number(2)? as u16, text(3)?),
        Some("leader") => leader(number(2)? as u16, text(3)?, args.get(4..).unwrap_or(&[])),
        Some("client") => client(text(2)?, number(3)? as usize, number(4)?),
        _ => Err(usage()),
    }
}
