//! Codecs for Kafka's inter-broker (ZooKeeper-mode controller) messages, which the
//! `kafka-protocol` crate no longer carries. Written from the Kafka 3.9 message schemas
//! (`clients/src/main/resources/common/message/<Name>.json`).
//!
//! The structs are flat: where Kafka regrouped a message between versions (partitions listed
//! with their topic name in old versions, grouped by topic in newer ones), the struct holds the
//! newest shape and the codec converts, so callers need not care which version is on the wire.
//!
//! Decoding never panics and never reserves more memory than the remaining input could fill:
//! every length is checked against the bytes left before anything is allocated.

pub mod alter_partition;
mod client;
pub mod controlled_shutdown;
pub mod leader_and_isr;
pub mod stop_replica;
pub mod update_metadata;

use std::collections::HashMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use uuid::Uuid;

pub use alter_partition::*;
pub use client::round_trip;
pub use controlled_shutdown::*;
pub use leader_and_isr::*;
pub use stop_replica::*;
pub use update_metadata::*;

pub const LEADER_AND_ISR: i16 = 4;
pub const STOP_REPLICA: i16 = 5;
pub const UPDATE_METADATA: i16 = 6;
pub const CONTROLLED_SHUTDOWN: i16 = 7;
pub const ALTER_PARTITION: i16 = 56;

/// (api key, min version, max version) as Kafka 3.9 in ZooKeeper mode advertises them.
pub const INTER_BROKER_APIS: &[(i16, i16, i16)] = &[
    (LEADER_AND_ISR, 0, 7),
    (STOP_REPLICA, 0, 4),
    (UPDATE_METADATA, 0, 8),
    (CONTROLLED_SHUTDOWN, 0, 3),
    (ALTER_PARTITION, 0, 3),
];

/// First flexible (compact encodings + tagged fields) version of each API, per its schema.
fn first_flexible_version(api_key: i16) -> Option<i16> {
    match api_key {
        LEADER_AND_ISR => Some(4),
        STOP_REPLICA => Some(2),
        UPDATE_METADATA => Some(6),
        CONTROLLED_SHUTDOWN => Some(3),
        ALTER_PARTITION => Some(0),
        _ => None,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("unsupported version {version} of api key {api_key}")]
    UnsupportedVersion { api_key: i16, version: i16 },
    #[error("input ends early: {needed} bytes needed, {remaining} remain")]
    Truncated { needed: usize, remaining: usize },
    #[error("invalid length {len} for {what}")]
    InvalidLength { what: &'static str, len: i64 },
    #[error("null for non-nullable {0}")]
    UnexpectedNull(&'static str),
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    #[error("unsigned varint longer than 5 bytes or above u32")]
    InvalidVarint,
    #[error("malformed tagged field {tag}: {why}")]
    InvalidTaggedField { tag: u32, why: &'static str },
    #[error("cannot encode: {0}")]
    Unencodable(String),
}

pub trait Message: Sized {
    const API_KEY: i16;
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError>;
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError>;
}

pub fn is_supported(api_key: i16, version: i16) -> bool {
    INTER_BROKER_APIS.iter().any(|&(key, min, max)| key == api_key && (min..=max).contains(&version))
}

fn check_version(api_key: i16, version: i16) -> Result<(), CodecError> {
    if is_supported(api_key, version) {
        Ok(())
    } else {
        Err(CodecError::UnsupportedVersion { api_key, version })
    }
}

/// Whether `version` of `api_key` is flexible; errors for versions Kafka 3.9 does not have.
fn flexible(api_key: i16, version: i16) -> Result<bool, CodecError> {
    check_version(api_key, version)?;
    match first_flexible_version(api_key) {
        Some(first) => Ok(version >= first),
        None => Err(CodecError::UnsupportedVersion { api_key, version }),
    }
}

/// Header versions: flexible request versions use request header v2, others v1; responses header
/// v1 when flexible else v0. The one exception is ControlledShutdown v0, which predates the client
/// id and so uses request header v0 (Kafka's generator special-cases it the same way).
/// Unknown keys and versions give -1.
pub fn request_header_version(api_key: i16, version: i16) -> i16 {
    match flexible(api_key, version) {
        Ok(true) => 2,
        Ok(false) if api_key == CONTROLLED_SHUTDOWN && version == 0 => 0,
        Ok(false) => 1,
        Err(_) => -1,
    }
}

/// See [`request_header_version`]; unknown keys and versions give -1.
pub fn response_header_version(api_key: i16, version: i16) -> i16 {
    match flexible(api_key, version) {
        Ok(true) => 1,
        Ok(false) => 0,
        Err(_) => -1,
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct InterBrokerHeader {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    /// Always `None` after decoding header v0 (ControlledShutdown v0), which has no client id.
    pub client_id: Option<String>,
}

pub fn decode_request_header(buf: &mut Bytes) -> Result<InterBrokerHeader, CodecError> {
    let api_key = get_i16(buf)?;
    let api_version = get_i16(buf)?;
    let header_version = request_header_version(api_key, api_version);
    if header_version < 0 {
        return Err(CodecError::UnsupportedVersion { api_key, version: api_version });
    }
    let correlation_id = get_i32(buf)?;
    // The header's client id stays a classic (i16-length) string even in header v2.
    let client_id = if header_version >= 1 { get_nullable_string(buf, false)? } else { None };
    if header_version >= 2 {
        skip_tagged_fields(buf)?;
    }
    Ok(InterBrokerHeader { api_key, api_version, correlation_id, client_id })
}

pub fn encode_request_header(header: &InterBrokerHeader, buf: &mut BytesMut) -> Result<(), CodecError> {
    let header_version = request_header_version(header.api_key, header.api_version);
    if header_version < 0 {
        return Err(CodecError::UnsupportedVersion { api_key: header.api_key, version: header.api_version });
    }
    buf.put_i16(header.api_key);
    buf.put_i16(header.api_version);
    buf.put_i32(header.correlation_id);
    if header_version >= 1 {
        put_nullable_string(buf, false, header.client_id.as_deref())?;
    }
    if header_version >= 2 {
        put_empty_tagged_fields(buf);
    }
    Ok(())
}

pub fn encode_response_header(
    correlation_id: i32,
    api_key: i16,
    version: i16,
    buf: &mut BytesMut,
) -> Result<(), CodecError> {
    let flex = flexible(api_key, version)?;
    buf.put_i32(correlation_id);
    put_tagged_fields_if(buf, flex);
    Ok(())
}

/// Returns the correlation id.
pub fn decode_response_header(api_key: i16, version: i16, buf: &mut Bytes) -> Result<i32, CodecError> {
    let flex = flexible(api_key, version)?;
    let correlation_id = get_i32(buf)?;
    end_struct(buf, flex)?;
    Ok(correlation_id)
}

// ---------------------------------------------------------------------------------------------
// Primitive readers. Each checks the remaining length before touching the buffer, because
// `bytes::Buf`'s getters panic on short input.

fn ensure(buf: &Bytes, needed: usize) -> Result<(), CodecError> {
    if buf.remaining() < needed {
        Err(CodecError::Truncated { needed, remaining: buf.remaining() })
    } else {
        Ok(())
    }
}

fn get_i8(buf: &mut Bytes) -> Result<i8, CodecError> {
    ensure(buf, 1)?;
    Ok(buf.get_i8())
}

fn get_bool(buf: &mut Bytes) -> Result<bool, CodecError> {
    // Kafka reads any non-zero byte as true.
    Ok(get_i8(buf)? != 0)
}

fn get_i16(buf: &mut Bytes) -> Result<i16, CodecError> {
    ensure(buf, 2)?;
    Ok(buf.get_i16())
}

fn get_i32(buf: &mut Bytes) -> Result<i32, CodecError> {
    ensure(buf, 4)?;
    Ok(buf.get_i32())
}

fn get_i64(buf: &mut Bytes) -> Result<i64, CodecError> {
    ensure(buf, 8)?;
    Ok(buf.get_i64())
}

fn get_uuid(buf: &mut Bytes) -> Result<Uuid, CodecError> {
    ensure(buf, 16)?;
    let mut raw = [0u8; 16];
    buf.copy_to_slice(&mut raw);
    Ok(Uuid::from_bytes(raw))
}

fn get_uvarint(buf: &mut Bytes) -> Result<u32, CodecError> {
    let mut value: u32 = 0;
    for i in 0..5 {
        let byte = get_i8(buf)? as u8;
        let bits = u32::from(byte & 0x7f);
        // The fifth byte may only carry the top 4 bits of a u32.
        if i == 4 && (byte & 0xf0) != 0 {
            return Err(CodecError::InvalidVarint);
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(CodecError::InvalidVarint)
}

/// A length prefix: `None` for null. Compact lengths are stored plus one, 0 meaning null.
fn get_length(buf: &mut Bytes, flex: bool, string: bool) -> Result<Option<usize>, CodecError> {
    let what = if string { "string" } else { "array" };
    let len: i64 = if flex {
        i64::from(get_uvarint(buf)?) - 1
    } else if string {
        i64::from(get_i16(buf)?)
    } else {
        i64::from(get_i32(buf)?)
    };
    match len {
        -1 => Ok(None),
        n if n < -1 => Err(CodecError::InvalidLength { what, len: n }),
        n => usize::try_from(n).map(Some).map_err(|_| CodecError::InvalidLength { what, len: n }),
    }
}

fn get_nullable_string(buf: &mut Bytes, flex: bool) -> Result<Option<String>, CodecError> {
    let Some(len) = get_length(buf, flex, true)? else {
        return Ok(None);
    };
    ensure(buf, len)?;
    let raw = buf.split_to(len);
    String::from_utf8(raw.to_vec()).map(Some).map_err(|_| CodecError::InvalidUtf8)
}

fn get_string(buf: &mut Bytes, flex: bool) -> Result<String, CodecError> {
    get_nullable_string(buf, flex)?.ok_or(CodecError::UnexpectedNull("string"))
}

/// Reads a non-nullable array whose elements each occupy at least `min_element_size` bytes on
/// the wire, so that a forged count is rejected before the vector is reserved.
fn get_array<T>(
    buf: &mut Bytes,
    flex: bool,
    min_element_size: usize,
    mut element: impl FnMut(&mut Bytes) -> Result<T, CodecError>,
) -> Result<Vec<T>, CodecError> {
    let len = get_length(buf, flex, false)?.ok_or(CodecError::UnexpectedNull("array"))?;
    let needed = len.saturating_mul(min_element_size.max(1));
    if needed > buf.remaining() {
        return Err(CodecError::InvalidLength { what: "array", len: i64::try_from(len).unwrap_or(i64::MAX) });
    }
    let mut items = Vec::with_capacity(len);
    for _ in 0..len {
        items.push(element(buf)?);
    }
    Ok(items)
}

fn get_i32_array(buf: &mut Bytes, flex: bool) -> Result<Vec<i32>, CodecError> {
    get_array(buf, flex, 4, get_i32)
}

/// Reads a tagged-field section, handing each field's tag and payload to `field`.
fn get_tagged_fields(
    buf: &mut Bytes,
    mut field: impl FnMut(u32, Bytes) -> Result<(), CodecError>,
) -> Result<(), CodecError> {
    let count = get_uvarint(buf)?;
    for _ in 0..count {
        let tag = get_uvarint(buf)?;
        let size = get_uvarint(buf)? as usize;
        ensure(buf, size)?;
        field(tag, buf.split_to(size))?;
    }
    Ok(())
}

fn skip_tagged_fields(buf: &mut Bytes) -> Result<(), CodecError> {
    get_tagged_fields(buf, |_, _| Ok(()))
}

/// The end of a struct: its tagged-field section in flexible versions, nothing otherwise.
fn end_struct(buf: &mut Bytes, flex: bool) -> Result<(), CodecError> {
    if flex {
        skip_tagged_fields(buf)
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Primitive writers.

fn put_bool(buf: &mut BytesMut, value: bool) {
    buf.put_u8(u8::from(value));
}

fn put_uuid(buf: &mut BytesMut, value: &Uuid) {
    buf.put_slice(value.as_bytes());
}

fn put_uvarint(buf: &mut BytesMut, mut value: u32) {
    while value >= 0x80 {
        buf.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

fn put_length(buf: &mut BytesMut, flex: bool, string: bool, len: Option<usize>) -> Result<(), CodecError> {
    let what = if string { "string" } else { "array" };
    let too_long = || CodecError::Unencodable(format!("{what} of length {len:?} is too long"));
    match (flex, len) {
        (true, None) => put_uvarint(buf, 0),
        (true, Some(n)) => {
            let n = u32::try_from(n).ok().and_then(|n| n.checked_add(1)).ok_or_else(too_long)?;
            put_uvarint(buf, n);
        }
        (false, None) if string => buf.put_i16(-1),
        (false, None) => buf.put_i32(-1),
        (false, Some(n)) if string => buf.put_i16(i16::try_from(n).map_err(|_| too_long())?),
        (false, Some(n)) => buf.put_i32(i32::try_from(n).map_err(|_| too_long())?),
    }
    Ok(())
}

fn put_nullable_string(buf: &mut BytesMut, flex: bool, value: Option<&str>) -> Result<(), CodecError> {
    put_length(buf, flex, true, value.map(str::len))?;
    if let Some(s) = value {
        buf.put_slice(s.as_bytes());
    }
    Ok(())
}

fn put_string(buf: &mut BytesMut, flex: bool, value: &str) -> Result<(), CodecError> {
    put_nullable_string(buf, flex, Some(value))
}

fn put_array<T>(
    buf: &mut BytesMut,
    flex: bool,
    items: &[T],
    mut element: impl FnMut(&mut BytesMut, &T) -> Result<(), CodecError>,
) -> Result<(), CodecError> {
    put_length(buf, flex, false, Some(items.len()))?;
    for item in items {
        element(buf, item)?;
    }
    Ok(())
}

fn put_i32_array(buf: &mut BytesMut, flex: bool, items: &[i32]) -> Result<(), CodecError> {
    put_array(buf, flex, items, |buf, &v| {
        buf.put_i32(v);
        Ok(())
    })
}

fn put_empty_tagged_fields(buf: &mut BytesMut) {
    put_uvarint(buf, 0);
}

fn put_tagged_fields_if(buf: &mut BytesMut, flex: bool) {
    if flex {
        put_empty_tagged_fields(buf);
    }
}

/// Groups `(key, item)` pairs by key, in order of each key's first appearance, so that the old
/// ungrouped wire forms (one topic name per partition) map onto per-topic structs.
fn group_by_key<K: Clone + Eq + std::hash::Hash, T>(pairs: Vec<(K, T)>) -> Vec<(K, Vec<T>)> {
    let mut index: HashMap<K, usize> = HashMap::new();
    let mut groups: Vec<(K, Vec<T>)> = Vec::new();
    for (key, item) in pairs {
        match index.get(&key) {
            Some(&i) => groups[i].1.push(item),
            None => {
                index.insert(key.clone(), groups.len());
                groups.push((key, vec![item]));
            }
        }
    }
    groups
}

/// Test-only writer of Kafka's primitive encodings, independent of the codec above, so that the
/// golden frames the tests build do not share the code they check.
#[cfg(test)]
pub(crate) mod golden {
    pub struct Frame {
        pub bytes: Vec<u8>,
        flex: bool,
    }

    impl Frame {
        pub fn new(flex: bool) -> Self {
            Frame { bytes: Vec::new(), flex }
        }
        pub fn i8(&mut self, v: i8) -> &mut Self {
            self.bytes.push(v as u8);
            self
        }
        pub fn bool(&mut self, v: bool) -> &mut Self {
            self.bytes.push(if v { 1 } else { 0 });
            self
        }
        pub fn i16(&mut self, v: i16) -> &mut Self {
            self.bytes.extend_from_slice(&v.to_be_bytes());
            self
        }
        pub fn i32(&mut self, v: i32) -> &mut Self {
            self.bytes.extend_from_slice(&v.to_be_bytes());
            self
        }
        pub fn i64(&mut self, v: i64) -> &mut Self {
            self.bytes.extend_from_slice(&v.to_be_bytes());
            self
        }
        pub fn uuid(&mut self, v: u128) -> &mut Self {
            self.bytes.extend_from_slice(&v.to_be_bytes());
            self
        }
        pub fn varint(&mut self, mut v: u64) -> &mut Self {
            loop {
                let low = (v % 128) as u8;
                v /= 128;
                if v == 0 {
                    self.bytes.push(low);
                    return self;
                }
                self.bytes.push(low + 128);
            }
        }
        /// An array or string length as this frame's version encodes it.
        pub fn len(&mut self, n: usize, string: bool) -> &mut Self {
            if self.flex {
                self.varint(n as u64 + 1)
            } else if string {
                self.i16(n as i16)
            } else {
                self.i32(n as i32)
            }
        }
        pub fn str(&mut self, s: &str) -> &mut Self {
            self.len(s.len(), true);
            self.bytes.extend_from_slice(s.as_bytes());
            self
        }
        pub fn null_str(&mut self) -> &mut Self {
            if self.flex {
                self.varint(0)
            } else {
                self.i16(-1)
            }
        }
        pub fn arr(&mut self, n: usize) -> &mut Self {
            self.len(n, false)
        }
        pub fn i32s(&mut self, vs: &[i32]) -> &mut Self {
            self.arr(vs.len());
            for &v in vs {
                self.i32(v);
            }
            self
        }
        /// An empty tagged-field section, in flexible versions only.
        pub fn tags(&mut self) -> &mut Self {
            if self.flex {
                self.bytes.push(0);
            }
            self
        }
    }
}

/// Shared checks every message's tests run over its golden frames.
#[cfg(test)]
pub(crate) mod check {
    use super::*;

    /// Encode gives exactly `golden`, decode of `golden` gives `value` back and consumes it all,
    /// and every strict prefix of `golden` fails to decode without panicking.
    pub fn golden<M: Message + PartialEq + std::fmt::Debug>(value: &M, version: i16, golden: &[u8]) {
        let mut out = BytesMut::new();
        value.encode(&mut out, version).expect("encode");
        assert_eq!(&out[..], golden, "encode of v{version}");
        let mut input = Bytes::copy_from_slice(golden);
        let decoded = M::decode(&mut input, version).expect("decode");
        assert_eq!(&decoded, value, "decode of v{version}");
        assert!(input.is_empty(), "v{version} left {} bytes", input.len());
        for cut in 0..golden.len() {
            let mut short = Bytes::copy_from_slice(&golden[..cut]);
            assert!(
                M::decode(&mut short, version).is_err(),
                "v{version} decoded from a {cut}-byte prefix of {}",
                golden.len()
            );
        }
    }

    pub fn round_trip<M: Message + PartialEq + std::fmt::Debug>(value: &M, version: i16) {
        let mut out = BytesMut::new();
        value.encode(&mut out, version).expect("encode");
        let mut input = out.freeze();
        let decoded = M::decode(&mut input, version).expect("decode");
        // Not assert_eq: a mismatch would print thousands of partitions twice.
        assert!(&decoded == value, "v{version} round trip differs");
        assert!(input.is_empty());
    }

    pub fn unsupported_versions<M: Message + Default>(max: i16) {
        for version in [-1, max + 1, i16::MAX] {
            let mut out = BytesMut::new();
            assert!(matches!(M::default().encode(&mut out, version), Err(CodecError::UnsupportedVersion { .. })));
            let mut input = Bytes::from_static(&[0; 64]);
            assert!(matches!(M::decode(&mut input, version), Err(CodecError::UnsupportedVersion { .. })));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_header_versions() {
        assert!(is_supported(LEADER_AND_ISR, 7));
        assert!(!is_supported(LEADER_AND_ISR, 8));
        assert!(!is_supported(ALTER_PARTITION, -1));
        assert!(!is_supported(0, 0));
        assert_eq!(request_header_version(LEADER_AND_ISR, 3), 1);
        assert_eq!(request_header_version(LEADER_AND_ISR, 4), 2);
        assert_eq!(request_header_version(STOP_REPLICA, 2), 2);
        assert_eq!(request_header_version(UPDATE_METADATA, 5), 1);
        assert_eq!(request_header_version(UPDATE_METADATA, 6), 2);
        assert_eq!(request_header_version(CONTROLLED_SHUTDOWN, 0), 0);
        assert_eq!(request_header_version(CONTROLLED_SHUTDOWN, 1), 1);
        assert_eq!(request_header_version(CONTROLLED_SHUTDOWN, 3), 2);
        assert_eq!(request_header_version(ALTER_PARTITION, 0), 2);
        assert_eq!(request_header_version(ALTER_PARTITION, 4), -1);
        assert_eq!(response_header_version(LEADER_AND_ISR, 3), 0);
        assert_eq!(response_header_version(LEADER_AND_ISR, 4), 1);
        assert_eq!(response_header_version(CONTROLLED_SHUTDOWN, 0), 0);
        assert_eq!(response_header_version(ALTER_PARTITION, 0), 1);
        assert_eq!(response_header_version(9, 0), -1);
    }

    fn header_round_trip(header: &InterBrokerHeader, expected: &[u8]) {
        let mut out = BytesMut::new();
        encode_request_header(header, &mut out).unwrap();
        assert_eq!(&out[..], expected);
        let mut input = Bytes::copy_from_slice(expected);
        assert_eq!(&decode_request_header(&mut input).unwrap(), header);
        assert!(input.is_empty());
        for cut in 0..expected.len() {
            let mut short = Bytes::copy_from_slice(&expected[..cut]);
            assert!(decode_request_header(&mut short).is_err());
        }
    }

    #[test]
    fn request_headers() {
        // v1: key, version, correlation id, i16-length client id.
        header_round_trip(
            &InterBrokerHeader {
                api_key: LEADER_AND_ISR,
                api_version: 3,
                correlation_id: 0x01020304,
                client_id: Some("ab".into()),
            },
            &[0, 4, 0, 3, 1, 2, 3, 4, 0, 2, b'a', b'b'],
        );
        // v2: as v1 plus an empty tagged-field section; null client id.
        header_round_trip(
            &InterBrokerHeader { api_key: ALTER_PARTITION, api_version: 3, correlation_id: 7, client_id: None },
            &[0, 56, 0, 3, 0, 0, 0, 7, 0xff, 0xff, 0],
        );
        // v0 (ControlledShutdown v0): no client id at all.
        header_round_trip(
            &InterBrokerHeader { api_key: CONTROLLED_SHUTDOWN, api_version: 0, correlation_id: -2, client_id: None },
            &[0, 7, 0, 0, 0xff, 0xff, 0xff, 0xfe],
        );
        // Unknown tagged fields in header v2 are skipped.
        let mut input = Bytes::from_static(&[0, 5, 0, 2, 0, 0, 0, 9, 0, 1, b'x', 1, 3, 2, 0xaa, 0xbb, 0xcc]);
        let header = decode_request_header(&mut input).unwrap();
        assert_eq!(header.client_id.as_deref(), Some("x"));
        assert_eq!(header.correlation_id, 9);
        assert_eq!(&input[..], &[0xcc]);
        // Unknown keys and versions are errors, before anything else is read.
        let mut input = Bytes::from_static(&[0, 4, 0, 8, 0, 0, 0, 1]);
        assert!(matches!(
            decode_request_header(&mut input),
            Err(CodecError::UnsupportedVersion { api_key: 4, version: 8 })
        ));
        let mut out = BytesMut::new();
        assert!(encode_request_header(&InterBrokerHeader { api_key: 3, ..Default::default() }, &mut out).is_err());
    }

    #[test]
    fn response_headers() {
        let mut out = BytesMut::new();
        encode_response_header(5, STOP_REPLICA, 1, &mut out).unwrap();
        assert_eq!(&out[..], &[0, 0, 0, 5]);
        let mut input = out.freeze();
        assert_eq!(decode_response_header(STOP_REPLICA, 1, &mut input).unwrap(), 5);
        let mut out = BytesMut::new();
        encode_response_header(6, STOP_REPLICA, 2, &mut out).unwrap();
        assert_eq!(&out[..], &[0, 0, 0, 6, 0]);
        let mut input = out.freeze();
        assert_eq!(decode_response_header(STOP_REPLICA, 2, &mut input).unwrap(), 6);
        let mut input = Bytes::from_static(&[0, 0, 0, 6]);
        assert!(decode_response_header(STOP_REPLICA, 2, &mut input).is_err());
        assert!(encode_response_header(1, STOP_REPLICA, 5, &mut BytesMut::new()).is_err());
    }

    #[test]
    fn varints() {
        for v in [0u32, 1, 127, 128, 300, 16_383, 16_384, u32::MAX] {
            let mut out = BytesMut::new();
            put_uvarint(&mut out, v);
            let mut input = out.freeze();
            assert_eq!(get_uvarint(&mut input).unwrap(), v);
            assert!(input.is_empty());
        }
        // Six bytes, or a fifth byte beyond u32, are rejected.
        let mut input = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert!(get_uvarint(&mut input).is_err());
        let mut input = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x1f]);
        assert!(get_uvarint(&mut input).is_err());
    }

    #[test]
    fn forged_lengths_are_rejected_before_allocation() {
        // i32::MAX elements of 4 bytes in an 8-byte remainder.
        let mut input = Bytes::from_static(&[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 2]);
        assert!(matches!(get_i32_array(&mut input, false), Err(CodecError::InvalidLength { .. })));
        // Compact count u32::MAX - 1.
        let mut input = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0, 0]);
        assert!(matches!(get_i32_array(&mut input, true), Err(CodecError::InvalidLength { .. })));
        // Huge compact string length.
        let mut input = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, b'a']);
        assert!(get_string(&mut input, true).is_err());
        // Negative classic lengths other than -1.
        let mut input = Bytes::from_static(&[0xff, 0xfe]);
        assert!(get_nullable_string(&mut input, false).is_err());
        let mut input = Bytes::from_static(&[0x80, 0, 0, 0]);
        assert!(get_i32_array(&mut input, false).is_err());
        // Null where Kafka's schema does not allow it.
        let mut input = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(get_i32_array(&mut input, false), Err(CodecError::UnexpectedNull(_))));
        let mut input = Bytes::from_static(&[0]);
        assert!(matches!(get_string(&mut input, true), Err(CodecError::UnexpectedNull(_))));
        // A tagged field claiming more bytes than remain.
        let mut input = Bytes::from_static(&[1, 0, 0x7f, 1, 2]);
        assert!(skip_tagged_fields(&mut input).is_err());
        // Invalid UTF-8.
        let mut input = Bytes::from_static(&[0, 1, 0xff]);
        assert!(matches!(get_string(&mut input, false), Err(CodecError::InvalidUtf8)));
    }

    #[test]
    fn grouping_keeps_first_appearance_order() {
        let groups = group_by_key(vec![("b", 1), ("a", 2), ("b", 3)]);
        assert_eq!(groups, vec![("b", vec![1, 3]), ("a", vec![2])]);
    }
}
