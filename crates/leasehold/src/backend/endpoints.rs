//! Several leaseholdd endpoints (`http://a:7419,b:7419,c:7419`), and finding
//! the leader among them.
//!
//! Calls go to the current endpoint. A `not_leader` answer names the leader
//! when the node knows it: the call is sent there at once (it was not
//! proposed, so this is safe for any call). A node that cannot be connected
//! to, or a `not_leader` with no leader known yet (an election is running),
//! moves to the next endpoint in the list. A call cut off after it was sent
//! is not re-sent here: it may have acted, and only its caller knows whether
//! a retry is safe (acquire, grant and release carry request ids and are
//! retried with them); the next call goes to the next endpoint.
//!
//! While a new leader is being elected every node may say `not_leader`, or
//! name the old leader that is gone: a call keeps looking, with a growing
//! pause, for up to [`FAILOVER_WAIT`], which covers an election (150–300 ms
//! by default) with room.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::frame::Op;
use leasehold_proto::v1 as pb;
use pb::leasehold_client::LeaseholdClient;
use prost::Message;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::{InterceptedService, Interceptor};
use tonic::transport::Channel;

use super::frames::{CallError, Frames, RouteError};
use crate::tls::{ClientTls, TlsOptions};
use crate::{Error, Result};

/// How long a call looks for a leader before it gives up as unavailable.
pub(super) const FAILOVER_WAIT: Duration = Duration::from_secs(5);

/// The pause before the `hop`-th attempt to find the leader: none for the
/// first (a leader was named), then 10 ms more each time, at most 50 ms, so
/// a new leader is found within ~50 ms of its election.
fn pause(hop: usize) -> Duration {
    Duration::from_millis((10 * hop.saturating_sub(1) as u64).min(50))
}

/// One endpoint's connections.
pub(super) struct Route {
    /// `host:port`.
    pub addr: String,
    /// The framed connection, for everything that never waits.
    pub frames: Frames,
    /// gRPC, for waits, status and watch.
    pub rpc: Rpc,
}

/// A gRPC client that sends the access token with every call.
pub(super) type Rpc = LeaseholdClient<InterceptedService<Channel, Bearer>>;

/// Puts `authorization: Bearer <token>` on every gRPC call.
#[derive(Clone)]
pub(super) struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The endpoints of one deployment and the one in use.
pub(super) struct Endpoints {
    /// As given, in order.
    addrs: Vec<String>,
    current: Mutex<Arc<Route>>,
    /// Routes made so far, by address, reused when the leader moves back.
    routes: tokio::sync::Mutex<HashMap<String, Arc<Route>>>,
    /// TLS for every endpoint (`https://`), or none.
    tls: Option<ClientTls>,
    /// The access token, if any.
    token: Option<Arc<str>>,
}

/// How to go on after a call failed at `route`.
enum Next {
    /// To the leader it named.
    Leader(String),
    /// To the next endpoint.
    Rotate,
}

/// Where to go after a refusal with this code: `not_leader` names the leader
/// (or no one, during an election); `unavailable` was not proposed either
/// (a leader still starting, or one without a quorum).
fn not_leader_hint(code: &str, leader: Option<String>) -> Option<Next> {
    match code {
        "not_leader" => Some(match leader {
            Some(l) if !l.is_empty() => Next::Leader(l),
            _ => Next::Rotate,
        }),
        "unavailable" => Some(Next::Rotate),
        _ => None,
    }
}

/// `host:port` of each endpoint of `url` (`http://a:1,b:2` or
/// `http://a:1,http://b:2`), and whether they speak TLS (`https://`).
fn parse(url: &str) -> Result<(Vec<String>, bool)> {
    let invalid = |why: &str| Error::InvalidArgument(format!("endpoint {url:?}: {why}"));
    let mut addrs = Vec::new();
    let secure = url.trim_start().starts_with("https://");
    for part in url.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (scheme, rest) = part.split_once("://").unwrap_or(("", part));
        match (scheme, secure) {
            ("", _) | ("http" | "leasehold", false) | ("https", true) => {}
            _ => {
                return Err(invalid(
                    "every endpoint takes the same scheme: http:// or https://",
                ))
            }
        }
        let host_port = rest.trim_end_matches('/');
        let uri: tonic::codegen::http::Uri = format!("http://{host_port}")
            .parse()
            .map_err(|e| invalid(&format!("{host_port:?}: {e}")))?;
        let host = uri.host().ok_or_else(|| invalid("no host"))?;
        addrs.push(format!("{host}:{}", uri.port_u16().unwrap_or(80)));
    }
    if addrs.is_empty() {
        return Err(invalid("no address"));
    }
    Ok((addrs, secure))
}

/// `Bearer <token>` as a metadata value.
fn bearer_value(token: &str) -> std::result::Result<MetadataValue<Ascii>, String> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| "the token has characters a header cannot carry".to_string())
}

/// The host of `host:port` (an IPv6 address without its brackets).
fn host(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

impl Endpoints {
    /// Connects to the first endpoint of `url` that answers, over TLS
    /// with `tls` if `url` says `https://`.
    pub async fn connect(url: &str, tls: &TlsOptions, token: Option<&str>) -> Result<Endpoints> {
        let (addrs, secure) = parse(url)?;
        let tls = secure.then(|| ClientTls::load(tls)).transpose()?;
        let token: Option<Arc<str>> = token.map(Arc::from);
        if let Some(t) = &token {
            bearer_value(t).map_err(Error::InvalidArgument)?;
        }
        let routes = tokio::sync::Mutex::new(HashMap::new());
        let mut errors = Vec::new();
        for addr in &addrs {
            match Self::route_to(&routes, addr, tls.as_ref(), token.as_ref()).await {
                Ok(route) => {
                    return Ok(Endpoints {
                        addrs,
                        current: Mutex::new(route),
                        routes,
                        tls,
                        token,
                    })
                }
                Err(RouteError::Refused(e)) => return Err(Error::Unauthenticated(e)),
                Err(RouteError::Unreachable(e)) => errors.push(e),
            }
        }
        Err(Error::Unavailable(errors.join("; ")))
    }

    async fn route_to(
        routes: &tokio::sync::Mutex<HashMap<String, Arc<Route>>>,
        addr: &str,
        tls: Option<&ClientTls>,
        token: Option<&Arc<str>>,
    ) -> std::result::Result<Arc<Route>, RouteError> {
        let mut routes = routes.lock().await;
        if let Some(r) = routes.get(addr) {
            return Ok(r.clone());
        }
        // Connects now, so a node that is down fails here, with its reason.
        let frames = Frames::connect(addr.to_string(), tls.cloned(), token.cloned()).await?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Channel::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| RouteError::Unreachable(format!("endpoint {addr:?}: {e}")))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls.grpc(host(addr)))
                .map_err(|e| RouteError::Unreachable(format!("endpoint {addr:?}: TLS: {e}")))?;
        }
        let channel = endpoint.connect_lazy();
        let route = Arc::new(Route {
            addr: addr.to_string(),
            frames,
            rpc: LeaseholdClient::with_interceptor(
                channel,
                Bearer(token.and_then(|t| bearer_value(t).ok())),
            ),
        });
        routes.insert(addr.to_string(), route.clone());
        Ok(route)
    }

    /// How many endpoints there are.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// The endpoint in use.
    pub fn route(&self) -> Arc<Route> {
        self.current.lock().clone()
    }

    /// After a failure at `from`: moves on (unless another call already did).
    async fn move_on(&self, from: &Route, next: Next, hop: usize) {
        tokio::time::sleep(pause(hop)).await;
        if self.route().addr != from.addr {
            return;
        }
        let mut targets: Vec<String> = Vec::new();
        if let Next::Leader(addr) = next {
            targets.push(addr);
        }
        let at = self.addrs.iter().position(|a| *a == from.addr).unwrap_or(0);
        for i in 1..=self.addrs.len() {
            targets.push(self.addrs[(at + i) % self.addrs.len()].clone());
        }
        for addr in targets {
            let route = Self::route_to(&self.routes, &addr, self.tls.as_ref(), self.token.as_ref());
            if let Ok(route) = route.await {
                *self.current.lock() = route;
                return;
            }
        }
    }

    /// After a call cut off at `from`: the next call goes elsewhere.
    pub async fn failed(&self, from: &Route) {
        self.move_on(from, Next::Rotate, 0).await;
    }

    /// A framed call, sent to the leader.
    pub async fn call<R: Message + Default>(
        &self,
        op: Op,
        request: &impl Message,
    ) -> std::result::Result<R, CallError> {
        self.framed(|frames| async move { frames.call::<R>(op, request).await })
            .await
    }

    /// A framed try-acquire, sent to the leader; a grant that finds no
    /// caller is released, and `guard` kept until it is.
    pub async fn acquire<G: std::any::Any + Send + Clone>(
        &self,
        request: &pb::AcquireRequest,
        guard: G,
    ) -> std::result::Result<pb::AcquireResponse, CallError> {
        self.framed(|frames| {
            let guard = guard.clone();
            async move { frames.acquire(request, guard).await }
        })
        .await
    }

    /// Sends with `send` on the current endpoint's framed connection, going
    /// on to the leader while the answer says it is elsewhere.
    async fn framed<R, F, Fut>(&self, send: F) -> std::result::Result<R, CallError>
    where
        F: Fn(Frames) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<R, CallError>>,
    {
        let mut hop = 0;
        let give_up = tokio::time::Instant::now() + FAILOVER_WAIT;
        loop {
            let route = self.route();
            let result = send(route.frames.clone()).await;
            match self.next_after(&result) {
                Some(next) if tokio::time::Instant::now() < give_up => {
                    hop += 1;
                    self.move_on(&route, next, hop).await;
                }
                _ => {
                    if let Err(CallError::Transport(_)) = &result {
                        self.failed(&route).await;
                    }
                    return result;
                }
            }
        }
    }

    fn next_after<R>(&self, result: &std::result::Result<R, CallError>) -> Option<Next> {
        match result {
            Err(CallError::Server(reply)) => {
                not_leader_hint(&reply.code, reply.details.get("leader").cloned())
            }
            Err(CallError::Unsent(_)) => Some(Next::Rotate),
            _ => None,
        }
    }

    /// A gRPC call, sent to the leader.
    pub async fn grpc<T, F, Fut>(&self, call: F) -> std::result::Result<T, tonic::Status>
    where
        F: Fn(Rpc) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut hop = 0;
        let give_up = tokio::time::Instant::now() + FAILOVER_WAIT;
        loop {
            let route = self.route();
            let status = match call(route.rpc.clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(status) => status,
            };
            let code = status
                .metadata()
                .get("leasehold-code")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let leader = status
                .metadata()
                .get("leasehold-leader")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            match not_leader_hint(code, leader) {
                Some(next) if tokio::time::Instant::now() < give_up => {
                    hop += 1;
                    self.move_on(&route, next, hop).await;
                }
                _ => {
                    if code.is_empty() {
                        let status = self.explained(&route, status).await;
                        if status.code() == tonic::Code::Unavailable {
                            self.failed(&route).await;
                        }
                        return Err(status);
                    }
                    return Err(status);
                }
            }
        }
    }

    /// A gRPC failure that carries no server code, with its TLS cause if it
    /// has one: hyper reports a refused client certificate as a bare
    /// "transport error", so the handshake is tried again, framed, to read
    /// the server's alert. The answer then reads as the framed protocol's
    /// does: `unauthenticated`, with what to do.
    pub async fn explained(&self, route: &Route, status: tonic::Status) -> tonic::Status {
        let (Some(tls), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled) =
            (&self.tls, status.code())
        else {
            return status;
        };
        if crate::tls::explain(&status).is_some() {
            return status;
        }
        match super::frames::diagnose_tls(&route.addr, tls).await {
            Some(advice) => {
                let mut refused = tonic::Status::unauthenticated(format!(
                    "leaseholdd at {}: {advice} ({})",
                    route.addr,
                    status.message()
                ));
                refused.metadata_mut().insert(
                    "leasehold-code",
                    MetadataValue::from_static("unauthenticated"),
                );
                refused
            }
            None => status,
        }
    }
}
