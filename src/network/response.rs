//! Writing responses: a response as buffers and file ranges, written with writev and
//! sendfile, and the encoding that leaves a fetch's record sets uncopied.

use super::*;

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

    pub(super) fn push_to(self, pieces: &mut Vec<Piece>) {
        match self {
            ResponseFrame::One(b) => pieces.push(Piece::Bytes(b)),
            ResponseFrame::Pieces(p) => pieces.extend(p),
        }
    }
}

impl Piece {
    pub(super) fn len(&self) -> usize {
        match self {
            Piece::Bytes(b) => b.len(),
            Piece::File(r) => r.len,
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Piece::Bytes(b) => b,
            Piece::File(_) => &[],
        }
    }
}

/// Where a connection's responses are written; a plaintext TCP socket can also take file
/// ranges by sendfile.
pub(super) trait ResponseSink: AsyncWrite + Unpin {
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
pub(super) async fn write_pieces<W: ResponseSink>(wr: &mut W, pieces: &[Piece]) -> std::io::Result<()> {
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
    pub(super) pieces: Vec<Bytes>,
    pub(super) current: BytesMut,
    /// Bytes in `pieces`.
    pub(super) behind: usize,
    /// In the order the encoder meets them.
    pub(super) forward: std::vec::IntoIter<Bytes>,
    pub(super) next: Option<Bytes>,
}

impl ForwardingBuf {
    pub(super) fn new(forward: Vec<Bytes>) -> ForwardingBuf {
        let mut forward = forward.into_iter();
        let next = forward.next();
        ForwardingBuf { pieces: Vec::new(), current: BytesMut::with_capacity(256), behind: 0, forward, next }
    }

    pub(super) fn finish(mut self) -> Vec<Bytes> {
        if !self.current.is_empty() {
            self.pieces.push(self.current.freeze());
        }
        self.pieces
    }

    /// Back to one buffer, for an encoder that goes back to fill in a gap.
    pub(super) fn join(&mut self) {
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
pub(super) fn encode_response(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> Result<ResponseFrame, FrameError> {
    encode_response_with_files(key, version, correlation_id, body, FileRanges::default())
}

/// As [`encode_response`], with the file ranges behind a Fetch response's placeholders put
/// in their place.
pub(super) fn encode_response_with_files(
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
