//! Streams of appends between processes as length-prefixed frames on their
//! own TCP connection, beside gRPC on the same port.
//!
//! Carried by gRPC, every append and every answer crosses HTTP/2 and tonic
//! on both nodes (framing, flow control, a task between the connection and
//! the call); here they cross a socket and a length prefix. A leader opens
//! one connection per replication session:
//!
//! ```text
//! leader:   HELLO (8 bytes) | has cluster id: u8 | cluster id: u64 BE
//! follower: HELLO
//! leader:   length: u32 BE | request          (as many as it has)
//! follower: length: u32 BE | tag: u8 | body   (one per request, in order)
//! leader:   length 0                          (no more requests)
//! follower: closes, once every request is answered
//! ```
//!
//! The end of the requests is a frame, not a half-closed connection: a
//! proxy between the nodes may close both ways when one way closes, and the
//! answers still owed would be lost (openraft ends a stream after its one
//! request when it probes where a follower's log matches, at every change
//! of leader). The leader closes the connection when its session ends.
//!
//! A request and an answer are the same encoded messages the gRPC stream
//! carries ([`super::encode`]). An answer's tag is [`ANSWER`], or
//! [`REFUSED`] with a reason as text, after which the follower closes: a
//! leader of another cluster, a request that is not one, or a node that
//! needs peer certificates. HELLO's first byte (1) starts neither a TLS
//! handshake, an HTTP request nor the client frame protocol, so the port
//! tells them apart; a node of a build before this one answers it in HTTP,
//! and the leader then sends to it over gRPC ([`Refusals`]).
//!
//! Only between nodes without peer certificates: with them, appends go over
//! gRPC's mutual TLS. A peer that closes the connection before greeting
//! back (at its connection cap, stopping, or behind something that passes
//! only HTTP) gets that stream over gRPC; the next is asked for framed
//! again. A peer that takes the connection and says nothing within
//! `CONNECT_TIMEOUT` (a process still starting, or paused) is unreachable
//! for now, as it would be over gRPC: the stream fails and openraft opens
//! another. So is every node behind something that waits, silent, for an
//! HTTP/2 preface: between such nodes, give them peer certificates.
//!
//! Both ends send TCP keep-alives and limit how long sent data may go
//! unacknowledged ([`keep_alive`]): a follower whose leader's machine
//! vanished with the connection open closes it within about 40 s. A leader
//! that is only paused (SIGSTOP) keeps its connections open until it runs
//! again, where HTTP/2's pings would close them; it then finds it no longer
//! leads and closes them itself.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{SinkExt, StreamExt};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use super::append_stream::serve_stream;
use super::peer::PeerEndpoint;
use super::{AnswerStream, TransportError, CONNECT_TIMEOUT, MAX_MESSAGE};
use crate::raft::NodeId;

/// What a leader opens with, and what a follower that speaks this answers.
pub const HELLO: &[u8; 8] = b"\x01LHRAF1\n";
/// An answer's tag: the encoded answer follows.
const ANSWER: u8 = 0;
/// An answer's tag: the stream is refused, for the reason that follows.
const REFUSED: u8 = 1;
/// The frame after the last request: empty (a request never is).
const END: Bytes = Bytes::new();
/// After a peer answered HELLO in another protocol, appends to it go over
/// gRPC for this long before it is asked again (an older build, until it
/// is upgraded).
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(30);

/// Keep-alive probes start after this long without traffic, go every this
/// long, and after three unanswered the connection is closed: about 40 s.
const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// Data sent and not acknowledged for this long closes the connection
/// (keep-alive probes do not go while data waits to be acknowledged).
#[cfg(target_os = "linux")]
const UNACKNOWLEDGED_FOR: Duration = Duration::from_secs(40);

/// Turns on TCP keep-alive ([`KEEP_ALIVE`]), and on Linux a limit on how
/// long sent data may go unacknowledged ([`UNACKNOWLEDGED_FOR`]), on a
/// peer connection.
fn keep_alive(stream: &TcpStream) -> std::io::Result<()> {
    let probes = socket2::TcpKeepalive::new()
        .with_time(KEEP_ALIVE)
        .with_interval(KEEP_ALIVE)
        .with_retries(3);
    let socket = socket2::SockRef::from(stream);
    socket.set_tcp_keepalive(&probes)?;
    #[cfg(target_os = "linux")]
    socket.set_tcp_user_timeout(Some(UNACKNOWLEDGED_FOR))?;
    Ok(())
}

pub(in crate::raft) fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_MESSAGE)
        .new_codec()
}

fn refusal(why: &str) -> Bytes {
    let mut frame = Vec::with_capacity(1 + why.len());
    frame.push(REFUSED);
    frame.extend_from_slice(why.as_bytes());
    frame.into()
}

fn answer(answer: Result<Vec<u8>, String>) -> Bytes {
    match answer {
        Ok(mut bytes) => {
            bytes.insert(0, ANSWER);
            bytes.into()
        }
        Err(why) => refusal(&why),
    }
}

impl PeerEndpoint<'_> {
    /// Serves one framed connection from a leader (its first byte was
    /// HELLO's) until the leader closes it. `hello_within` bounds the wait
    /// for HELLO; a node that needs peer certificates refuses the stream
    /// (it came without TLS).
    pub async fn serve_framed(
        self,
        mut stream: TcpStream,
        need_certificates: bool,
        hello_within: Duration,
    ) {
        if keep_alive(&stream).is_err() {
            return;
        }
        let mut hello = [0u8; HELLO.len() + 9];
        match tokio::time::timeout(hello_within, stream.read_exact(&mut hello)).await {
            Ok(Ok(_)) if hello.starts_with(HELLO) => {}
            _ => return,
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&hello[HELLO.len() + 1..]);
        let cluster = (hello[HELLO.len()] == 1).then_some(u64::from_be_bytes(id));
        let refused = if need_certificates {
            Some(
                "raft calls need a connection with a peer certificate (mutual TLS under the peer CA)"
                    .to_string(),
            )
        } else {
            self.consensus
                .shared
                .context
                .cluster
                .check(cluster, true)
                .err()
        };
        if stream.write_all(HELLO).await.is_err() {
            return;
        }
        let (read, write) = stream.into_split();
        let mut answers = FramedWrite::new(write, codec());
        if let Some(why) = refused {
            let _ = answers.send(refusal(&why)).await;
            return;
        }
        let requests = FramedRead::new(read, codec())
            .take_while(|frame| std::future::ready(!matches!(frame, Ok(f) if f.is_empty())))
            .map(|frame| {
                frame
                    .map(|bytes| bytes.to_vec())
                    .map_err(|e| format!("reading an append: {e}"))
            });
        let served = serve_stream(&self.consensus.raft, requests, |_| Ok(()));
        let _ = served.map(|a| Ok(answer(a))).forward(&mut answers).await;
    }
}

/// Peers that answered HELLO in another protocol (an earlier build), and
/// when.
#[derive(Default)]
pub(in crate::raft) struct Refusals(Mutex<HashMap<(NodeId, String), Instant>>);

impl Refusals {
    /// Whether to ask `to` at `addr` for a framed stream.
    pub fn worth_asking(&self, to: NodeId, addr: &str) -> bool {
        let mut refused = self.0.lock();
        match refused.get(&(to, addr.to_string())) {
            Some(at) if at.elapsed() < ASK_AGAIN_AFTER => false,
            Some(_) => {
                refused.remove(&(to, addr.to_string()));
                true
            }
            None => true,
        }
    }

    /// Streams to `to` at `addr` go over gRPC for a while.
    pub fn note(&self, to: NodeId, addr: &str) {
        self.0.lock().insert((to, addr.to_string()), Instant::now());
    }
}

/// Connects to `addr` from `source` (any local address if `None`), with
/// `TCP_NODELAY` and keep-alive ([`KEEP_ALIVE`]).
pub(in crate::raft) async fn connect(
    addr: &str,
    source: Option<IpAddr>,
) -> std::io::Result<TcpStream> {
    let connecting = async {
        let Some(source) = source else {
            return TcpStream::connect(addr).await;
        };
        let target = tokio::net::lookup_host(addr)
            .await?
            .find(|a| a.is_ipv4() == source.is_ipv4())
            .ok_or_else(|| std::io::Error::other(format!("no address for {addr}")))?;
        let socket = match source {
            IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.bind(SocketAddr::new(source, 0))?;
        socket.connect(target).await
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| std::io::Error::other("connect timed out"))??;
    stream.set_nodelay(true)?;
    keep_alive(&stream)?;
    Ok(stream)
}

/// How opening a framed stream ended.
pub(in crate::raft) enum Opened {
    /// The answers, in the order of the requests.
    Open(AnswerStream),
    /// The peer answered the greeting in another protocol (an earlier
    /// build, in HTTP): the requests, untouched, for gRPC.
    NotSpoken(BoxStream<'static, Vec<u8>>),
    /// The peer closed the connection before greeting back, for the reason
    /// given: the requests, untouched, for gRPC. One that takes gRPC but
    /// closes framed connections (at its connection cap, or behind
    /// something that passes only HTTP) is served that way; one that is
    /// stopping fails there too.
    Closed(BoxStream<'static, Vec<u8>>, String),
    /// No connection, or no greeting within `CONNECT_TIMEOUT`: a peer that
    /// is down, cut off, still starting or paused, which gRPC would wait on
    /// all the same. Why, for the stream's error.
    Unreachable(String),
}

/// Opens a framed stream of `requests` to node `to` at `addr`.
pub(in crate::raft) async fn open(
    to: NodeId,
    addr: &str,
    source: Option<IpAddr>,
    cluster: Option<u64>,
    requests: BoxStream<'static, Vec<u8>>,
    refusals: &Refusals,
) -> Opened {
    let mut stream = match connect(addr, source).await {
        Ok(stream) => stream,
        Err(e) => return Opened::Unreachable(e.to_string()),
    };
    let mut hello = HELLO.to_vec();
    hello.push(u8::from(cluster.is_some()));
    hello.extend_from_slice(&cluster.unwrap_or(0).to_be_bytes());
    let mut answered = [0u8; HELLO.len()];
    let greeted = async {
        stream.write_all(&hello).await?;
        stream.read_exact(&mut answered).await
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, greeted).await {
        Ok(Ok(_)) if &answered == HELLO => {}
        // Answered otherwise: an earlier build, in HTTP.
        Ok(Ok(_)) => {
            refusals.note(to, addr);
            return Opened::NotSpoken(requests);
        }
        // Closed or reset: stopping, at its connection cap, or cut off.
        Ok(Err(e)) => {
            let why = format!("closed before answering the stream's greeting: {e}");
            return Opened::Closed(requests, why);
        }
        // Taken by its kernel, not yet by the process (listening before it
        // has opened its data), or paused.
        Err(_) => {
            return Opened::Unreachable(format!(
                "no answer to the stream's greeting within {CONNECT_TIMEOUT:?}"
            ));
        }
    }
    let (read, write) = stream.into_split();
    let forwarding = tokio::spawn(async move {
        let mut sink = FramedWrite::new(write, codec());
        let mut sending = requests
            .map(Bytes::from)
            .chain(futures::stream::iter([END]))
            .map(Ok);
        if sink.send_all(&mut sending).await.is_ok() {
            // Kept open (dropped, the write half would close one way)
            // until the answers are dropped, which stops this task.
            std::future::pending::<()>().await;
        }
    });
    let guard = AbortOnDrop(forwarding.abort_handle());
    let answers = FramedRead::new(read, codec()).map(move |frame| {
        // Held by the stream, so the forwarding stops when it is dropped.
        let _forwarding = &guard;
        let frame = frame.map_err(|e| TransportError::Failed(format!("reading an answer: {e}")))?;
        match frame.split_first() {
            Some((&ANSWER, answer)) => Ok(answer.to_vec()),
            Some((&REFUSED, why)) => Err(TransportError::Failed(
                String::from_utf8_lossy(why).into_owned(),
            )),
            _ => Err(TransportError::Failed(
                "an answer of an unknown kind".into(),
            )),
        }
    });
    Opened::Open(answers.boxed())
}

/// Stops a task when dropped.
pub(in crate::raft) struct AbortOnDrop(pub tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use openraft::errors::Fatal;
    use openraft::raft::{StreamAppendError, StreamAppendResult};
    use tokio::net::TcpListener;

    use super::*;
    use crate::raft::transport::decode;
    use crate::raft::{leading_single_node, stale_append, Consensus, TypeConfig};

    const WITHIN: Duration = Duration::from_secs(5);

    /// Serves framed connections to `consensus` on a local port.
    async fn serving(consensus: Consensus, need_certificates: bool) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let consensus = consensus.clone();
                tokio::spawn(async move {
                    consensus
                        .peers()
                        .serve_framed(stream, need_certificates, WITHIN)
                        .await
                });
            }
        });
        addr
    }

    async fn open_to(addr: &str, cluster: Option<u64>, requests: Vec<Vec<u8>>) -> Opened {
        let requests = futures::stream::iter(requests)
            .chain(futures::stream::pending())
            .boxed();
        tokio::time::timeout(
            WITHIN,
            open(2, addr, None, cluster, requests, &Refusals::default()),
        )
        .await
        .expect("opened within 5 s")
    }

    #[tokio::test]
    async fn a_framed_stream_carries_an_append_to_the_raft_and_its_answer_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let consensus = leading_single_node(dir.path()).await;
        let addr = serving(consensus.clone(), false).await;
        let cluster = consensus.shared.context.cluster.get();
        let Opened::Open(mut answers) = open_to(&addr, cluster, vec![stale_append()]).await else {
            panic!("a node of this build speaks framed streams");
        };
        let answer = tokio::time::timeout(WITHIN, answers.next())
            .await
            .expect("an answer within 5 s")
            .expect("an answer")
            .expect("an answer, not a refusal");
        let answer: Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>> =
            decode(&answer).expect("an encoded answer");
        assert!(
            matches!(answer, Ok(Err(StreamAppendError::HigherVote(_)))),
            "the node's Raft refused the stale leader: {answer:?}"
        );
        consensus.shutdown().await;
    }

    #[tokio::test]
    async fn a_stream_of_one_request_is_answered_through_a_proxy_that_closes_both_ways_at_once() {
        // openraft's probe at a change of leader is one request, then the
        // end of the stream. A proxy that closes both ways when one way
        // closes (as the test kit's does) must not swallow its answer.
        let dir = tempfile::tempdir().expect("tempdir");
        let consensus = leading_single_node(dir.path()).await;
        let addr = serving(consensus.clone(), false).await;
        let proxy = leasehold_testkit::FaultProxy::start(&addr);
        let cluster = consensus.shared.context.cluster.get();
        let requests = futures::stream::iter(vec![stale_append()]).boxed();
        let refusals = Refusals::default();
        let opened = open(2, &proxy.addr, None, cluster, requests, &refusals);
        let Opened::Open(answers) = tokio::time::timeout(WITHIN, opened)
            .await
            .expect("opened within 5 s")
        else {
            panic!("a node of this build speaks framed streams");
        };
        let answers: Vec<_> = tokio::time::timeout(WITHIN, answers.collect::<Vec<_>>())
            .await
            .expect("answered, and the stream ended, within 5 s");
        assert_eq!(answers.len(), 1, "one answer, then the end: {answers:?}");
        let answer = answers[0].as_ref().expect("an answer, not an error");
        let answer: Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>> =
            decode(answer).expect("an encoded answer");
        assert!(matches!(answer, Ok(Err(StreamAppendError::HigherVote(_)))));
        consensus.shutdown().await;
    }

    #[tokio::test]
    async fn a_leader_of_another_cluster_or_without_a_certificate_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let consensus = leading_single_node(dir.path()).await;
        for (need_certificates, cluster, reason) in [
            (false, Some(7), "cluster"),
            (true, None, "peer certificate"),
        ] {
            let addr = serving(consensus.clone(), need_certificates).await;
            let Opened::Open(mut answers) = open_to(&addr, cluster, vec![stale_append()]).await
            else {
                panic!("a node of this build speaks framed streams");
            };
            let refused = tokio::time::timeout(WITHIN, answers.next())
                .await
                .expect("an answer within 5 s")
                .expect("an answer");
            match refused {
                Err(TransportError::Failed(why)) => {
                    assert!(why.contains(reason), "{why:?} names {reason:?}")
                }
                other => panic!("refused, not {other:?}"),
            }
            // Refused, the stream ends: nothing was handed to the Raft.
            let ended = tokio::time::timeout(WITHIN, answers.next()).await;
            assert!(matches!(ended, Ok(None)), "the stream ends after a refusal");
        }
        consensus.shutdown().await;
    }

    #[tokio::test]
    async fn a_peer_of_an_older_build_gets_the_requests_back_and_is_not_asked_again_soon() {
        // What a node before framed streams answers: HTTP, then it closes.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut hello = [0u8; HELLO.len()];
                let _ = stream.read_exact(&mut hello).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let refusals = Refusals::default();
        let requests = futures::stream::iter(vec![b"one".to_vec(), b"two".to_vec()]).boxed();
        let opened = open(2, &addr, None, None, requests, &refusals).await;
        let Opened::NotSpoken(requests) = opened else {
            panic!("an older build does not speak framed streams");
        };
        let left: Vec<Vec<u8>> = requests.collect().await;
        assert_eq!(left, vec![b"one".to_vec(), b"two".to_vec()]);
        assert!(!refusals.worth_asking(2, &addr));
        assert!(
            refusals.worth_asking(3, &addr),
            "other peers are still asked"
        );
    }

    #[tokio::test]
    async fn a_peer_that_hangs_up_on_the_greeting_gets_the_requests_back_and_is_asked_again() {
        // A node stopping closes its connections: that says nothing of its
        // build, so the next stream is framed again.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        });
        let refusals = Refusals::default();
        let requests = futures::stream::iter(vec![b"one".to_vec()]).boxed();
        let Opened::Closed(requests, why) = open(2, &addr, None, None, requests, &refusals).await
        else {
            panic!("closed before greeting back");
        };
        assert!(why.contains("greeting"), "{why}");
        assert_eq!(requests.collect::<Vec<_>>().await, vec![b"one".to_vec()]);
        assert!(refusals.worth_asking(2, &addr));
    }

    #[tokio::test]
    async fn a_peer_nobody_listens_for_is_unreachable() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let requests = futures::stream::pending().boxed();
        let opened = open(2, &addr, None, None, requests, &Refusals::default()).await;
        assert!(matches!(opened, Opened::Unreachable(..)));
    }
}
