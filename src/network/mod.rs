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

mod authentication;
mod quotas;
mod response;

use quotas::Admitted;
pub use quotas::ConnectionQuotas;
use response::{encode_response, encode_response_with_files, write_pieces, ResponseSink};
pub use response::{Piece, ResponseFrame};

use crate::api::Components;
use crate::api::{self, RequestContext};
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

pub async fn serve_listener(
    components: Arc<Components>,
    listener: TcpListener,
    listener_name: Arc<str>,
    quotas: Arc<ConnectionQuotas>,
    mut shutdown: watch::Receiver<bool>,
    tracker: TaskTracker,
) {
    let metrics = components.metrics.listener(&listener_name);
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
                    path: RequestPath::new(components.clone(), listener_name.clone(), format!("/{}", peer.ip()))
                        .with_source_port(peer.port()),
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
        let idle = self.path.components.config.connections_max_idle;
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
        let max = self.path.components.config.socket_request_max_bytes;
        let idle = self.path.components.config.connections_max_idle;
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

/// What a connection's requests are handled with: the broker's components, and who is asking
/// on which listener. Apart from the socket, so that the whole request path (decode, handle,
/// encode) can be driven in-process, as the fuzz targets do.
pub struct RequestPath {
    components: Arc<Components>,
    listener: Arc<str>,
    peer: String,
    /// What the client said about itself, and its port.
    client: Arc<api::ClientInformation>,
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
    pub fn new(components: Arc<Components>, listener: Arc<str>, peer: String) -> RequestPath {
        let security = components.security.listener(&listener);
        let state = if security.sasl.is_some() { AuthState::Handshake } else { AuthState::NotSasl };
        let auth = ConnectionAuth {
            principal: Arc::new(KafkaPrincipal::anonymous()),
            state,
            mechanism: None,
            session_expiry: None,
            close_after_response: None,
            authenticated_once: false,
        };
        let client = Arc::new(api::ClientInformation::new(None));
        RequestPath { components, listener, peer, client, sendfile: false, security, auth: Mutex::new(auth) }
    }

    /// The client's port, which client-metrics subscriptions may match on.
    pub fn with_source_port(mut self, port: u16) -> RequestPath {
        self.client = Arc::new(api::ClientInformation::new(Some(port)));
        self
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
        if api::inter_broker::is_inter_broker(raw_key) && self.components.store.is_zookeeper() {
            let response = self.process_inter_broker(raw_key, version, frame).await?;
            self.components.metrics.requests.record(raw_key, version, false, received.elapsed());
            return Ok(Some(response.into()));
        }
        let key = ApiKey::try_from(raw_key).map_err(|_| FrameError::UnknownApi(raw_key))?;
        // The controller's requests above skip the bound: they must get through however busy
        // the clients keep this broker (Kafka gives them a control-plane listener for that).
        let slot = match self.components.request_slots.clone().acquire_owned().await {
            Ok(permit) => Some((permit, self.components.metrics.handling())),
            Err(_) => None,
        };
        let supported =
            api::served_versions(&self.components, key).is_some_and(|(min, max)| (min..=max).contains(&version));
        if !supported {
            if key == ApiKey::ApiVersions {
                // Kafka answers an ApiVersions version it doesn't know in v0 form, with its
                // own list, so the client can downgrade.
                let body = ResponseKind::ApiVersions(api::api_versions_unsupported(&self.components));
                return encode_response(key, 0, correlation_id, &body).map(Some);
            }
            return Err(FrameError::UnsupportedVersion(key, version));
        }
        if api::legacy::serves(key, version) {
            return Ok(self.process_legacy(key, version, correlation_id, frame, slot).await?.map(Into::into));
        }
        let (header, request) =
            decode_guarded(key, version, self.components.config.max_decoded_bytes_per_request, || {
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
        self.components.metrics.requests.record(raw_key, version, from_follower, received.elapsed());
        Ok(response)
    }
}

impl RequestPath {
    fn context(&self, header: RequestHeader, slot: Option<api::RequestSlot>) -> RequestContext {
        RequestContext {
            components: self.components.clone(),
            listener: self.listener.clone(),
            header,
            peer: self.peer.clone(),
            slot: Arc::new(std::sync::Mutex::new(slot)),
            principal: self.principal(),
            sendfile: self.sendfile,
            file_ranges: Default::default(),
            client: self.client.clone(),
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
        let (header, request) =
            decode_guarded(key, version, self.components.config.max_decoded_bytes_per_request, || {
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
        let allowed = self.components.security.authorizer.as_ref().is_none_or(|a| {
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
            api::inter_broker::handle(&self.components, key, version, frame).instrument(span).await
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

#[cfg(test)]
mod tests;
