//! Reading and writing the classic (non-flexible) encodings by hand, for the versions the
//! protocol crate has no codec for. Every read is bounds-checked and every array's up-front
//! allocation is capped by the bytes actually left, so a frame that lies about its lengths costs
//! an error, never a panic or a huge allocation.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::StrBytes;

pub type WireResult<T> = Result<T, String>;

pub struct Reader {
    buf: Bytes,
}

impl Reader {
    pub fn new(buf: Bytes) -> Reader {
        Reader { buf }
    }

    fn need(&self, n: usize, what: &str) -> WireResult<()> {
        if self.buf.remaining() < n {
            return Err(format!("{what}: needs {n} bytes, {} left", self.buf.remaining()));
        }
        Ok(())
    }

    pub fn i8(&mut self) -> WireResult<i8> {
        self.need(1, "int8")?;
        Ok(self.buf.get_i8())
    }

    pub fn i16(&mut self) -> WireResult<i16> {
        self.need(2, "int16")?;
        Ok(self.buf.get_i16())
    }

    pub fn i32(&mut self) -> WireResult<i32> {
        self.need(4, "int32")?;
        Ok(self.buf.get_i32())
    }

    pub fn i64(&mut self) -> WireResult<i64> {
        self.need(8, "int64")?;
        Ok(self.buf.get_i64())
    }

    pub fn nullable_string(&mut self) -> WireResult<Option<StrBytes>> {
        let len = self.i16()?;
        if len < 0 {
            return Ok(None);
        }
        let len = len as usize;
        self.need(len, "string")?;
        let raw = self.buf.split_to(len);
        StrBytes::from_utf8(raw).map(Some).map_err(|e| format!("string is not UTF-8: {e}"))
    }

    pub fn string(&mut self) -> WireResult<StrBytes> {
        self.nullable_string()?.ok_or_else(|| "null where a string is required".to_string())
    }

    /// int32-length bytes; -1 is null.
    pub fn nullable_bytes(&mut self) -> WireResult<Option<Bytes>> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(None);
        }
        let len = len as usize;
        self.need(len, "bytes")?;
        Ok(Some(self.buf.split_to(len)))
    }

    /// An int32-counted array (-1, null, reads as empty: none of the old versions read here
    /// gives null a meaning of its own). `min_size` is the smallest encoding of one element.
    pub fn array<T>(&mut self, min_size: usize, mut f: impl FnMut(&mut Reader) -> WireResult<T>) -> WireResult<Vec<T>> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(Vec::new());
        }
        let n = n as usize;
        if n.saturating_mul(min_size.max(1)) > self.buf.remaining() {
            return Err(format!("array of {n} elements cannot fit in {} bytes", self.buf.remaining()));
        }
        // The same budget the protocol crate's arrays draw from (see network::decode_guarded).
        kafka_protocol::protocol::types::charge_decode(n.saturating_mul(std::mem::size_of::<T>()))
            .map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(f(self)?);
        }
        Ok(out)
    }
}

/// Classic encodings onto a buffer.
pub trait Put {
    fn string(&mut self, s: &str);
    fn nullable_string(&mut self, s: Option<&str>);
    fn nullable_bytes(&mut self, b: Option<&[u8]>);
    fn count(&mut self, n: usize);
}

impl Put for BytesMut {
    fn string(&mut self, s: &str) {
        self.nullable_string(Some(s));
    }

    fn nullable_string(&mut self, s: Option<&str>) {
        match s {
            // Longer strings cannot come from a request (their length field is an int16) nor
            // from this broker's own names; truncating beats a length that lies.
            Some(s) => {
                let b = &s.as_bytes()[..s.len().min(i16::MAX as usize)];
                self.put_i16(b.len() as i16);
                self.put_slice(b);
            }
            None => self.put_i16(-1),
        }
    }

    fn nullable_bytes(&mut self, b: Option<&[u8]>) {
        match b {
            Some(b) => {
                self.put_i32(b.len() as i32);
                self.put_slice(b);
            }
            None => self.put_i32(-1),
        }
    }

    fn count(&mut self, n: usize) {
        self.put_i32(n as i32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounded() {
        let mut r = Reader::new(Bytes::from_static(&[0, 5, b'a']));
        assert!(r.string().is_err());
        // An array claiming 2^31-1 elements in 4 bytes is refused before allocating.
        let mut r = Reader::new(Bytes::from_static(&[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0]));
        assert!(r.array(4, |r| r.i32()).is_err());
        let mut r = Reader::new(Bytes::from_static(&[0xff, 0xff, 0xff, 0xff]));
        assert_eq!(r.array(4, |r| r.i32()).unwrap(), Vec::<i32>::new());
        let mut r = Reader::new(Bytes::from_static(&[0xff, 0xff]));
        assert_eq!(r.nullable_string().unwrap(), None);
    }

    #[test]
    fn writes_round_trip() {
        let mut b = BytesMut::new();
        b.string("topic");
        b.nullable_string(None);
        b.nullable_bytes(Some(b"xy"));
        b.count(2);
        let mut r = Reader::new(b.freeze());
        assert_eq!(r.string().unwrap().as_str(), "topic");
        assert_eq!(r.nullable_string().unwrap(), None);
        assert_eq!(r.nullable_bytes().unwrap().as_deref(), Some(&b"xy"[..]));
        assert_eq!(r.i32().unwrap(), 2);
    }
}
