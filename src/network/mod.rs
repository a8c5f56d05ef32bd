//! Listeners and connections (Kafka's `SocketServer`).
//!
//! Each connection has a reader that frames and decodes requests and starts a task per request,
//! and a writer that sends the responses strictly in request order, so clients may pipeline.
//! Anything malformed closes the connection with one log line; it never reaches a handler.

use std::collections::HashMap;
use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::protocol::ErrorCode;
use crate::sync::{MutexExt, RwLockExt};

mod closing_log;

use closing_log::{closing_line, ClosingLog};

use crate::api::{self, RequestContext};
use crate::broker::Broker;
use crate::log::zero_copy::FileRanges;
use crate::log::FileRange;
use crate::metrics::GaugeGuard;
use crate::security::sasl::{AuthState, Exchange, TokenOutcome};
use crate::security::{KafkaPrincipal, ListenerSecurity};

/// Encoded responses waiting for the socket before the connection stops handling requests
/// (back-pressure on a client that does not read).
const MAX_QUEUED_RESPONSES: usize = 16;

/// Why a frame ends its connection.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds socket.request.max.bytes ({1})")]
    TooLarge(i64, usize),
    #[error("frame too short for a request header ({0} bytes)")]
    TooShort(usize),
    #[error("unknown API key {0}")]
    UnknownApi(i16),
    #[error("unsupported version {1} of API {0:?}")]
    UnsupportedVersion(ApiKey, i16),
    #[error("malformed {0:?} v{1} request: {2}")]
    Malformed(ApiKey, i16, String),
    #[error("inter-broker request: {0}")]
    InterBroker(String),
    /// Authentication failed or was not followed; Kafka closes such connections.
    #[error("authentication: {0}")]
    Authentication(String),
}

/// Kafka's connection quotas: `max.connections` over the broker, `listener.name.<l>.max.connections`
/// per listener, and `max.connections.per.ip` (with its overrides) per client address. As in
/// Kafka, the inter-broker listener is exempt from the broker-wide limit (brokers can always
/// reach each other), so with a single listener only the per-listener and per-IP limits bind.
pub struct ConnectionQuotas {
    /// The broker-wide limits, dynamic broker configs in Kafka (SocketServer's
    /// reconfigurable set): changed in place by [`ConnectionQuotas::reconfigure`].
    limits: std::sync::RwLock<Limits>,
    inter_broker_listener: String,
    per_listener_max: HashMap<String, usize>,
    counts: Mutex<Counts>,
    /// Signalled whenever a connection ends, for an acceptor waiting for room.
    freed: Notify,
    /// `max.connection.creation.rate`, over the listeners but the inter-broker one.
    broker_rate: Mutex<Option<TokenBucket>>,
    /// `listener.name.<l>.max.connection.creation.rate`.
    listener_rates: HashMap<String, Mutex<TokenBucket>>,
    /// `queued.max.request.bytes`, shared by every connection.
    pub memory: RequestMemoryPool,
    /// Lines about refused and closed connections, bounded per client address.
    closings: ClosingLog,
}

/// `max.connections`, `max.connections.per.ip` and its overrides.
struct Limits {
    max_total: usize,
    max_per_ip: usize,
    overrides: HashMap<IpAddr, usize>,
    creation_rate: Option<u32>,
}

impl Limits {
    fn of(config: &crate::config::BrokerConfig) -> Limits {
        Limits {
            max_total: config.max_connections,
            max_per_ip: config.max_connections_per_ip,
            overrides: config.max_connections_per_ip_overrides.iter().copied().collect(),
            creation_rate: config.max_connection_creation_rate,
        }
    }
}

/// A connection creation rate as Kafka enforces it: not by refusing connections but by
/// accepting the next one only when the rate allows (the client waits in the backlog). A
/// bucket of one second's worth of connections, refilled continuously.
struct TokenBucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    fn new(rate: u32) -> Mutex<TokenBucket> {
        Mutex::new(TokenBucket::full(rate))
    }

    fn full(rate: u32) -> TokenBucket {
        let rate = f64::from(rate);
        TokenBucket { rate, tokens: rate, at: Instant::now() }
    }

    /// Takes a token, or says how long until there is one.
    fn take(&mut self, now: Instant) -> Option<std::time::Duration> {
        self.tokens =
            (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * self.rate).min(self.rate.max(1.0));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return None;
        }
        if self.rate <= 0.0 {
            // A rate of 0: no new connection, ever (checked again once a second).
            return Some(std::time::Duration::from_secs(1));
        }
        Some(std::time::Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_listener: HashMap<Arc<str>, usize>,
    per_ip: HashMap<IpAddr, usize>,
}

impl ConnectionQuotas {
    pub fn new(config: &crate::config::BrokerConfig) -> Arc<ConnectionQuotas> {
        Arc::new(ConnectionQuotas {
            limits: std::sync::RwLock::new(Limits::of(config)),
            inter_broker_listener: config.inter_broker_listener.clone(),
            per_listener_max: config.listener_max_connections.clone(),
            counts: Mutex::new(Counts::default()),
            freed: Notify::new(),
            broker_rate: Mutex::new(config.max_connection_creation_rate.map(TokenBucket::full)),
            listener_rates: config
                .listener_max_connection_creation_rate
                .iter()
                .map(|(l, &r)| (l.clone(), TokenBucket::new(r)))
                .collect(),
            memory: RequestMemoryPool::new(config.queued_max_request_bytes),
            closings: ClosingLog::new(config.connection_log_interval),
        })
    }

    /// How long `listener` must wait before it accepts its next connection, taking the token
    /// when there is none to wait for. The listener's own rate is checked first, so a
    /// connection it holds back does not use up the broker-wide rate.
    fn creation_delay(&self, listener: &str) -> Option<std::time::Duration> {
        let now = Instant::now();
        if let Some(bucket) = self.listener_rates.get(listener) {
            if let Some(wait) = bucket.lock_unpoisoned().take(now) {
                return Some(wait);
            }
        }
        if listener == self.inter_broker_listener {
            return None;
        }
        let wait = self.broker_rate.lock_unpoisoned().as_mut()?.take(now);
        if wait.is_some() {
            // Give the listener's token back: this connection is not accepted yet.
            if let Some(b) = self.listener_rates.get(listener) {
                let mut b = b.lock_unpoisoned();
                b.tokens += 1.0;
            }
        }
        wait
    }

    fn limits(&self) -> std::sync::RwLockReadGuard<'_, Limits> {
        self.limits.read_unpoisoned()
    }

    /// Applies new broker-wide limits (dynamic broker configs). Connections already open
    /// stay, as in Kafka; an acceptor waiting for room looks again at once.
    pub fn reconfigure(&self, config: &crate::config::BrokerConfig) {
        let next = Limits::of(config);
        let rate_changed = {
            let mut l = self.limits.write_unpoisoned();
            let changed = l.creation_rate != next.creation_rate;
            *l = next;
            changed
        };
        if rate_changed {
            *self.broker_rate.lock_unpoisoned() = config.max_connection_creation_rate.map(TokenBucket::full);
        }
        self.freed.notify_waiters();
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock_unpoisoned()
    }

    /// Why `listener` cannot take another connection now, if it cannot.
    fn no_slot(&self, counts: &Counts, listener: &str) -> Option<String> {
        let max = self.per_listener_max.get(listener).copied().unwrap_or(usize::MAX);
        if counts.per_listener.get(listener).copied().unwrap_or(0) >= max {
            return Some(format!("listener {listener} has the configured maximum of {max} connections"));
        }
        let max_total = self.limits().max_total;
        if listener != self.inter_broker_listener && counts.total >= max_total {
            return Some(format!("the broker has the configured maximum of {max_total} connections"));
        }
        None
    }

    fn full(&self, listener: &str) -> bool {
        self.no_slot(&self.counts(), listener).is_some()
    }

    /// Counts a new connection from `ip` on `listener`, or says which limit it would pass.
    fn admit(self: &Arc<Self>, ip: IpAddr, listener: &Arc<str>) -> Result<Admitted, String> {
        let mut counts = self.counts();
        if let Some(why) = self.no_slot(&counts, listener) {
            return Err(why);
        }
        let limit = {
            let l = self.limits();
            l.overrides.get(&ip).copied().unwrap_or(l.max_per_ip)
        };
        let open = counts.per_ip.get(&ip).copied().unwrap_or(0);
        if open >= limit {
            return Err(format!("/{ip} already has the configured maximum of {limit} connections"));
        }
        counts.per_ip.insert(ip, open + 1);
        *counts.per_listener.entry(listener.clone()).or_insert(0) += 1;
        counts.total += 1;
        Ok(Admitted { quotas: self.clone(), ip, listener: listener.clone() })
    }
}

/// A connection's place in the quotas, given back when it ends.
struct Admitted {
    quotas: Arc<ConnectionQuotas>,
    ip: IpAddr,
    listener: Arc<str>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.quotas.counts();
        match counts.per_ip.get_mut(&self.ip) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                counts.per_ip.remove(&self.ip);
            }
        }
        if let Some(n) = counts.per_listener.get_mut(&self.listener) {
            *n = n.saturating_sub(1);
        }
        counts.total = counts.total.saturating_sub(1);
        drop(counts);
        self.quotas.freed.notify_waiters();
    }
}

pub async fn serve_listener(
    broker: Arc<Broker>,
    listener: TcpListener,
    listener_name: Arc<str>,
    quotas: Arc<ConnectionQuotas>,
    mut shutdown: watch::Receiver<bool>,
    tracker: TaskTracker,
) {
    let metrics = broker.metrics.listener(&listener_name);
    // One descriptor held back for the moment the process has none left (see the EMFILE arm).
    let mut reserve = std::fs::File::open("/dev/null").ok();
    loop {
        if quotas.full(&listener_name) {
            // Not accepting leaves new clients waiting in the backlog until a connection ends.
            let freed = quotas.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if quotas.full(&listener_name) {
                tokio::select! {
                    _ = freed => {}
                    _ = shutdown.changed() => break,
                }
            }
            continue;
        }
        if let Some(wait) = quotas.creation_delay(&listener_name) {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => break,
            }
            continue;
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                let admitted = match quotas.admit(peer.ip(), &listener_name) {
                    Ok(a) => a,
                    Err(why) => {
                        tracing::debug!(%peer, listener = %listener_name, "rejected connection: {why}");
                        drop(stream);
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let span = tracing::info_span!("connection", %peer, listener = %listener_name);
                let conn = Connection {
                    path: RequestPath::new(broker.clone(), listener_name.clone(), format!("/{}", peer.ip())),
                    _counted: metrics.connection(),
                    admitted,
                };
                tracker.spawn(conn.start(stream, shutdown.clone()).instrument(span));
            }
            Err(e) if is_out_of_descriptors(&e) && reserve.is_some() => {
                // The pending connection cannot be accepted, so it would stay in the backlog and
                // wake this loop again at once. The reserve descriptor makes room to take it
                // and close it: the client hears "no" instead of hanging, and the loop waits
                // for the next connection instead of spinning.
                drop(reserve.take());
                let nobody = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
                match tokio::time::timeout(std::time::Duration::from_millis(100), listener.accept()).await {
                    Ok(Ok((stream, peer))) => {
                        drop(stream);
                        closing_line!(quotas.closings, peer.ip(), "descriptors", warn, listener = %listener_name,
                            "out of file descriptors: connection closed at once (ulimit -n; fewer partitions or connections)");
                    }
                    Ok(Err(e)) => closing_line!(quotas.closings, nobody, "accept", warn, error = %e, "accept failed"),
                    Err(_) => {}
                }
                reserve = std::fs::File::open("/dev/null").ok();
            }
            Err(e) => {
                // Without a reserve (another thread took it): back off briefly instead of
                // spinning on accept. No client to name: the failures share the unspecified
                // address's interval.
                let nobody = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
                closing_line!(quotas.closings, nobody, "accept", warn, error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                if reserve.is_none() {
                    reserve = std::fs::File::open("/dev/null").ok();
                }
            }
        }
    }
    tracing::info!(listener = %listener_name, "listener stopped");
}

/// EMFILE (this process) or ENFILE (the whole system).
fn is_out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

struct Connection {
    path: RequestPath,
    /// In the listener's connection count until the connection ends.
    _counted: GaugeGuard,
    admitted: Admitted,
}

impl Connection {
    /// The TLS handshake where the listener has TLS, then the requests.
    async fn start(mut self, stream: TcpStream, shutdown: watch::Receiver<bool>) {
        let Some(acceptor) = self.path.security.tls.as_ref().map(|t| t.acceptor()) else {
            // Bytes go to the socket as they are: record sets may go straight from the file.
            self.path.sendfile = true;
            let (rd, wr) = stream.into_split();
            return self.serve(rd, wr, shutdown).await;
        };
        // A client that never finishes its handshake holds its slot no longer than an idle one.
        let idle = self.path.broker.config.connections_max_idle;
        let tls = match tokio::time::timeout(idle, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                closing_line!(self.admitted.quotas.closings, self.admitted.ip, "tls", info, error = %e, "TLS handshake failed; closing");
                return;
            }
            Err(_) => {
                let why = "no TLS handshake within connections.max.idle.ms; closing";
                closing_line!(self.admitted.quotas.closings, self.admitted.ip, "tls", info, "{why}");
                return;
            }
        };
        if self.path.security.principal_from_certificate {
            if let Some(p) = crate::security::tls::peer_principal(tls.get_ref().1, &self.path.security.principal_mapper)
            {
                tracing::info!(principal = %p, "authenticated by client certificate");
                self.path.set_principal(p);
            }
        }
        let (rd, wr) = tokio::io::split(tls);
        self.serve(rd, wr, shutdown).await
    }

    async fn serve<R, W>(self, rd: R, mut wr: W, mut shutdown: watch::Receiver<bool>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: ResponseSink + Send + 'static,
    {
        let mut rd = BufReader::with_capacity(4 * 1024, rd);
        // Requests are handled one at a time, in order (Kafka mutes a connection while a
        // request is in flight): pipelined produces must append in the order they were sent.
        // Only the writing of responses overlaps with handling the next request.
        let (tx, mut rx) = mpsc::channel::<ResponseFrame>(MAX_QUEUED_RESPONSES);
        let writer = tokio::spawn(
            async move {
                let mut pieces = Vec::new();
                while let Some(frame) = rx.recv().await {
                    frame.push_to(&mut pieces);
                    // Responses already queued go out in the same write: a pipelining client's
                    // answers cost one system call, not one each.
                    while let Ok(next) = rx.try_recv() {
                        next.push_to(&mut pieces);
                    }
                    if let Err(e) = write_pieces(&mut wr, &pieces).await {
                        tracing::debug!(error = %e, "write failed; closing");
                        return;
                    }
                    pieces.clear();
                }
                let _ = wr.shutdown().await;
            }
            .in_current_span(),
        );
        let max = self.path.broker.config.socket_request_max_bytes;
        let idle = self.path.broker.config.connections_max_idle;
        let pool = self.admitted.quotas.memory.clone();
        let mut stopping = false;
        loop {
            // Before authentication, frames are held to sasl.server.max.receive.size.
            let max = self.path.max_frame(max);
            let frame = if stopping {
                // Shutting down: answer the requests already received whole, then close.
                if !holds_whole_frame(rd.buffer()) {
                    break;
                }
                read_frame(&mut rd, max, &pool).await
            } else {
                tokio::select! {
                    f = read_frame(&mut rd, max, &pool) => f,
                    _ = tokio::time::sleep(idle) => {
                        tracing::debug!("no request for connections.max.idle.ms; closing");
                        break;
                    }
                    _ = shutdown.changed() => {
                        stopping = true;
                        continue;
                    }
                }
            };
            let result = match frame {
                // Boxed: a handler's future is large, and inline it would be part of every
                // idle connection's memory rather than only of those with a request in flight.
                // The frame's room in the request memory pool is held until it is handled.
                Ok((f, _room)) => Box::pin(self.path.process_frame(f)).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(Some(response)) => {
                    if tx.send(response).await.is_err() {
                        break;
                    }
                    if let Some(why) = self.path.closing() {
                        closing_line!(self.admitted.quotas.closings, self.admitted.ip, "sasl", info, "{why}; closing");
                        break;
                    }
                }
                Ok(None) => {}
                Err(FrameError::Authentication(why)) => {
                    closing_line!(
                        self.admitted.quotas.closings,
                        self.admitted.ip,
                        "authentication",
                        info,
                        "{why}; closing"
                    );
                    break;
                }
                Err(FrameError::Closed) => break,
                Err(FrameError::Io(e)) => {
                    tracing::debug!(error = %e, "read failed; closing");
                    break;
                }
                Err(e) => {
                    closing_line!(self.admitted.quotas.closings, self.admitted.ip, "frame", warn, error = %e, "closing connection");
                    break;
                }
            }
        }
        drop(tx);
        let _ = writer.await;
    }
}

/// What a connection's requests are handled with: the broker, and who is asking on which
/// listener. Apart from the socket, so that the whole request path (decode, handle, encode)
/// can be driven in-process, as the fuzz targets do.
pub struct RequestPath {
    broker: Arc<Broker>,
    listener: Arc<str>,
    peer: String,
    /// Set for a plaintext socket: Fetch responses may carry file ranges for sendfile.
    sendfile: bool,
    security: Arc<ListenerSecurity>,
    /// Taken only between awaits: requests on a connection are handled one at a time.
    auth: Mutex<ConnectionAuth>,
}

/// A connection's authentication: who it is, where it is in SASL, and when its session ends.
struct ConnectionAuth {
    principal: Arc<KafkaPrincipal>,
    state: AuthState,
    /// The mechanism of the last handshake, which a re-authentication must repeat.
    mechanism: Option<String>,
    /// `connections.max.reauth.ms` after the last authentication; past it, only a
    /// re-authentication is served.
    session_expiry: Option<Instant>,
    /// Set when a response has been sent after which Kafka closes the connection.
    close_after_response: Option<String>,
    /// A later handshake is a re-authentication (KIP-368).
    authenticated_once: bool,
}

impl RequestPath {
    pub fn new(broker: Arc<Broker>, listener: Arc<str>, peer: String) -> RequestPath {
        let security = broker.security.listener(&listener);
        let state = if security.sasl.is_some() { AuthState::Handshake } else { AuthState::NotSasl };
        let auth = ConnectionAuth {
            principal: Arc::new(KafkaPrincipal::anonymous()),
            state,
            mechanism: None,
            session_expiry: None,
            close_after_response: None,
            authenticated_once: false,
        };
        RequestPath { broker, listener, peer, sendfile: false, security, auth: Mutex::new(auth) }
    }

    fn auth(&self) -> std::sync::MutexGuard<'_, ConnectionAuth> {
        self.auth.lock_unpoisoned()
    }

    fn set_principal(&self, principal: KafkaPrincipal) {
        self.auth().principal = Arc::new(principal);
    }

    /// The connection's principal (`User:ANONYMOUS` until authenticated).
    pub fn principal(&self) -> Arc<KafkaPrincipal> {
        self.auth().principal.clone()
    }

    fn authenticated(&self) -> bool {
        matches!(self.auth().state, AuthState::NotSasl | AuthState::Authenticated)
    }

    fn max_frame(&self, max: usize) -> usize {
        match &self.security.sasl {
            Some(s) if !self.authenticated() => max.min(s.max_receive_size),
            _ => max,
        }
    }

    fn closing(&self) -> Option<String> {
        self.auth().close_after_response.take()
    }

    /// Decodes one frame, runs its handler and returns the encoded response (None: the
    /// request gets no response, as Produce with acks=0).
    pub async fn process(&self, frame: Bytes) -> Result<Option<Bytes>, FrameError> {
        match self.process_frame(frame).await? {
            Some(response) => Ok(Some(response.into_bytes()?)),
            None => Ok(None),
        }
    }

    /// [`RequestPath::process`], with the response as the pieces the socket is sent.
    async fn process_frame(&self, mut frame: Bytes) -> Result<Option<ResponseFrame>, FrameError> {
        let received = Instant::now();
        if matches!(self.auth().state, AuthState::Authenticate { raw: true, .. }) {
            // After SaslHandshake v0 the client sends bare tokens, not requests.
            return self.raw_token(frame).await.map(|t| Some(t.into()));
        }
        if frame.len() < 8 {
            return Err(FrameError::TooShort(frame.len()));
        }
        let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        self.check_authentication(raw_key)?;
        if api::inter_broker::is_inter_broker(raw_key) && self.broker.store.is_zookeeper() {
            let response = self.process_inter_broker(raw_key, version, frame).await?;
            self.broker.metrics.requests.record(raw_key, version, false, received.elapsed());
            return Ok(Some(response.into()));
        }
        let key = ApiKey::try_from(raw_key).map_err(|_| FrameError::UnknownApi(raw_key))?;
        // The controller's requests above skip the bound: they must get through however busy
        // the clients keep this broker (Kafka gives them a control-plane listener for that).
        let slot = match self.broker.request_slots.clone().acquire_owned().await {
            Ok(permit) => Some((permit, self.broker.metrics.handling())),
            Err(_) => None,
        };
        let supported = api::supported_versions(key).is_some_and(|(min, max)| (min..=max).contains(&version));
        if !supported {
            if key == ApiKey::ApiVersions {
                // Kafka answers an ApiVersions version it doesn't know in v0 form, with its
                // own list, so the client can downgrade.
                let body = ResponseKind::ApiVersions(api::api_versions_unsupported(self.broker.store.is_zookeeper()));
                return encode_response(key, 0, correlation_id, &body).map(Some);
            }
            return Err(FrameError::UnsupportedVersion(key, version));
        }
        if api::legacy::serves(key, version) {
            return Ok(self.process_legacy(key, version, correlation_id, frame, slot).await?.map(Into::into));
        }
        let (header, request) = decode_guarded(key, version, self.broker.config.max_decoded_bytes_per_request, || {
            let header = RequestHeader::decode(&mut frame, key.request_header_version(version))?;
            let request = RequestKind::decode(key, &mut frame, version)?;
            Ok::<_, anyhow::Error>((header, request))
        })?;
        let ctx = self.context(header, slot);
        let from_follower = match &request {
            RequestKind::Fetch(f) => (if version >= 15 { f.replica_state.replica_id.0 } else { f.replica_id.0 }) >= 0,
            _ => false,
        };
        let span = tracing::debug_span!("request", api = ?key, version, correlation_id);
        let request = match request {
            RequestKind::SaslHandshake(r) => {
                let body = self.sasl_handshake(version, r);
                return encode_response(key, version, correlation_id, &ResponseKind::SaslHandshake(body)).map(Some);
            }
            RequestKind::SaslAuthenticate(r) => {
                let body = self.sasl_authenticate(version, r).instrument(span).await;
                return encode_response(key, version, correlation_id, &ResponseKind::SaslAuthenticate(body)).map(Some);
            }
            other => other,
        };
        let response = match api::handle(&ctx, request).instrument(span).await {
            Ok(Some(response)) => {
                let files = std::mem::take(&mut *ctx.file_ranges.lock_unpoisoned());
                Some(encode_response_with_files(key, version, correlation_id, &response, files)?)
            }
            Ok(None) => None,
            Err(e) => return Err(FrameError::Malformed(key, version, e)),
        };
        self.broker.metrics.requests.record(raw_key, version, from_follower, received.elapsed());
        Ok(response)
    }
}

impl RequestPath {
    fn context(&self, header: RequestHeader, slot: Option<api::RequestSlot>) -> RequestContext {
        RequestContext {
            broker: self.broker.clone(),
            listener: self.listener.clone(),
            header,
            peer: self.peer.clone(),
            slot: Arc::new(std::sync::Mutex::new(slot)),
            principal: self.principal(),
            sendfile: self.sendfile,
            file_ranges: Default::default(),
        }
    }

    /// A version older than the protocol crate knows: decoded and answered by `api::legacy`,
    /// behind the same guard against a panicking decoder.
    async fn process_legacy(
        &self,
        key: ApiKey,
        version: i16,
        correlation_id: i32,
        mut frame: Bytes,
        slot: Option<api::RequestSlot>,
    ) -> Result<Option<Bytes>, FrameError> {
        let malformed = |e: String| FrameError::Malformed(key, version, e);
        let (header, request) = decode_guarded(key, version, self.broker.config.max_decoded_bytes_per_request, || {
            let header = RequestHeader::decode(&mut frame, key.request_header_version(version))
                .map_err(|e| format!("header: {e}"))?;
            let request = api::legacy::decode(key, version, frame)?;
            Ok::<_, String>((header, request))
        })?;
        let ctx = self.context(header, slot);
        let span = tracing::debug_span!("request", api = ?key, version, correlation_id);
        let Some(body) = api::legacy::handle(&ctx, request).instrument(span).await.map_err(malformed)? else {
            return Ok(None);
        };
        // Every old version is non-flexible: response header v0, the correlation id alone.
        let mut buf = BytesMut::with_capacity(body.len() + 8);
        buf.put_i32((body.len() + 4) as i32);
        buf.put_i32(correlation_id);
        buf.extend_from_slice(&body);
        Ok(Some(buf.freeze()))
    }

    /// The controller's requests and the brokers' requests to it: codecs of our own, since
    /// the protocol crate no longer has these APIs.
    async fn process_inter_broker(&self, key: i16, version: i16, mut frame: Bytes) -> Result<Bytes, FrameError> {
        use crate::protocol::inter_broker;
        if !inter_broker::is_supported(key, version) {
            return Err(FrameError::InterBroker(format!("unsupported version {version} of API key {key}")));
        }
        let header = inter_broker::decode_request_header(&mut frame)
            .map_err(|e| FrameError::InterBroker(format!("malformed header: {e}")))?;
        let span = tracing::debug_span!("request", api = key, version, correlation_id = header.correlation_id);
        // Only a principal with CLUSTER_ACTION on the cluster (the brokers) may send these.
        let allowed = self.broker.security.authorizer.as_ref().is_none_or(|a| {
            let principal = self.principal();
            let host = self.peer.trim_start_matches('/').parse().ok();
            let session = crate::security::authorizer::Session { principal: &principal, host };
            a.authorize(
                &session,
                crate::security::authorizer::Operation::ClusterAction,
                crate::security::authorizer::ResourceType::Cluster,
                crate::security::authorizer::CLUSTER_NAME,
            )
        });
        let body = if allowed {
            api::inter_broker::handle(&self.broker, key, version, frame).instrument(span).await
        } else {
            tracing::info!(principal = %self.principal(), api = key, "inter-broker request refused: no CLUSTER_ACTION");
            api::inter_broker::refuse(key, version)
        }
        .map_err(FrameError::InterBroker)?;
        let mut buf = BytesMut::with_capacity(body.len() + 16);
        buf.put_i32(0);
        inter_broker::encode_response_header(header.correlation_id, key, version, &mut buf)
            .map_err(|e| FrameError::InterBroker(format!("cannot encode response header: {e}")))?;
        buf.extend_from_slice(&body);
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        Ok(buf.freeze())
    }
}

/// SASL on the request path: what may be asked before authentication, the handshake and the
/// token exchange.
impl RequestPath {
    /// Before authentication only ApiVersions and the SASL requests are served; Kafka closes
    /// the connection on anything else. After a session expired, only a re-authentication.
    fn check_authentication(&self, key: i16) -> Result<(), FrameError> {
        let auth = self.auth();
        let expired = auth.session_expiry.is_some_and(|at| Instant::now() >= at);
        let allowed = match &auth.state {
            AuthState::NotSasl => true,
            AuthState::Handshake if !auth.authenticated_once => {
                key == ApiKey::ApiVersions as i16 || key == ApiKey::SaslHandshake as i16
            }
            AuthState::Authenticated if expired => key == ApiKey::SaslHandshake as i16,
            AuthState::Authenticated => true,
            AuthState::Authenticate { .. } if !auth.authenticated_once => key == ApiKey::SaslAuthenticate as i16,
            // Re-authenticating: the old session serves until it expires.
            AuthState::Handshake | AuthState::Authenticate { .. } => {
                !expired || key == ApiKey::SaslAuthenticate as i16 || key == ApiKey::SaslHandshake as i16
            }
        };
        if allowed {
            return Ok(());
        }
        Err(FrameError::Authentication(if expired {
            format!("request with API key {key} after the SASL session expired (connections.max.reauth.ms)")
        } else {
            format!("request with API key {key} before SASL authentication completed")
        }))
    }

    fn sasl_handshake(
        &self,
        version: i16,
        request: kafka_protocol::messages::SaslHandshakeRequest,
    ) -> kafka_protocol::messages::SaslHandshakeResponse {
        use kafka_protocol::messages::SaslHandshakeResponse;
        let Some(settings) = &self.security.sasl else {
            return SaslHandshakeResponse::default().with_error_code(ErrorCode::IllegalSaslState.code());
        };
        let mechanisms = settings.mechanisms.iter().map(|m| m.clone().into()).collect();
        let response = SaslHandshakeResponse::default().with_mechanisms(mechanisms);
        let mechanism = request.mechanism.to_string();
        let mut auth = self.auth();
        let reauth = match auth.state {
            AuthState::Handshake => false,
            AuthState::Authenticated if version >= 1 => true,
            _ => {
                auth.close_after_response = Some("SaslHandshake out of order".into());
                return response.with_error_code(ErrorCode::IllegalSaslState.code());
            }
        };
        if reauth && auth.mechanism.as_deref() != Some(mechanism.as_str()) {
            auth.close_after_response = Some(format!("re-authentication with another mechanism ({mechanism})"));
            return response.with_error_code(ErrorCode::UnsupportedSaslMechanism.code());
        }
        match Exchange::start(settings, &mechanism) {
            None => {
                let shown: String = mechanism.chars().take(64).collect();
                auth.close_after_response = Some(format!("SaslHandshake for unsupported mechanism {shown:?}"));
                response.with_error_code(ErrorCode::UnsupportedSaslMechanism.code())
            }
            Some(exchange) => {
                auth.state = AuthState::Authenticate { exchange, raw: version == 0 };
                auth.mechanism = Some(mechanism);
                response
            }
        }
    }

    /// One token through the exchange; on success the connection's principal is set.
    /// Err: the reason authentication failed (for the log), after the configured delay.
    async fn sasl_step(&self, token: &[u8], version: i16) -> Result<(Vec<u8>, i64), String> {
        let Some(settings) = &self.security.sasl else {
            return Err("SASL token on a listener without SASL".into());
        };
        let security = &self.broker.security;
        let (outcome, mechanism) = {
            let mut auth = self.auth();
            let mechanism = auth.mechanism.clone().unwrap_or_default();
            let AuthState::Authenticate { exchange, .. } = &mut auth.state else {
                return Err("SaslAuthenticate out of order".into());
            };
            (exchange.step(token, settings, &security.scram, &security.decoy_key), mechanism)
        };
        let why = match outcome {
            TokenOutcome::Challenge(c) => return Ok((c, 0)),
            TokenOutcome::Success { principal, response } => {
                let mut auth = self.auth();
                if auth.authenticated_once && *auth.principal != principal {
                    format!("re-authentication as {principal}, not {}", auth.principal)
                } else {
                    let lifetime = security.max_reauth_ms;
                    auth.session_expiry =
                        (lifetime > 0).then(|| Instant::now() + std::time::Duration::from_millis(lifetime as u64));
                    if !auth.authenticated_once {
                        tracing::info!(%principal, %mechanism, "authenticated");
                    }
                    auth.state = AuthState::Authenticated;
                    auth.principal = Arc::new(principal);
                    auth.authenticated_once = true;
                    // SaslAuthenticate v0 has no session lifetime: such a client is closed at expiry.
                    return Ok((response, if version >= 1 { lifetime } else { 0 }));
                }
            }
            TokenOutcome::Failure(why) => why,
        };
        // Brute force gets no faster answer than the configured delay.
        tokio::time::sleep(security.failed_authentication_delay).await;
        Err(format!("SASL {mechanism} authentication failed: {why}"))
    }

    async fn sasl_authenticate(
        &self,
        version: i16,
        request: kafka_protocol::messages::SaslAuthenticateRequest,
    ) -> kafka_protocol::messages::SaslAuthenticateResponse {
        use kafka_protocol::messages::SaslAuthenticateResponse;
        if self.security.sasl.is_none() {
            return SaslAuthenticateResponse::default()
                .with_error_code(ErrorCode::IllegalSaslState.code())
                .with_error_message(Some("SaslAuthenticate request received on a listener without SASL".into()));
        }
        match self.sasl_step(&request.auth_bytes, version).await {
            Ok((token, lifetime)) => {
                SaslAuthenticateResponse::default().with_auth_bytes(token.into()).with_session_lifetime_ms(lifetime)
            }
            Err(why) => {
                let mut auth = self.auth();
                let mechanism = auth.mechanism.clone().unwrap_or_default();
                let out_of_order = !matches!(auth.state, AuthState::Authenticate { .. });
                auth.close_after_response = Some(why);
                let (code, message) = if out_of_order {
                    (ErrorCode::IllegalSaslState.code(), "Unexpected SaslAuthenticate request".to_string())
                } else {
                    (ErrorCode::SaslAuthenticationFailed.code(), crate::security::sasl::failure_message(&mechanism))
                };
                auth.state = AuthState::Handshake;
                SaslAuthenticateResponse::default().with_error_code(code).with_error_message(Some(message.into()))
            }
        }
    }

    /// A bare token after SaslHandshake v0, answered with a bare token; a failure closes the
    /// connection without an answer, as Kafka does.
    async fn raw_token(&self, frame: Bytes) -> Result<Bytes, FrameError> {
        let (token, _) = self.sasl_step(&frame, 0).await.map_err(FrameError::Authentication)?;
        let mut buf = BytesMut::with_capacity(token.len() + 4);
        buf.put_i32(token.len() as i32);
        buf.extend_from_slice(&token);
        Ok(buf.freeze())
    }
}

/// Runs a decoder: kafka-protocol's (and ours) are not written for hostile input, so a
/// panic inside one must cost this connection, not the broker.
fn decode_guarded<T, E: std::fmt::Display>(
    key: ApiKey,
    version: i16,
    budget: usize,
    decode: impl FnOnce() -> Result<T, E>,
) -> Result<T, FrameError> {
    let decode = || kafka_protocol::protocol::types::with_decode_budget(budget, decode);
    match std::panic::catch_unwind(AssertUnwindSafe(decode)) {
        Ok(Ok(decoded)) => Ok(decoded),
        Ok(Err(e)) => Err(FrameError::Malformed(key, version, e.to_string())),
        Err(_) => Err(FrameError::Malformed(key, version, "decoder panicked".into())),
    }
}

/// Whether `buf` starts with a complete size-prefixed frame (reading it cannot wait).
pub fn holds_whole_frame(buf: &[u8]) -> bool {
    match buf.get(..4) {
        Some(b) => {
            let size = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            size >= 0 && buf.len() - 4 >= size as usize
        }
        None => false,
    }
}

/// `queued.max.request.bytes` (Kafka's KIP-72 memory pool): room for the bytes of requests
/// being read and handled, over all connections. A frame takes its size from the pool once
/// its length is known and before anything is allocated, and waits while there is no room,
/// so many large frames at once queue instead of exhausting memory. A frame larger than the
/// whole pool waits for all of it.
#[derive(Clone)]
pub struct RequestMemoryPool {
    room: Option<(Arc<tokio::sync::Semaphore>, usize)>,
}

impl RequestMemoryPool {
    /// `None`: no limit (Kafka's default, -1).
    pub fn new(bytes: Option<usize>) -> RequestMemoryPool {
        let room = bytes.map(|b| {
            let b = b.min(tokio::sync::Semaphore::MAX_PERMITS).min(u32::MAX as usize);
            (Arc::new(tokio::sync::Semaphore::new(b)), b)
        });
        RequestMemoryPool { room }
    }

    async fn reserve(&self, size: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let (sem, capacity) = self.room.as_ref()?;
        // Never closed, so acquiring only fails if it was; then the pool is no limit.
        sem.clone().acquire_many_owned(size.min(*capacity) as u32).await.ok()
    }
}

/// A frame's room in the request memory pool, given back when dropped.
pub type PoolRoom = Option<tokio::sync::OwnedSemaphorePermit>;

/// One size-prefixed frame, at most `max` bytes (`socket.request.max.bytes`), with its room
/// in `pool`.
pub async fn read_frame<R: AsyncReadExt + Unpin>(
    rd: &mut R,
    max: usize,
    pool: &RequestMemoryPool,
) -> Result<(Bytes, PoolRoom), FrameError> {
    let size = match rd.read_i32().await {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    };
    if size < 0 || size as usize > max {
        return Err(FrameError::TooLarge(size as i64, max));
    }
    let size = size as usize;
    let room = pool.reserve(size).await;
    // Read into spare capacity rather than a zeroed buffer: zeroing cost as much CPU as the
    // CRC check on large produce requests.
    let mut buf = BytesMut::with_capacity(size);
    while buf.len() < size {
        let want = size - buf.len();
        if rd.read_buf(&mut (&mut buf).limit(want)).await? == 0 {
            return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
    Ok((buf.freeze(), room))
}

/// An encoded response as it goes to the socket: one buffer, or, for a Fetch, the encoded
/// fields with the record sets between them as they were read from the log (never copied into
/// the response), or as the file ranges they are to be sent from.
pub enum ResponseFrame {
    One(Bytes),
    Pieces(Vec<Piece>),
}

/// Part of a response: bytes, or a range of a segment file sent with sendfile.
pub enum Piece {
    Bytes(Bytes),
    File(FileRange),
}

impl From<Bytes> for ResponseFrame {
    fn from(b: Bytes) -> ResponseFrame {
        ResponseFrame::One(b)
    }
}

impl ResponseFrame {
    /// The response in one buffer (for callers without a socket). Fails if a file range can
    /// no longer be read whole.
    pub fn into_bytes(self) -> std::io::Result<Bytes> {
        match self {
            ResponseFrame::One(b) => Ok(b),
            ResponseFrame::Pieces(p) => {
                let mut all = BytesMut::with_capacity(p.iter().map(Piece::len).sum());
                for piece in &p {
                    match piece {
                        Piece::Bytes(b) => all.extend_from_slice(b),
                        Piece::File(range) => range.read_into_buf(&mut all)?,
                    }
                }
                Ok(all.freeze())
            }
        }
    }

    fn push_to(self, pieces: &mut Vec<Piece>) {
        match self {
            ResponseFrame::One(b) => pieces.push(Piece::Bytes(b)),
            ResponseFrame::Pieces(p) => pieces.extend(p),
        }
    }
}

impl Piece {
    fn len(&self) -> usize {
        match self {
            Piece::Bytes(b) => b.len(),
            Piece::File(r) => r.len,
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Bytes(b) => b,
            Piece::File(_) => &[],
        }
    }
}

/// Where a connection's responses are written; a plaintext TCP socket can also take file
/// ranges by sendfile.
trait ResponseSink: AsyncWrite + Unpin {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

impl ResponseSink for tokio::net::tcp::OwnedWriteHalf {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl<T: AsyncRead + AsyncWrite> ResponseSink for tokio::io::WriteHalf<T> {}

#[cfg(test)]
impl ResponseSink for Vec<u8> {}

/// At most this many buffers per `writev` (Linux's IOV_MAX is 1024).
const MAX_IOVECS: usize = 256;

/// Writes `pieces` in order, as few system calls as the socket allows: runs of bytes with
/// writev, file ranges with sendfile.
async fn write_pieces<W: ResponseSink>(wr: &mut W, pieces: &[Piece]) -> std::io::Result<()> {
    let mut rest = pieces;
    while !rest.is_empty() {
        let run = rest.iter().position(|p| matches!(p, Piece::File(_))).unwrap_or(rest.len());
        write_bytes(wr, &rest[..run]).await?;
        if let Some(Piece::File(range)) = rest.get(run) {
            send_file(wr, range).await?;
            rest = &rest[run + 1..];
        } else {
            rest = &rest[run..];
        }
    }
    Ok(())
}

/// A file range to the socket. The length was promised in the frame's size, so a range that
/// can no longer be sent whole (its segment was truncated since) fails the connection rather
/// than let the client read a malformed frame.
async fn send_file<W: ResponseSink>(wr: &mut W, range: &FileRange) -> std::io::Result<()> {
    let Some(socket) = wr.socket() else {
        // Not a plain socket (TLS): the bytes must pass through memory anyway.
        let mut buf = BytesMut::new();
        range.read_into_buf(&mut buf)?;
        return wr.write_all(&buf).await;
    };
    use std::os::fd::AsRawFd;
    let (out, file) = (socket.as_raw_fd(), range.file.as_raw_fd());
    let mut offset = range.position as libc::off_t;
    let mut left = range.len;
    while left > 0 {
        socket.writable().await?;
        let sent = socket.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the duration of the call (the socket is
            // borrowed, the file held by the range); `offset` is a valid off_t to update.
            let n = unsafe { libc::sendfile(out, file, &mut offset, left.min(1 << 30)) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match sent {
            Ok(0) => {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "segment file shrank under a fetch"))
            }
            Ok(n) => left -= n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn write_bytes<W: AsyncWrite + Unpin>(wr: &mut W, pieces: &[Piece]) -> std::io::Result<()> {
    // The first piece not fully written, and how much of it was.
    let (mut i, mut done) = (0, 0);
    let mut slices = Vec::with_capacity(pieces.len().min(MAX_IOVECS));
    while i < pieces.len() {
        if pieces[i].len() == done {
            i += 1;
            done = 0;
            continue;
        }
        if !wr.is_write_vectored() {
            wr.write_all(&pieces[i].bytes()[done..]).await?;
            i += 1;
            done = 0;
            continue;
        }
        slices.clear();
        slices.push(std::io::IoSlice::new(&pieces[i].bytes()[done..]));
        slices.extend(pieces[i + 1..].iter().take(MAX_IOVECS - 1).map(|p| std::io::IoSlice::new(p.bytes())));
        let mut n = wr.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && i < pieces.len() {
            let left = pieces[i].len() - done;
            if n >= left {
                n -= left;
                i += 1;
                done = 0;
            } else {
                done += n;
                n = 0;
            }
        }
    }
    Ok(())
}

/// Record sets smaller than this are copied into the response: a separate buffer costs more
/// than copying a few hundred bytes.
const FORWARD_MIN_BYTES: usize = 1024;

/// The protocol crate's encoders write into a `BufMut`; this one keeps the listed byte strings
/// (a Fetch's record sets) by reference. When the encoder puts exactly the next of them, what
/// was encoded so far becomes a piece and the string itself the next, uncopied.
struct ForwardingBuf {
    pieces: Vec<Bytes>,
    current: BytesMut,
    /// Bytes in `pieces`.
    behind: usize,
    /// In the order the encoder meets them.
    forward: std::vec::IntoIter<Bytes>,
    next: Option<Bytes>,
}

impl ForwardingBuf {
    fn new(forward: Vec<Bytes>) -> ForwardingBuf {
        let mut forward = forward.into_iter();
        let next = forward.next();
        ForwardingBuf { pieces: Vec::new(), current: BytesMut::with_capacity(256), behind: 0, forward, next }
    }

    fn finish(mut self) -> Vec<Bytes> {
        if !self.current.is_empty() {
            self.pieces.push(self.current.freeze());
        }
        self.pieces
    }

    /// Back to one buffer, for an encoder that goes back to fill in a gap.
    fn join(&mut self) {
        if self.pieces.is_empty() {
            return;
        }
        let mut all = BytesMut::with_capacity(self.behind + self.current.len());
        for p in self.pieces.drain(..) {
            all.extend_from_slice(&p);
        }
        all.extend_from_slice(&self.current);
        self.current = all;
        self.behind = 0;
    }
}

// SAFETY: every method hands on to `current`, a BytesMut, whose own implementation upholds
// the trait's contract; `put_slice` only adds whole pieces besides.
unsafe impl BufMut for ForwardingBuf {
    fn remaining_mut(&self) -> usize {
        self.current.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller's promise (cnt bytes of chunk_mut initialised) is about `current`.
        unsafe { self.current.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        self.current.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        let forwarded = self.next.as_ref().is_some_and(|n| n.as_ptr() == src.as_ptr() && n.len() == src.len());
        if !forwarded {
            self.current.extend_from_slice(src);
            return;
        }
        let next = std::mem::replace(&mut self.next, self.forward.next());
        if !self.current.is_empty() {
            let head = self.current.split().freeze();
            self.behind += head.len();
            self.pieces.push(head);
        }
        if let Some(n) = next {
            self.behind += n.len();
            self.pieces.push(n);
        }
    }
}

impl kafka_protocol::protocol::buf::ByteBufMut for ForwardingBuf {
    fn offset(&self) -> usize {
        self.behind + self.current.len()
    }

    fn seek(&mut self, offset: usize) {
        if offset < self.behind {
            self.join();
        }
        self.current.resize(offset - self.behind, 0);
    }

    fn range(&mut self, r: std::ops::Range<usize>) -> &mut [u8] {
        if r.start < self.behind {
            self.join();
        }
        let (start, end) = (r.start - self.behind, r.end.saturating_sub(self.behind));
        self.current.get_mut(start..end).unwrap_or_default()
    }
}

/// The record sets of a Fetch response worth sending without a copy, in encoding order:
/// every placeholder for file ranges among them.
fn forwardable(body: &ResponseKind, files: &FileRanges) -> Vec<Bytes> {
    let ResponseKind::Fetch(f) = body else { return Vec::new() };
    f.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .filter_map(|p| p.records.as_ref())
        .filter(|r| r.len() >= FORWARD_MIN_BYTES || files.holds(r))
        .cloned()
        .collect()
}

/// Err means the response could not be encoded; the connection is then closed, since the
/// client would otherwise wait for it forever.
fn encode_response(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> Result<ResponseFrame, FrameError> {
    encode_response_with_files(key, version, correlation_id, body, FileRanges::default())
}

/// As [`encode_response`], with the file ranges behind a Fetch response's placeholders put
/// in their place.
fn encode_response_with_files(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
    mut files: FileRanges,
) -> Result<ResponseFrame, FrameError> {
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    let failed = |e: anyhow::Error| {
        // Only a handler bug (a field set that this version cannot carry) gets here.
        tracing::error!(api = ?key, version, error = %e, "cannot encode response");
        FrameError::Malformed(key, version, format!("response encoding failed: {e}"))
    };
    let forward = forwardable(body, &files);
    if let (false, ResponseKind::Fetch(fetch)) = (forward.is_empty(), body) {
        let placeholders = forward.iter().filter(|b| files.holds(b)).count();
        let mut rest = ForwardingBuf::new(forward);
        fetch.encode(&mut rest, version).map_err(failed)?;
        let body_len = kafka_protocol::protocol::buf::ByteBufMut::offset(&rest);
        let mut head = BytesMut::with_capacity(32);
        head.put_i32(0);
        header.encode(&mut head, key.response_header_version(version)).map_err(failed)?;
        let len = (head.len() - 4 + body_len) as i32;
        head[..4].copy_from_slice(&len.to_be_bytes());
        let mut pieces = vec![Piece::Bytes(head.freeze())];
        let mut replaced = 0;
        for b in rest.finish() {
            match files.take(&b) {
                Some(ranges) => {
                    replaced += 1;
                    pieces.extend(ranges.into_iter().map(Piece::File));
                }
                None => pieces.push(Piece::Bytes(b)),
            }
        }
        if replaced != placeholders {
            // A placeholder was copied rather than forwarded: its zeros must not be sent.
            return Err(failed(anyhow::anyhow!("a record set to be sent from its file was copied")));
        }
        return Ok(ResponseFrame::Pieces(pieces));
    }
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    header
        .encode(&mut buf, key.response_header_version(version))
        .and_then(|_| body.encode(&mut buf, version))
        .map_err(failed)?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(ResponseFrame::One(buf.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn frame_of(bytes: &[u8], max: usize) -> Result<Bytes, FrameError> {
        let mut rd = bytes;
        read_frame(&mut rd, max, &RequestMemoryPool::new(None)).await.map(|(f, _)| f)
    }

    #[tokio::test]
    async fn frames_are_read_whole_and_bounded() {
        let mut wire = 5i32.to_be_bytes().to_vec();
        wire.extend_from_slice(b"hello");
        assert_eq!(&frame_of(&wire, 5).await.unwrap()[..], b"hello");
        // One byte over the limit, or a negative size: refused before anything is allocated.
        assert!(matches!(frame_of(&wire, 4).await, Err(FrameError::TooLarge(5, 4))));
        assert!(matches!(frame_of(&(-1i32).to_be_bytes(), 100).await, Err(FrameError::TooLarge(-1, 100))));
        // A clean close between frames, and one in the middle of a frame, are told apart.
        assert!(matches!(frame_of(&[], 100).await, Err(FrameError::Closed)));
        assert!(matches!(frame_of(&wire[..7], 100).await, Err(FrameError::Io(_))));
    }

    fn wire(len: usize) -> Vec<u8> {
        let mut w = (len as i32).to_be_bytes().to_vec();
        w.resize(4 + len, 7);
        w
    }

    #[tokio::test]
    async fn a_frame_waits_for_room_in_the_request_memory_pool() {
        let pool = RequestMemoryPool::new(Some(100));
        let (first, wire2) = (wire(80), wire(30));
        let (frame, room) = read_frame(&mut &first[..], 1000, &pool).await.unwrap();
        assert_eq!(frame.len(), 80);
        let mut rd = &wire2[..];
        let second = read_frame(&mut rd, 1000, &pool);
        tokio::pin!(second);
        // 30 more bytes do not fit beside the 80 held: the second frame is not read.
        tokio::select! {
            biased;
            _ = &mut second => panic!("a frame was read without room in the pool"),
            _ = std::future::ready(()) => {}
        }
        drop(room);
        assert_eq!(second.await.unwrap().0.len(), 30);
        // A frame larger than the whole pool waits for all of it, then is read.
        let big = wire(150);
        assert_eq!(read_frame(&mut &big[..], 1000, &pool).await.unwrap().0.len(), 150);
    }

    #[test]
    fn connection_creation_is_held_to_its_rate() {
        let bucket = TokenBucket::new(10);
        let mut b = bucket.lock().unwrap();
        let t0 = b.at;
        // One second's worth at once, then one every 100 ms.
        for _ in 0..10 {
            assert_eq!(b.take(t0), None);
        }
        let wait = b.take(t0).expect("the eleventh connection waits");
        assert!(wait > std::time::Duration::from_millis(90) && wait <= std::time::Duration::from_millis(100));
        assert_eq!(b.take(t0 + std::time::Duration::from_millis(100)), None);
        // A rate of 0 accepts nothing.
        let zero = TokenBucket::new(0);
        let mut z = zero.lock().unwrap();
        assert!(z.take(t0 + std::time::Duration::from_secs(5)).is_some());
    }

    #[test]
    fn whole_frames_are_recognised_in_a_buffer() {
        let mut wire = 3i32.to_be_bytes().to_vec();
        assert!(!holds_whole_frame(&wire[..2]));
        assert!(!holds_whole_frame(&wire));
        wire.extend_from_slice(b"abc");
        assert!(holds_whole_frame(&wire));
        assert!(!holds_whole_frame(&(-5i32).to_be_bytes()));
    }

    #[test]
    fn responses_carry_their_length_and_correlation_id() {
        let body = ResponseKind::ApiVersions(Default::default());
        let bytes = encode_response(ApiKey::ApiVersions, 0, 42, &body).unwrap().into_bytes().unwrap();
        let len = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        assert_eq!(len, bytes.len() - 4);
        assert_eq!(i32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]), 42);
    }

    #[test]
    fn fetch_record_sets_are_sent_as_they_are_not_copied() {
        use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
        let big = Bytes::from(vec![7u8; 5000]);
        let small = Bytes::from(vec![9u8; 10]);
        for version in [4, 11, 12, 16] {
            let mut topic = FetchableTopicResponse::default();
            topic.topic = kafka_protocol::messages::TopicName(kafka_protocol::protocol::StrBytes::from_static_str("t"));
            for (i, records) in [big.clone(), small.clone(), big.clone()].into_iter().enumerate() {
                let mut p = PartitionData::default();
                p.partition_index = i as i32;
                p.records = Some(records);
                topic.partitions.push(p);
            }
            let mut fetch = kafka_protocol::messages::FetchResponse::default();
            fetch.responses = vec![topic];
            let body = ResponseKind::Fetch(fetch);
            let ResponseFrame::Pieces(pieces) = encode_response(ApiKey::Fetch, version, 7, &body).unwrap() else {
                panic!("a fetch with large record sets is sent in pieces");
            };
            let forwarded = pieces.iter().filter(|p| p.bytes().as_ptr() == big.as_ptr()).count();
            assert_eq!(forwarded, 2, "both large record sets forwarded, v{version}");
            // Byte for byte what encoding into one buffer gives.
            let mut whole = BytesMut::new();
            whole.put_i32(0);
            let mut header = ResponseHeader::default();
            header.correlation_id = 7;
            header.encode(&mut whole, ApiKey::Fetch.response_header_version(version)).unwrap();
            body.encode(&mut whole, version).unwrap();
            let len = (whole.len() - 4) as i32;
            whole[..4].copy_from_slice(&len.to_be_bytes());
            assert_eq!(ResponseFrame::Pieces(pieces).into_bytes().unwrap(), whole.freeze(), "v{version}");
        }
    }

    /// A plaintext socket pair: the broker's write half and the client's end.
    async fn socket_pair() -> (tokio::net::tcp::OwnedWriteHalf, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (server.into_split().1, client)
    }

    fn segment_like(dir: &std::path::Path, len: usize) -> (std::path::PathBuf, FileRange, Vec<u8>) {
        let path = dir.join("00000000000000000000.log");
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = Arc::new(std::fs::File::open(&path).unwrap());
        (path, FileRange { file, position: 100, len: len - 100, end_offset: 0 }, data)
    }

    #[tokio::test]
    async fn file_ranges_are_sent_around_bytes_even_after_their_segment_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let (path, range, data) = segment_like(dir.path(), 3 << 20);
        // Retention deletes the segment after the response was built: the open file still reads.
        std::fs::remove_file(&path).unwrap();
        let (mut wr, mut client) = socket_pair().await;
        let pieces = vec![Piece::Bytes(Bytes::from_static(b"head")), Piece::File(range), Piece::Bytes("tail".into())];
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        write_pieces(&mut wr, &pieces).await.unwrap();
        drop(wr);
        let got = reader.await.unwrap();
        let mut want = b"head".to_vec();
        want.extend_from_slice(&data[100..]);
        want.extend_from_slice(b"tail");
        assert!(got == want, "{} bytes received, {} expected", got.len(), want.len());
    }

    #[tokio::test]
    async fn a_file_range_cut_short_by_truncation_fails_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let (path, range, _) = segment_like(dir.path(), 1 << 20);
        // A follower truncation after the response was built: the promised length cannot be sent.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
        let (mut wr, mut client) = socket_pair().await;
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let _ = client.read_to_end(&mut got).await;
            got.len()
        });
        let e = write_pieces(&mut wr, &[Piece::File(range)]).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        drop(wr);
        assert_eq!(reader.await.unwrap(), 4096 - 100, "only what the file still held");
    }

    #[tokio::test]
    async fn pieces_are_written_whole_and_in_order() {
        let pieces: Vec<Piece> =
            (0..600u32).map(|i| Piece::Bytes(Bytes::from(vec![(i % 251) as u8; (i % 7) as usize]))).collect();
        let mut out: Vec<u8> = Vec::new();
        write_pieces(&mut out, &pieces).await.unwrap();
        let want: Vec<u8> = pieces.iter().flat_map(|p| p.bytes().iter().copied()).collect();
        assert_eq!(out, want);
    }

    #[test]
    fn connection_limits_follow_a_reconfiguration() {
        let config = |pairs: &[(&str, &str)]| {
            crate::config::BrokerConfig::from_map(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
                .unwrap()
        };
        let q = ConnectionQuotas::new(&config(&[("max.connections.per.ip", "1")]));
        // Not the inter-broker listener, which max.connections and the creation rate exempt.
        let (ip, listener): (IpAddr, Arc<str>) = ("10.0.0.1".parse().unwrap(), Arc::from("CLIENT"));
        let first = q.admit(ip, &listener).unwrap();
        assert!(q.admit(ip, &listener).is_err());
        q.reconfigure(&config(&[("max.connections.per.ip", "1"), ("max.connections.per.ip.overrides", "10.0.0.1:2")]));
        let second = q.admit(ip, &listener).unwrap();
        q.reconfigure(&config(&[("max.connections", "2")]));
        assert!(q.full(&listener), "two open connections fill a broker limited to two");
        drop((first, second));
        assert!(!q.full(&listener));
        q.reconfigure(&config(&[("max.connection.creation.rate", "1")]));
        assert!(q.creation_delay(&listener).is_none());
        assert!(q.creation_delay(&listener).is_some(), "the second connection within a second waits");
    }
}
