//! Requests the transaction coordinator sends to other brokers (verify-only
//! AddPartitionsToTxn, WriteTxnMarkers), over the inter-broker listener's protocol with a
//! small pool of idle connections.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Partitions grouped by topic, topics in first-seen order, as requests to other brokers
/// list them.
pub(super) fn by_topic(tps: &[(String, i32)]) -> Vec<(TopicName, Vec<i32>)> {
    let mut out: Vec<(TopicName, Vec<i32>)> = Vec::new();
    for (t, p) in tps {
        match out.iter_mut().find(|(name, _)| name.0.as_str() == t) {
            Some((_, parts)) => parts.push(*p),
            None => out.push((TopicName(StrBytes::from_string(t.clone())), vec![*p])),
        }
    }
    out
}

/// One request on an idle connection to the broker if there is one, else on a new one. A
/// failure on a reused connection is taken for one the other side closed while it was idle,
/// and the request goes once more on a fresh connection: both requests sent this way may
/// arrive twice (a verify-only question, a marker a leader writes again harmlessly).
#[allow(clippy::too_many_arguments)]
pub async fn pooled_round_trip<Req, Resp>(
    connector: &crate::security::client::InterBrokerClient,
    host: &str,
    port: u16,
    client_id: &str,
    api_key: kafka_protocol::messages::ApiKey,
    version: i16,
    req: &Req,
    max: usize,
) -> anyhow::Result<Resp>
where
    Req: Encodable + HeaderVersion,
    Resp: Decodable + HeaderVersion,
{
    if let Some(mut stream) = connector.take_idle(host, port) {
        if let Ok(resp) = round_trip(&mut stream, client_id, api_key, version, req, max).await {
            connector.give_back(host, port, stream);
            return Ok(resp);
        }
    }
    let mut stream = connector.connect(host, port, client_id).await?;
    let resp = round_trip(&mut stream, client_id, api_key, version, req, max).await?;
    connector.give_back(host, port, stream);
    Ok(resp)
}

async fn round_trip<S, Req, Resp>(
    stream: &mut S,
    client_id: &str,
    api_key: kafka_protocol::messages::ApiKey,
    version: i16,
    req: &Req,
    max: usize,
) -> anyhow::Result<Resp>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    Req: Encodable + HeaderVersion,
    Resp: Decodable + HeaderVersion,
{
    let mut header = RequestHeader::default();
    header.request_api_key = api_key as i16;
    header.request_api_version = version;
    header.correlation_id = 1;
    header.client_id = Some(StrBytes::from_string(client_id.to_string()));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header.encode(&mut buf, Req::header_version(version))?;
    req.encode(&mut buf, version)?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    stream.write_all(&buf).await?;
    // TLS holds written bytes in its session buffer until flushed.
    stream.flush().await?;
    let size = stream.read_i32().await?;
    if size < 0 || size as usize > max {
        anyhow::bail!("response of {size} bytes");
    }
    let mut body = vec![0u8; size as usize];
    stream.read_exact(&mut body).await?;
    let mut body = Bytes::from(body);
    let h = ResponseHeader::decode(&mut body, Resp::header_version(version))?;
    if h.correlation_id != 1 {
        anyhow::bail!("unexpected correlation id {}", h.correlation_id);
    }
    Resp::decode(&mut body, version)
}
