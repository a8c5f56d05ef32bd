//! The client side of the inter-broker listener (Kafka's `ChannelBuilders.clientChannelBuilder`
//! for `inter.broker.listener.name`): every connection this broker opens to another broker
//! (follower fetches, the controller's requests, AlterPartition, ControlledShutdown) speaks
//! that listener's protocol, with that listener's `listener.name.<l>.` settings as Kafka reads
//! them: TLS verified against the truststore and presenting the keystore as the client
//! certificate, then SASL with `sasl.mechanism.inter.broker.protocol` as the user of the
//! listener's JAAS login module.
//!
//! Invariants: connecting and authenticating together never take longer than
//! `socket.connection.setup.timeout.ms`, hold no lock, and run password hashing off the async
//! workers; a connection to a dead or stopped broker therefore costs its caller one bounded
//! wait, never a stuck task.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::rustls;

use super::scram::{Mechanism, ScramClient};
use super::{listener_value, refuse, sasl, tls, MECHANISMS};
use crate::config::{BrokerConfig, ConfigError};
use crate::sync::MutexExt;

const PLAIN_LOGIN_MODULE: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";
const SCRAM_LOGIN_MODULE: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";
const SASL_HANDSHAKE_VERSION: i16 = 1;
const SASL_AUTHENTICATE_VERSION: i16 = 1;
/// The largest SASL answer read: the server-first and server-final messages are a few hundred
/// bytes; anything near this is not a SCRAM message.
const MAX_SASL_RESPONSE: usize = 64 * 1024;

/// Anything a broker connection can run over: plain TCP or TLS.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// An authenticated connection to another broker, ready for requests.
pub struct BrokerConnection {
    io: Box<dyn Io>,
    /// When the SASL session is close enough to its end (`connections.max.reauth.ms` on the
    /// other side) that the caller should connect afresh before the next request, rather than
    /// have the other broker close the connection under it (KIP-368; Kafka re-authenticates
    /// at 85-95% of the lifetime, a new connection does the same job).
    renew_at: Option<Instant>,
    /// The socket of a plaintext connection, whose bytes are the protocol's own (not TLS
    /// records, which rustls may hold partly decrypted), so that a wait for a known number of
    /// them can be left to the kernel.
    plain_fd: Option<RawFd>,
}

impl BrokerConnection {
    /// Whether the caller should drop this connection and connect again before sending.
    pub fn session_expiring(&self) -> bool {
        self.renew_at.is_some_and(|at| Instant::now() >= at)
    }

    /// Asks the kernel not to report the socket readable before `bytes` have arrived
    /// (SO_RCVLOWAT; it caps the value at half the receive buffer, and the remaining bytes of
    /// a response always come). A follower reading a response of megabytes is then woken
    /// once, not once per loopback segment: each of those wake-ups costs the sender a
    /// cross-CPU wake and the reader a context switch. No effect over TLS. Returns false if
    /// the setting was not applied.
    pub fn set_recv_low_water(&self, bytes: usize) -> bool {
        let Some(fd) = self.plain_fd else { return false };
        let value = libc::c_int::try_from(bytes.max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: `fd` belongs to the TcpStream inside `io`, which lives as long as `self`;
        // setsockopt reads exactly size_of::<c_int>() bytes from a live local.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        rc == 0
    }
}

impl AsyncRead for BrokerConnection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for BrokerConnection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.io).poll_shutdown(cx)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect: {0}")]
    Io(#[from] std::io::Error),
    #[error("connection and authentication took longer than socket.connection.setup.timeout.ms ({0:?})")]
    Timeout(Duration),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("SASL authentication as {user} with {mechanism} failed: {message}")]
    Authentication { user: String, mechanism: String, message: String },
    #[error("SASL exchange: {0}")]
    Protocol(String),
}

impl ConnectError {
    /// A refusal by the other broker (wrong credentials, untrusted certificate), as opposed to
    /// one that is down or unreachable: worth a warning, since retrying will not mend it.
    pub fn is_authentication(&self) -> bool {
        matches!(self, ConnectError::Authentication { .. } | ConnectError::Tls(_))
    }
}

#[derive(Clone)]
struct SaslCredentials {
    mechanism: String,
    user: String,
    password: String,
}

/// How this broker connects to other brokers: built once at start from its own config.
pub struct InterBrokerClient {
    listener: String,
    protocol: String,
    tls: Option<tokio_rustls::TlsConnector>,
    sasl: Option<SaslCredentials>,
    /// `socket.connection.setup.timeout.ms`: TCP connect, TLS handshake and SASL together.
    pub setup_timeout: Duration,
    /// `request.timeout.ms`: how long a request to another broker may wait for its answer.
    pub request_timeout: Duration,
    max_response: usize,
    /// Connections that finished a request, for the next one-request-at-a-time caller to the
    /// same broker (transaction verification and markers), so a transaction does not pay a
    /// TCP, TLS and SASL set-up per request.
    idle: std::sync::Mutex<HashMap<(String, u16), Vec<IdleConnection>>>,
}

/// A connection and when its last request finished.
type IdleConnection = (Instant, BrokerConnection);

/// Idle connections kept per broker: enough for the concurrent callers a coordinator has.
const MAX_IDLE_PER_BROKER: usize = 4;
/// A connection idle longer is not reused: a broker whose host vanished without closing it
/// (power loss, a network partition) would hold the next request until its timeout, where a
/// fresh connection fails within the set-up timeout.
const MAX_IDLE: Duration = Duration::from_secs(10);

impl InterBrokerClient {
    /// A client that speaks PLAINTEXT (a standalone broker, or a PLAINTEXT inter-broker
    /// listener).
    pub fn plaintext(listener: &str) -> InterBrokerClient {
        InterBrokerClient {
            listener: listener.to_string(),
            protocol: "PLAINTEXT".into(),
            tls: None,
            sasl: None,
            setup_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_response: 100 * 1024 * 1024,
            idle: Default::default(),
        }
    }

    /// An idle connection to `host:port` left by [`InterBrokerClient::give_back`], if any that
    /// is not near the end of its SASL session. The other broker may have closed it since
    /// (idle timeout, restart): a caller whose request fails on it connects afresh.
    pub fn take_idle(&self, host: &str, port: u16) -> Option<BrokerConnection> {
        let mut idle = self.idle.lock_unpoisoned();
        let conns = idle.get_mut(&(host.to_string(), port))?;
        while let Some((since, c)) = conns.pop() {
            if since.elapsed() < MAX_IDLE && !c.session_expiring() {
                return Some(c);
            }
        }
        None
    }

    /// Keeps a connection whose last request was answered in full for reuse.
    pub fn give_back(&self, host: &str, port: u16, conn: BrokerConnection) {
        if conn.session_expiring() {
            return;
        }
        let mut idle = self.idle.lock_unpoisoned();
        let conns = idle.entry((host.to_string(), port)).or_default();
        conns.retain(|(since, _)| since.elapsed() < MAX_IDLE);
        if conns.len() < MAX_IDLE_PER_BROKER {
            conns.push((Instant::now(), conn));
        }
    }

    /// Reads the inter-broker listener's settings; one that cannot be honoured (no truststore,
    /// no credentials, a mechanism gregor does not speak or the listener does not enable)
    /// stops the broker naming the key.
    pub fn from_config(config: &BrokerConfig) -> Result<InterBrokerClient, ConfigError> {
        let values = &config.values;
        let listener = config.inter_broker_listener.as_str();
        let mut client = InterBrokerClient::plaintext(listener);
        client.setup_timeout = Duration::from_millis(millis(values, "socket.connection.setup.timeout.ms", 10_000)?);
        // Parsed and checked with the other limits in config.
        client.request_timeout = config.request_timeout;
        client.max_response = config.socket_request_max_bytes;
        // Standalone, nothing connects to another broker.
        if config.zookeeper_connect.is_none() {
            return Ok(client);
        }
        let Some(ep) =
            config.advertised_listeners.iter().chain(&config.listeners).find(|e| e.listener_name == listener)
        else {
            return Ok(client);
        };
        client.protocol = ep.security_protocol().to_string();
        if matches!(client.protocol.as_str(), "SSL" | "SASL_SSL") {
            client.tls = Some(tls_connector(values, listener, &client.protocol)?);
        }
        if matches!(client.protocol.as_str(), "SASL_PLAINTEXT" | "SASL_SSL") {
            client.sasl = Some(sasl_credentials(values, listener)?);
        }
        Ok(client)
    }

    pub fn protocol(&self) -> &str {
        &self.protocol
    }

    pub fn listener(&self) -> &str {
        &self.listener
    }

    /// The principal this broker authenticates as, for logs: its SASL user (the certificate's
    /// subject on SSL is mapped by the other side).
    pub fn sasl_user(&self) -> Option<&str> {
        self.sasl.as_ref().map(|s| s.user.as_str())
    }

    /// Connects to another broker's endpoint of the inter-broker listener and authenticates,
    /// all within `socket.connection.setup.timeout.ms`.
    pub async fn connect(&self, host: &str, port: u16, client_id: &str) -> Result<BrokerConnection, ConnectError> {
        match tokio::time::timeout(self.setup_timeout, self.connect_unbounded(host, port, client_id)).await {
            Ok(r) => r,
            Err(_) => Err(ConnectError::Timeout(self.setup_timeout)),
        }
    }

    async fn connect_unbounded(
        &self,
        host: &str,
        port: u16,
        client_id: &str,
    ) -> Result<BrokerConnection, ConnectError> {
        let tcp = TcpStream::connect((host, port)).await?;
        let _ = tcp.set_nodelay(true);
        let plain_fd = self.tls.is_none().then(|| tcp.as_raw_fd());
        let mut io: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(connector) => {
                let name = rustls_pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| ConnectError::Tls(format!("{host} is not a name TLS can verify: {e}")))?;
                Box::new(connector.connect(name, tcp).await.map_err(|e| ConnectError::Tls(e.to_string()))?)
            }
        };
        let mut renew_at = None;
        if let Some(creds) = &self.sasl {
            let lifetime_ms = authenticate(&mut io, creds, client_id, self.max_response).await?;
            if lifetime_ms > 0 {
                // Kafka's client re-authenticates somewhere in 85-95% of the session; the
                // low end leaves a request time to finish.
                let ms = u64::try_from(lifetime_ms).unwrap_or(u64::MAX) / 100 * 85;
                renew_at = Some(Instant::now() + Duration::from_millis(ms));
            }
        }
        Ok(BrokerConnection { io, renew_at, plain_fd })
    }
}

fn millis(values: &BTreeMap<String, String>, key: &str, default: u64) -> Result<u64, ConfigError> {
    match values.get(key).map(|v| v.trim()) {
        None | Some("") => Ok(default),
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| refuse(key, format!("{v:?} is not a positive number of milliseconds"))),
    }
}

/// The TLS side of the client, from the listener's settings: its truststore verifies the
/// other broker's certificate (and, unless `ssl.endpoint.identification.algorithm` is empty,
/// that it names the host connected to), its keystore is the client certificate, as Kafka's
/// client presents whatever keystore it is given.
fn tls_connector(
    values: &BTreeMap<String, String>,
    listener: &str,
    protocol: &str,
) -> Result<tokio_rustls::TlsConnector, ConfigError> {
    let prefixed = |key: &str| format!("listener.name.{}.{key}", listener.to_ascii_lowercase());
    let roots = tls::trust_roots(values, listener).map_err(|e| match e {
        ConfigError::Unsupported { key, reason }
            if key == "ssl.truststore.location" && reason.contains("no truststore") =>
        {
            refuse(
                &prefixed("ssl.truststore.location"),
                format!(
                "inter-broker listener {listener} ({protocol}): this broker verifies the other brokers' certificates \
                 with a truststore (ssl.truststore.location or ssl.truststore.certificates), and none is given"
            ),
            )
        }
        other => other,
    })?;
    let provider = Arc::new(tls::crypto_provider(values, listener)?);
    let versions = tls::protocol_versions(values, listener)?;
    let verify_host = listener_value(values, listener, "ssl.endpoint.identification.algorithm")
        .map(|(_, v)| !v.is_empty())
        .unwrap_or(true);
    let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| refuse(&prefixed("ssl.truststore.location"), e.to_string()))?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| refuse("ssl.enabled.protocols", e.to_string()))?;
    let builder = if verify_host {
        builder.with_webpki_verifier(webpki)
    } else {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyHostVerifier(webpki)))
    };
    let (chain, key) = tls::keystore(values, listener, protocol)?;
    let config = builder.with_client_auth_cert(chain, key).map_err(|e| {
        refuse(
            &prefixed("ssl.keystore.location"),
            format!(
                "inter-broker listener {listener}: key and certificate do not make a usable client certificate: {e}"
            ),
        )
    })?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `ssl.endpoint.identification.algorithm=` (empty), as Kafka takes it: the certificate must
/// still chain to the truststore and be valid, but need not name the host.
#[derive(Debug)]
struct AnyHostVerifier(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for AnyHostVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &rustls_pki_types::CertificateDer<'_>,
        intermediates: &[rustls_pki_types::CertificateDer<'_>],
        server_name: &rustls_pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `sasl.mechanism.inter.broker.protocol` (Kafka's default GSSAPI is not supported, so it must
/// be set) and the user and password of the listener's login module for it, as Kafka's broker
/// takes its client credentials from `listener.name.<l>.<mechanism>.sasl.jaas.config`.
fn sasl_credentials(values: &BTreeMap<String, String>, listener: &str) -> Result<SaslCredentials, ConfigError> {
    const KEY: &str = "sasl.mechanism.inter.broker.protocol";
    let mechanism = values.get(KEY).map(|v| v.trim().to_ascii_uppercase()).unwrap_or_default();
    if mechanism.is_empty() || mechanism == "GSSAPI" {
        return Err(refuse(
            KEY,
            format!(
                "inter-broker listener {listener} uses SASL; Kafka's default mechanism GSSAPI (Kerberos) is not \
                 supported: set it to one of {}",
                MECHANISMS.join(", ")
            ),
        ));
    }
    if !MECHANISMS.contains(&mechanism.as_str()) {
        return Err(refuse(KEY, format!("{mechanism} is not supported; gregor supports {}", MECHANISMS.join(", "))));
    }
    let enabled = sasl::SaslSettings::from_config(values, listener)?;
    if !enabled.mechanisms.contains(&mechanism) {
        return Err(refuse(
            KEY,
            format!(
                "{mechanism} is not among the mechanisms listener {listener} enables ({}), so no broker would accept it",
                enabled.mechanisms.join(",")
            ),
        ));
    }
    let jaas_key =
        format!("listener.name.{}.{}.sasl.jaas.config", listener.to_ascii_lowercase(), mechanism.to_ascii_lowercase());
    let Some((found_key, modules)) = sasl::jaas_for(values, listener, &mechanism)? else {
        return Err(refuse(
            &jaas_key,
            format!("inter-broker listener {listener} authenticates with {mechanism} but no JAAS login module gives this broker's username and password"),
        ));
    };
    let class = if mechanism == "PLAIN" { PLAIN_LOGIN_MODULE } else { SCRAM_LOGIN_MODULE };
    let module = modules
        .iter()
        .find(|m| m.class == class)
        .ok_or_else(|| refuse(&found_key, format!("{mechanism} between brokers needs a {class} entry")))?;
    let (Some(user), Some(password)) = (module.options.get("username"), module.options.get("password")) else {
        return Err(refuse(
            &found_key,
            format!(
                "the {class} entry needs username and password: the credentials this broker presents to the others"
            ),
        ));
    };
    if user.is_empty() || password.is_empty() {
        return Err(refuse(&found_key, "the inter-broker username and password must not be empty"));
    }
    Ok(SaslCredentials { mechanism, user: user.clone(), password: password.clone() })
}

/// SaslHandshake then SaslAuthenticate (v1, so the server reports the session lifetime).
/// Returns the session lifetime in milliseconds (0: none).
async fn authenticate(
    io: &mut Box<dyn Io>,
    creds: &SaslCredentials,
    client_id: &str,
    max: usize,
) -> Result<i64, ConnectError> {
    let handshake = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_string(creds.mechanism.clone()));
    let resp: SaslHandshakeResponse =
        call(io, ApiKey::SaslHandshake, SASL_HANDSHAKE_VERSION, 1, client_id, &handshake, max).await?;
    if resp.error_code != 0 {
        let offered: Vec<String> = resp.mechanisms.iter().map(|m| m.to_string()).collect();
        return Err(ConnectError::Authentication {
            user: creds.user.clone(),
            mechanism: creds.mechanism.clone(),
            message: format!("SaslHandshake error {} (the broker enables {})", resp.error_code, offered.join(",")),
        });
    }
    let failed = |resp: &SaslAuthenticateResponse| ConnectError::Authentication {
        user: creds.user.clone(),
        mechanism: creds.mechanism.clone(),
        message: resp
            .error_message
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_else(|| format!("error {}", resp.error_code)),
    };
    match Mechanism::from_name(&creds.mechanism) {
        None => {
            // PLAIN (RFC 4616): no authorization id, user NUL password.
            let mut token = Vec::with_capacity(creds.user.len() + creds.password.len() + 2);
            token.push(0);
            token.extend_from_slice(creds.user.as_bytes());
            token.push(0);
            token.extend_from_slice(creds.password.as_bytes());
            let resp = sasl_step(io, 2, client_id, token, max).await?;
            if resp.error_code != 0 {
                return Err(failed(&resp));
            }
            Ok(resp.session_lifetime_ms)
        }
        Some(mechanism) => {
            let mut scram = ScramClient::new(mechanism, &creds.user, &creds.password);
            let resp = sasl_step(io, 2, client_id, scram.first(), max).await?;
            if resp.error_code != 0 {
                return Err(failed(&resp));
            }
            // PBKDF2 runs thousands of rounds: off the async workers, so that connection
            // storms (every fetcher reconnecting after a failover) cannot starve the tasks
            // that keep the ZooKeeper session alive.
            let server_first = resp.auth_bytes.to_vec();
            let (scram, client_final) = tokio::task::spawn_blocking(move || {
                let r = scram.final_message(&server_first);
                (scram, r)
            })
            .await
            .map_err(|e| ConnectError::Protocol(format!("SCRAM computation did not finish: {e}")))?;
            let client_final = client_final.map_err(ConnectError::Protocol)?;
            let resp = sasl_step(io, 3, client_id, client_final, max).await?;
            if resp.error_code != 0 {
                return Err(failed(&resp));
            }
            scram.verify_server_final(&resp.auth_bytes).map_err(|e| ConnectError::Authentication {
                user: creds.user.clone(),
                mechanism: creds.mechanism.clone(),
                message: format!("the other broker did not prove it knows the credential: {e}"),
            })?;
            Ok(resp.session_lifetime_ms)
        }
    }
}

async fn sasl_step(
    io: &mut Box<dyn Io>,
    correlation_id: i32,
    client_id: &str,
    token: Vec<u8>,
    max: usize,
) -> Result<SaslAuthenticateResponse, ConnectError> {
    let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
    call(io, ApiKey::SaslAuthenticate, SASL_AUTHENTICATE_VERSION, correlation_id, client_id, &req, max).await
}

/// One request and its answer during the SASL exchange.
async fn call<Req: Encodable, Resp: Decodable>(
    io: &mut Box<dyn Io>,
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    request: &Req,
    max: usize,
) -> Result<Resp, ConnectError> {
    let protocol = |e: anyhow::Error| ConnectError::Protocol(e.to_string());
    let mut header = RequestHeader::default();
    header.request_api_key = key as i16;
    header.request_api_version = version;
    header.correlation_id = correlation_id;
    header.client_id = Some(StrBytes::from_string(client_id.to_string()));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header.encode(&mut buf, key.request_header_version(version)).map_err(protocol)?;
    request.encode(&mut buf, version).map_err(protocol)?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    io.write_all(&buf).await?;
    io.flush().await?;
    let size = io.read_i32().await?;
    if size < 0 || size as usize > max.min(MAX_SASL_RESPONSE) {
        return Err(ConnectError::Protocol(format!("answer of {size} bytes to {key:?}")));
    }
    let mut body = vec![0u8; size as usize];
    io.read_exact(&mut body).await?;
    let mut body = Bytes::from(body);
    let rh = ResponseHeader::decode(&mut body, key.response_header_version(version)).map_err(protocol)?;
    if rh.correlation_id != correlation_id {
        return Err(ConnectError::Protocol(format!(
            "correlation id {} does not match {correlation_id}",
            rh.correlation_id
        )));
    }
    Resp::decode(&mut body, version).map_err(protocol)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(pairs: &[(&str, &str)]) -> Result<InterBrokerClient, String> {
        let mut v: Vec<(&str, &str)> = vec![
            ("zookeeper.connect", "127.0.0.1:2181"),
            ("listeners", "INTERNAL://127.0.0.1:9093,PLAINTEXT://127.0.0.1:9092"),
            ("listener.security.protocol.map", "INTERNAL:SASL_PLAINTEXT,PLAINTEXT:PLAINTEXT"),
            ("inter.broker.listener.name", "INTERNAL"),
        ];
        v.extend_from_slice(pairs);
        let overrides: Vec<String> = v.iter().map(|(k, x)| format!("{k}={x}")).collect();
        let config = BrokerConfig::load(None, &overrides, std::iter::empty()).map_err(|e| format!("config: {e}"))?;
        InterBrokerClient::from_config(&config).map_err(|e| e.to_string())
    }

    const SCRAM_JAAS: &str =
        "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"broker\" password=\"pw\";";

    #[test]
    fn credentials_come_from_the_listeners_jaas_entry_for_the_mechanism() {
        let c = load(&[
            ("sasl.enabled.mechanisms", "SCRAM-SHA-512,PLAIN"),
            ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
            ("listener.name.internal.scram-sha-512.sasl.jaas.config", SCRAM_JAAS),
            (
                "listener.name.internal.plain.sasl.jaas.config",
                "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"p\" password=\"q\" user_p=\"q\";",
            ),
        ])
        .unwrap();
        assert_eq!((c.protocol(), c.sasl_user()), ("SASL_PLAINTEXT", Some("broker")));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_naming_the_key() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("sasl.enabled.mechanisms", "SCRAM-SHA-512")], "sasl.mechanism.inter.broker.protocol: "),
            (
                &[("sasl.enabled.mechanisms", "SCRAM-SHA-512"), ("sasl.mechanism.inter.broker.protocol", "OAUTHBEARER")],
                "sasl.mechanism.inter.broker.protocol: OAUTHBEARER is not supported",
            ),
            (
                &[
                    ("sasl.enabled.mechanisms", "SCRAM-SHA-512"),
                    ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-256"),
                    ("sasl.jaas.config", SCRAM_JAAS),
                ],
                "sasl.mechanism.inter.broker.protocol: SCRAM-SHA-256 is not among the mechanisms",
            ),
            (
                &[("sasl.enabled.mechanisms", "SCRAM-SHA-512"), ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512")],
                "listener.name.internal.scram-sha-512.sasl.jaas.config: ",
            ),
            (
                &[
                    ("sasl.enabled.mechanisms", "SCRAM-SHA-512"),
                    ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
                    (
                        "listener.name.internal.scram-sha-512.sasl.jaas.config",
                        "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"broker\";",
                    ),
                ],
                "listener.name.internal.scram-sha-512.sasl.jaas.config: the org.apache.kafka.common.security.scram.ScramLoginModule entry needs username and password",
            ),
        ];
        for (pairs, want) in cases {
            let err = load(pairs).err().unwrap_or_default();
            assert!(err.starts_with(want), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn a_plaintext_or_standalone_broker_connects_in_the_clear() {
        let c = load(&[("listener.security.protocol.map", "INTERNAL:PLAINTEXT,PLAINTEXT:PLAINTEXT")]).unwrap();
        assert_eq!(c.protocol(), "PLAINTEXT");
        let config =
            BrokerConfig::load(None, &["listeners=SASL_SSL://127.0.0.1:9093".to_string()], std::iter::empty()).unwrap();
        assert_eq!(InterBrokerClient::from_config(&config).unwrap().protocol(), "PLAINTEXT");
    }
}
