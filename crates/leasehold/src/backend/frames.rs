//! A client connection in leaseholdd's framed protocol
//! ([`leasehold_proto::frame`]): one TCP connection, shared by every task of
//! a client, carrying the calls that never wait.
//!
//! A driver task owns the socket. Calls queue to it; it writes every queued
//! request in one write and hands each reply to its caller by id. When the
//! connection breaks, the calls on it fail as unreachable and the next call
//! connects again. A grant whose caller has gone (its future dropped, say by
//! a timeout, while the server was slow) is released by the driver: nobody
//! else would ever release it, and the session lease it hangs off lives on.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use leasehold_proto::frame::{Frame, FrameCodec, Op, PREAMBLE, REPLY_ERROR, REPLY_OK};
use leasehold_proto::v1 as pb;
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;
use tokio_util::codec::{Encoder, FramedRead};

use crate::tls::ClientTls;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Why an endpoint could not be used.
pub(super) enum RouteError {
    /// It could not be reached: try the next.
    Unreachable(String),
    /// It refused the token: every node would.
    Refused(String),
}

/// A failed call.
#[derive(Debug, Clone)]
pub(super) enum CallError {
    /// The request never left: no connection could be made. Safe to send
    /// anywhere.
    Unsent(String),
    /// No answer from the server: the request may or may not have acted.
    Transport(String),
    /// The server's refusal.
    Server(pb::ErrorReply),
}

type Reply = Result<Frame, String>;

struct Call {
    op: Op,
    body: Vec<u8>,
    reply: oneshot::Sender<Reply>,
    /// For an acquire: what to do if the grant finds no caller.
    unheard: Option<Unheard>,
}

/// An acquire's key, and a guard the driver keeps until a grant nobody
/// received has been released (so the caller's side cannot ask for the key
/// again in between).
struct Unheard {
    key: String,
    _guard: Box<dyn Any + Send>,
}

/// A request sent and not yet answered.
struct Pending {
    /// `None` for the driver's own releases of unheard grants.
    caller: Option<oneshot::Sender<Reply>>,
    unheard: Option<Unheard>,
}

/// Cheap to clone; clones share the connection.
#[derive(Clone)]
pub(super) struct Frames {
    inner: Arc<Inner>,
}

struct Inner {
    /// `host:port`.
    addr: String,
    /// TLS, for an `https://` endpoint.
    tls: Option<ClientTls>,
    /// The access token, sent first on each connection.
    token: Option<Arc<str>>,
    /// The live connection's queue; `None` or closed when it is gone.
    queue: tokio::sync::Mutex<Option<mpsc::UnboundedSender<Call>>>,
}

impl Frames {
    /// Connects to `addr` (`host:port`) now, so a wrong address fails here.
    pub(super) async fn connect(
        addr: String,
        tls: Option<ClientTls>,
        token: Option<Arc<str>>,
    ) -> Result<Frames, RouteError> {
        let queue = open(&addr, tls.as_ref(), token.as_deref()).await?;
        Ok(Frames {
            inner: Arc::new(Inner {
                addr,
                tls,
                token,
                queue: tokio::sync::Mutex::new(Some(queue)),
            }),
        })
    }

    /// Sends `request` as `op` and decodes the reply.
    pub(super) async fn call<R: Message + Default>(
        &self,
        op: Op,
        request: &impl Message,
    ) -> Result<R, CallError> {
        self.send(op, request, None).await
    }

    /// Tries to acquire at once. A grant that arrives after the caller has
    /// gone is released, and `guard` is kept until that release is answered.
    pub(super) async fn acquire(
        &self,
        request: &pb::AcquireRequest,
        guard: impl Any + Send,
    ) -> Result<pb::AcquireResponse, CallError> {
        let unheard = Unheard {
            key: request.key.clone(),
            _guard: Box::new(guard),
        };
        self.send(Op::Acquire, request, Some(unheard)).await
    }

    async fn send<R: Message + Default>(
        &self,
        op: Op,
        request: &impl Message,
        unheard: Option<Unheard>,
    ) -> Result<R, CallError> {
        let (reply, answer) = oneshot::channel();
        let mut call = Call {
            op,
            body: request.encode_to_vec(),
            reply,
            unheard,
        };
        // Once with the current connection; if it turned out to be gone, once
        // more with a new one (the request was never sent on the old one).
        for _ in 0..2 {
            let queue = self.queue().await?;
            match queue.send(call) {
                Ok(()) => return receive(answer).await,
                Err(mpsc::error::SendError(back)) => call = back,
            }
        }
        Err(CallError::Unsent(format!(
            "leaseholdd at {} closed the connection",
            self.inner.addr
        )))
    }

    async fn queue(&self) -> Result<mpsc::UnboundedSender<Call>, CallError> {
        let mut queue = self.inner.queue.lock().await;
        if let Some(q) = queue.as_ref().filter(|q| !q.is_closed()) {
            return Ok(q.clone());
        }
        let q = open(
            &self.inner.addr,
            self.inner.tls.as_ref(),
            self.inner.token.as_deref(),
        )
        .await
        .map_err(|e| match e {
            RouteError::Unreachable(e) => CallError::Unsent(e),
            RouteError::Refused(e) => CallError::Server(pb::ErrorReply {
                code: "unauthenticated".into(),
                message: e,
                details: Default::default(),
            }),
        })?;
        *queue = Some(q.clone());
        Ok(q)
    }
}

async fn receive<R: Message + Default>(answer: oneshot::Receiver<Reply>) -> Result<R, CallError> {
    let frame = answer
        .await
        .map_err(|_| CallError::Transport("the connection to leaseholdd closed".into()))?
        .map_err(CallError::Transport)?;
    let unexpected =
        |e: prost::DecodeError| CallError::Transport(format!("bad reply from leaseholdd: {e}"));
    match frame.tag {
        REPLY_OK => R::decode(frame.body).map_err(unexpected),
        REPLY_ERROR => Err(CallError::Server(
            pb::ErrorReply::decode(frame.body).map_err(unexpected)?,
        )),
        tag => Err(CallError::Transport(format!(
            "bad reply from leaseholdd: tag {tag}"
        ))),
    }
}

/// Opens a connection to `addr`; with a token, authenticates it before
/// anything else is sent.
async fn open(
    addr: &str,
    tls: Option<&ClientTls>,
    token: Option<&str>,
) -> Result<mpsc::UnboundedSender<Call>, RouteError> {
    let queue = connect(addr, tls).await.map_err(RouteError::Unreachable)?;
    let Some(token) = token else {
        return Ok(queue);
    };
    let (reply, answer) = oneshot::channel();
    let call = Call {
        op: Op::Authenticate,
        body: pb::AuthenticateRequest {
            token: token.to_string(),
        }
        .encode_to_vec(),
        reply,
        unheard: None,
    };
    let closed = || RouteError::Unreachable(format!("leaseholdd at {addr} closed the connection"));
    queue.send(call).map_err(|_| closed())?;
    match receive::<pb::AuthenticateResponse>(answer).await {
        Ok(_) => Ok(queue),
        Err(CallError::Server(e)) => Err(RouteError::Refused(format!(
            "leaseholdd at {addr} refused the token: {}",
            e.message
        ))),
        Err(CallError::Unsent(e) | CallError::Transport(e)) => Err(RouteError::Unreachable(e)),
    }
}

async fn connect(
    addr: &str,
    tls: Option<&ClientTls>,
) -> Result<mpsc::UnboundedSender<Call>, String> {
    let (queue, calls) = mpsc::unbounded_channel();
    let connect = async {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        match tls {
            None => {
                let mut stream = stream;
                stream.write_all(PREAMBLE).await?;
                let (read, write) = stream.into_split();
                tokio::spawn(drive(read, write, calls, addr.to_string()));
            }
            Some(tls) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
                    .map_err(|e| std::io::Error::other(format!("{host:?}: {e}")))?
                    .to_owned();
                let mut stream = TlsConnector::from(tls.rustls.clone())
                    .connect(name, stream)
                    .await?;
                stream.write_all(PREAMBLE).await?;
                let (read, write) = tokio::io::split(stream);
                tokio::spawn(drive(read, write, calls, addr.to_string()));
            }
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| format!("connect to leaseholdd at {addr}: timed out"))?
        .map_err(|e| {
            let e = e.to_string();
            match crate::tls::advice(&e) {
                Some(advice) => format!("connect to leaseholdd at {addr}: {advice} ({e})"),
                None => format!("connect to leaseholdd at {addr}: {e}"),
            }
        })?;
    Ok(queue)
}

/// Owns the socket until it breaks or every handle to it is gone.
async fn drive<R, W>(read: R, mut write: W, mut calls: mpsc::UnboundedReceiver<Call>, addr: String)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut replies = FramedRead::new(read, FrameCodec::replies());
    let mut requests = FrameCodec::requests();
    let mut waiting: HashMap<u64, Pending> = HashMap::new();
    let mut next_id = 0u64;
    let mut out = BytesMut::new();
    let failure = loop {
        tokio::select! {
            call = calls.recv() => {
                let Some(mut call) = call else { break None };
                loop {
                    next_id += 1;
                    let frame = Frame { id: next_id, tag: call.op as u8, body: call.body.into() };
                    match requests.encode(frame, &mut out) {
                        Ok(()) => {
                            let pending = Pending { caller: Some(call.reply), unheard: call.unheard };
                            waiting.insert(next_id, pending);
                        }
                        Err(e) => {
                            let _ = call.reply.send(Err(format!("request not sent: {e}")));
                        }
                    }
                    match calls.try_recv() {
                        Ok(next) => call = next,
                        Err(_) => break,
                    }
                }
                if let Err(e) = write.write_all(&out).await {
                    break Some(write_failed(&mut replies, &addr, e).await);
                }
                out.clear();
            }
            reply = replies.next() => match reply {
                // Id 0 is for the connection, not a call: the server refused
                // it before it read any call (plaintext on its TLS port).
                Some(Ok(frame)) if frame.id == 0 && frame.tag == REPLY_ERROR => {
                    break Some(Failure::Refused(frame.body));
                }
                // An alert from the server: it refused the TLS handshake
                // (a client certificate it wants or does not trust), so it
                // read no call.
                Some(Err(e)) if e.to_string().contains("alert") => {
                    break Some(refused_handshake(&addr, &e.to_string()));
                }
                Some(Ok(frame)) => {
                    let Some(Pending { caller: Some(caller), unheard }) = waiting.remove(&frame.id)
                    else {
                        continue;
                    };
                    let Err(Ok(reply)) = caller.send(Ok(frame)) else { continue };
                    let (Some(unheard), REPLY_OK) = (unheard, reply.tag) else { continue };
                    let Ok(granted) = pb::AcquireResponse::decode(reply.body) else { continue };
                    let release = pb::ReleaseRequest {
                        key: unheard.key.clone(),
                        fence: granted.fence,
                        request_id: rand::random::<u64>() | 1,
                    };
                    next_id += 1;
                    let frame = Frame::new(next_id, Op::Release as u8, &release);
                    if requests.encode(frame, &mut out).is_ok() {
                        // Its answer drops the guard.
                        waiting.insert(next_id, Pending { caller: None, unheard: Some(unheard) });
                        if let Err(e) = write.write_all(&out).await {
                            break Some(write_failed(&mut replies, &addr, e).await);
                        }
                    }
                    out.clear();
                }
                Some(Err(e)) => break Some(Failure::Lost(e.to_string())),
                None => break Some(Failure::Lost("closed by the server".to_string())),
            },
        }
    };
    match failure {
        // Nothing was read, so nothing was done: every caller gets the
        // refusal as its own answer.
        Some(Failure::Refused(body)) => {
            let refuse = |reply: oneshot::Sender<Reply>, id| {
                let _ = reply.send(Ok(Frame {
                    id,
                    tag: REPLY_ERROR,
                    body: body.clone(),
                }));
            };
            for (id, pending) in waiting {
                if let Some(caller) = pending.caller {
                    refuse(caller, id);
                }
            }
            // A call queued while the refusal was on its way gets it too.
            let late = async {
                while let Some(call) = calls.recv().await {
                    refuse(call.reply, 0);
                }
            };
            let _ = tokio::time::timeout(Duration::from_millis(500), late).await;
        }
        // Calls already sent may or may not have taken effect; their
        // callers retry with the same request ids where that is safe.
        lost => {
            let reason = match lost {
                Some(Failure::Lost(why)) => why,
                _ => "closed".to_string(),
            };
            let reason = format!("connection to leaseholdd at {addr}: {reason}");
            for caller in waiting.into_values().filter_map(|p| p.caller) {
                let _ = caller.send(Err(reason.clone()));
            }
        }
    }
}

/// A TLS alert from the server: it refused the handshake, so it read no
/// call. Every node would refuse the same certificate, so this is
/// `unauthenticated`, not a failure to retry elsewhere.
fn refused_handshake(addr: &str, alert: &str) -> Failure {
    let advice = crate::tls::advice(alert).unwrap_or("the server refused the TLS handshake");
    let refusal = pb::ErrorReply {
        code: "unauthenticated".into(),
        message: format!("leaseholdd at {addr}: {advice} ({alert})"),
        details: Default::default(),
    };
    Failure::Refused(refusal.encode_to_vec().into())
}

/// Why a TLS connection to `addr` fails, if it does for a TLS reason: a
/// fresh handshake, then a read of what the server says (under TLS 1.3 its
/// refusal of a client certificate comes after the client's handshake is
/// done). For a call over another stack (gRPC) that reported only "transport
/// error": the advice, or `None` if the handshake and the read went well.
pub(crate) async fn diagnose_tls(addr: &str, tls: &ClientTls) -> Option<&'static str> {
    use tokio::io::AsyncReadExt;
    let probe = async {
        let stream = TcpStream::connect(addr).await.ok()?;
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
            .ok()?
            .to_owned();
        let mut stream = match TlsConnector::from(tls.rustls.clone())
            .connect(name, stream)
            .await
        {
            Ok(s) => s,
            Err(e) => return crate::tls::advice(&e.to_string()),
        };
        if let Err(e) = stream.write_all(PREAMBLE).await {
            return crate::tls::advice(&e.to_string());
        }
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(500), stream.read(&mut byte)).await {
            Ok(Err(e)) => crate::tls::advice(&e.to_string()),
            _ => None,
        }
    };
    tokio::time::timeout(CONNECT_TIMEOUT, probe)
        .await
        .ok()
        .flatten()
}

/// Why a write failed. Under TLS 1.3 a server checks the client's
/// certificate after the client's handshake is done, so a refusal shows as
/// the next write failing; the alert that says why is waiting to be read.
async fn write_failed<R: AsyncRead + Unpin>(
    replies: &mut FramedRead<R, FrameCodec>,
    addr: &str,
    error: std::io::Error,
) -> Failure {
    match tokio::time::timeout(Duration::from_millis(200), replies.next()).await {
        Ok(Some(Err(e))) if e.to_string().contains("alert") => {
            refused_handshake(addr, &e.to_string())
        }
        _ => Failure::Lost(error.to_string()),
    }
}

/// Why a connection's driver stopped.
enum Failure {
    /// The server refused the connection before it read any call; the
    /// body of its `ErrorReply`.
    Refused(bytes::Bytes),
    /// The connection broke: calls in flight may or may not have acted.
    Lost(String),
}
