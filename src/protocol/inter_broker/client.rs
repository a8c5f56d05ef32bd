//! The wire half of an inter-broker call: one request framed with its header, one response
//! read back and checked against it. Both the controller's channels and the brokers' calls to
//! the controller (AlterPartition, ControlledShutdown) use it over whatever connection they
//! hold, so it knows nothing of how that connection was made or authenticated.

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{InterBrokerHeader, Message};

/// One request and its response on an inter-broker connection.
pub async fn round_trip<Req: Message, Resp: Message, S: AsyncRead + AsyncWrite + Unpin + ?Sized>(
    stream: &mut S,
    correlation_id: i32,
    client_id: &str,
    request: &Req,
    version: i16,
    max: usize,
) -> anyhow::Result<Resp> {
    let header = InterBrokerHeader {
        api_key: Req::API_KEY,
        api_version: version,
        correlation_id,
        client_id: Some(client_id.to_string()),
    };
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    super::encode_request_header(&header, &mut buf)?;
    request.encode(&mut buf, version)?;
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
    let got = super::decode_response_header(Req::API_KEY, version, &mut body)?;
    if got != correlation_id {
        anyhow::bail!("correlation id {got} does not match {correlation_id}");
    }
    Ok(Resp::decode(&mut body, version)?)
}
