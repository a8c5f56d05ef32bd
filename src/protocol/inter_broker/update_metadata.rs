//! UpdateMetadata (api key 6), versions 0-8, flexible from 6. Schemas:
//! `UpdateMetadataRequest.json`, `UpdateMetadataResponse.json`.

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::*;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateMetadataRequest {
    pub controller_id: i32,
    /// v8+.
    pub is_kraft_controller: bool,
    /// Kafka's `Type`: a tagged field (tag 0) in v8+, 0 unknown, 1 incremental, 2 full.
    pub request_type: i8,
    pub controller_epoch: i32,
    /// v5+; -1 when decoded from older versions.
    pub broker_epoch: i64,
    pub topics: Vec<UpdateMetadataTopicState>,
    pub live_brokers: Vec<UpdateMetadataBroker>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateMetadataTopicState {
    pub topic_name: String,
    /// v7+; nil when decoded from older versions.
    pub topic_id: Uuid,
    pub partitions: Vec<UpdateMetadataPartitionState>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateMetadataPartitionState {
    pub partition_index: i32,
    pub controller_epoch: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub isr: Vec<i32>,
    pub zk_version: i32,
    pub replicas: Vec<i32>,
    /// v4+.
    pub offline_replicas: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateMetadataBroker {
    pub id: i32,
    /// v0 carries exactly one (host and port only); v1+ an array.
    pub endpoints: Vec<UpdateMetadataEndpoint>,
    /// v2+; `None` when decoded from older versions.
    pub rack: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateMetadataEndpoint {
    pub port: i32,
    pub host: String,
    /// v3+. Older versions name the listener after its security protocol, as Kafka does.
    pub listener: String,
    /// v1+; 0 (PLAINTEXT) when decoded from v0.
    pub security_protocol: i16,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateMetadataResponse {
    pub error_code: i16,
}

/// Tag of the request's `Type` field in v8+.
const TYPE_TAG: u32 = 0;

/// Fewest bytes a partition state can take: five i32s; used to bound array counts.
const MIN_PARTITION_STATE: usize = 20;

/// Kafka's default listener name for a security protocol id, used by versions without one.
fn listener_for_security_protocol(security_protocol: i16) -> &'static str {
    match security_protocol {
        0 => "PLAINTEXT",
        1 => "SSL",
        2 => "SASL_PLAINTEXT",
        3 => "SASL_SSL",
        _ => "",
    }
}

fn encode_partition_state(
    buf: &mut BytesMut,
    version: i16,
    flex: bool,
    topic_name: Option<&str>,
    p: &UpdateMetadataPartitionState,
) -> Result<(), CodecError> {
    if let Some(name) = topic_name {
        put_string(buf, flex, name)?;
    }
    buf.put_i32(p.partition_index);
    buf.put_i32(p.controller_epoch);
    buf.put_i32(p.leader);
    buf.put_i32(p.leader_epoch);
    put_i32_array(buf, flex, &p.isr)?;
    buf.put_i32(p.zk_version);
    put_i32_array(buf, flex, &p.replicas)?;
    if version >= 4 {
        put_i32_array(buf, flex, &p.offline_replicas)?;
    }
    put_tagged_fields_if(buf, flex);
    Ok(())
}

fn decode_partition_state(
    buf: &mut Bytes,
    version: i16,
    flex: bool,
) -> Result<(Option<String>, UpdateMetadataPartitionState), CodecError> {
    let topic_name = if version <= 4 { Some(get_string(buf, flex)?) } else { None };
    let mut p = UpdateMetadataPartitionState {
        partition_index: get_i32(buf)?,
        controller_epoch: get_i32(buf)?,
        leader: get_i32(buf)?,
        leader_epoch: get_i32(buf)?,
        isr: get_i32_array(buf, flex)?,
        zk_version: get_i32(buf)?,
        replicas: get_i32_array(buf, flex)?,
        offline_replicas: Vec::new(),
    };
    if version >= 4 {
        p.offline_replicas = get_i32_array(buf, flex)?;
    }
    end_struct(buf, flex)?;
    Ok((topic_name, p))
}

fn encode_broker(buf: &mut BytesMut, version: i16, flex: bool, b: &UpdateMetadataBroker) -> Result<(), CodecError> {
    buf.put_i32(b.id);
    if version == 0 {
        let Some(endpoint) = b.endpoints.first() else {
            return Err(CodecError::Unencodable(format!("UpdateMetadata v0 needs an endpoint for broker {}", b.id)));
        };
        put_string(buf, flex, &endpoint.host)?;
        buf.put_i32(endpoint.port);
    } else {
        put_array(buf, flex, &b.endpoints, |buf, e| {
            buf.put_i32(e.port);
            put_string(buf, flex, &e.host)?;
            if version >= 3 {
                put_string(buf, flex, &e.listener)?;
            }
            buf.put_i16(e.security_protocol);
            put_tagged_fields_if(buf, flex);
            Ok(())
        })?;
    }
    if version >= 2 {
        put_nullable_string(buf, flex, b.rack.as_deref())?;
    }
    put_tagged_fields_if(buf, flex);
    Ok(())
}

fn decode_broker(buf: &mut Bytes, version: i16, flex: bool) -> Result<UpdateMetadataBroker, CodecError> {
    let id = get_i32(buf)?;
    let endpoints = if version == 0 {
        let host = get_string(buf, flex)?;
        let port = get_i32(buf)?;
        vec![UpdateMetadataEndpoint {
            port,
            host,
            listener: listener_for_security_protocol(0).into(),
            security_protocol: 0,
        }]
    } else {
        get_array(buf, flex, 7, |buf| {
            let port = get_i32(buf)?;
            let host = get_string(buf, flex)?;
            let listener = if version >= 3 { Some(get_string(buf, flex)?) } else { None };
            let security_protocol = get_i16(buf)?;
            end_struct(buf, flex)?;
            Ok(UpdateMetadataEndpoint {
                port,
                host,
                listener: listener.unwrap_or_else(|| listener_for_security_protocol(security_protocol).into()),
                security_protocol,
            })
        })?
    };
    let rack = if version >= 2 { get_nullable_string(buf, flex)? } else { None };
    end_struct(buf, flex)?;
    Ok(UpdateMetadataBroker { id, endpoints, rack })
}

impl Message for UpdateMetadataRequest {
    const API_KEY: i16 = UPDATE_METADATA;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        buf.put_i32(self.controller_id);
        if version >= 8 {
            put_bool(buf, self.is_kraft_controller);
        }
        buf.put_i32(self.controller_epoch);
        if version >= 5 {
            buf.put_i64(self.broker_epoch);
        }
        if version <= 4 {
            let flat: Vec<(&str, &UpdateMetadataPartitionState)> =
                self.topics.iter().flat_map(|t| t.partitions.iter().map(|p| (t.topic_name.as_str(), p))).collect();
            put_array(buf, flex, &flat, |buf, (name, p)| encode_partition_state(buf, version, flex, Some(name), p))?;
        } else {
            put_array(buf, flex, &self.topics, |buf, t| {
                put_string(buf, flex, &t.topic_name)?;
                if version >= 7 {
                    put_uuid(buf, &t.topic_id);
                }
                put_array(buf, flex, &t.partitions, |buf, p| encode_partition_state(buf, version, flex, None, p))?;
                put_tagged_fields_if(buf, flex);
                Ok(())
            })?;
        }
        put_array(buf, flex, &self.live_brokers, |buf, b| encode_broker(buf, version, flex, b))?;
        // Kafka writes a tagged field only when it differs from its default (0).
        if version >= 8 && self.request_type != 0 {
            put_uvarint(buf, 1);
            put_uvarint(buf, TYPE_TAG);
            put_uvarint(buf, 1);
            buf.put_i8(self.request_type);
        } else {
            put_tagged_fields_if(buf, flex);
        }
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let mut req = UpdateMetadataRequest { controller_id: get_i32(buf)?, broker_epoch: -1, ..Default::default() };
        if version >= 8 {
            req.is_kraft_controller = get_bool(buf)?;
        }
        req.controller_epoch = get_i32(buf)?;
        if version >= 5 {
            req.broker_epoch = get_i64(buf)?;
        }
        if version <= 4 {
            let flat = get_array(buf, flex, MIN_PARTITION_STATE, |buf| {
                let (name, p) = decode_partition_state(buf, version, flex)?;
                Ok((name.unwrap_or_default(), p))
            })?;
            req.topics = group_by_key(flat)
                .into_iter()
                .map(|(topic_name, partitions)| UpdateMetadataTopicState {
                    topic_name,
                    topic_id: Uuid::nil(),
                    partitions,
                })
                .collect();
        } else {
            req.topics = get_array(buf, flex, 2, |buf| {
                let topic_name = get_string(buf, flex)?;
                let topic_id = if version >= 7 { get_uuid(buf)? } else { Uuid::nil() };
                let partitions =
                    get_array(buf, flex, MIN_PARTITION_STATE, |buf| Ok(decode_partition_state(buf, version, flex)?.1))?;
                end_struct(buf, flex)?;
                Ok(UpdateMetadataTopicState { topic_name, topic_id, partitions })
            })?;
        }
        req.live_brokers = get_array(buf, flex, 5, |buf| decode_broker(buf, version, flex))?;
        if flex {
            let mut request_type = 0;
            get_tagged_fields(buf, |tag, mut value| {
                if version >= 8 && tag == TYPE_TAG {
                    if value.len() != 1 {
                        return Err(CodecError::InvalidTaggedField { tag, why: "Type must be one byte" });
                    }
                    request_type = get_i8(&mut value)?;
                }
                Ok(())
            })?;
            req.request_type = request_type;
        }
        Ok(req)
    }
}

impl Message for UpdateMetadataResponse {
    const API_KEY: i16 = UPDATE_METADATA;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        buf.put_i16(self.error_code);
        put_tagged_fields_if(buf, flex);
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let error_code = get_i16(buf)?;
        end_struct(buf, flex)?;
        Ok(UpdateMetadataResponse { error_code })
    }
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::golden::Frame;
    use super::*;

    const TOPIC_ID: u128 = 0xfedc_ba98_7654_3210_0123_4567_89ab_cdef;

    fn request(version: i16) -> UpdateMetadataRequest {
        let v = |since: i16| version >= since;
        let state = |partition_index: i32| UpdateMetadataPartitionState {
            partition_index,
            controller_epoch: 4,
            leader: 1,
            leader_epoch: 6,
            isr: vec![1, 2],
            zk_version: 8,
            replicas: vec![1, 2, 3],
            offline_replicas: if v(4) { vec![3] } else { vec![] },
        };
        let endpoint = |port: i32, host: &str, listener: &str, security_protocol: i16| UpdateMetadataEndpoint {
            port,
            host: host.into(),
            listener: listener.into(),
            security_protocol,
        };
        let first_endpoints = if v(1) {
            vec![
                endpoint(9092, "h1", "PLAINTEXT", 0),
                endpoint(9093, "h1", if v(3) { "INTERNAL" } else { "SASL_SSL" }, 3),
            ]
        } else {
            vec![endpoint(9092, "h1", "PLAINTEXT", 0)]
        };
        UpdateMetadataRequest {
            controller_id: 1,
            is_kraft_controller: v(8),
            request_type: if v(8) { 2 } else { 0 },
            controller_epoch: 4,
            broker_epoch: if v(5) { 0x7fff_0000_0001 } else { -1 },
            topics: vec![
                UpdateMetadataTopicState {
                    topic_name: "alpha".into(),
                    topic_id: if v(7) { Uuid::from_u128(TOPIC_ID) } else { Uuid::nil() },
                    partitions: vec![state(0), state(1)],
                },
                UpdateMetadataTopicState { topic_name: "b".into(), topic_id: Uuid::nil(), partitions: vec![state(2)] },
            ],
            live_brokers: vec![
                UpdateMetadataBroker {
                    id: 1,
                    endpoints: first_endpoints,
                    rack: if v(2) { Some("rack-a".into()) } else { None },
                },
                UpdateMetadataBroker { id: 2, endpoints: vec![endpoint(19092, "h2", "PLAINTEXT", 0)], rack: None },
            ],
        }
    }

    fn request_frame(version: i16) -> Vec<u8> {
        let v = |since: i16| version >= since;
        let mut f = Frame::new(v(6));
        f.i32(1);
        if v(8) {
            f.bool(true);
        }
        f.i32(4);
        if v(5) {
            f.i64(0x7fff_0000_0001);
        }
        let state = |f: &mut Frame, topic: Option<&str>, partition_index: i32| {
            if let Some(name) = topic {
                f.str(name);
            }
            f.i32(partition_index).i32(4).i32(1).i32(6);
            f.i32s(&[1, 2]).i32(8).i32s(&[1, 2, 3]);
            if v(4) {
                f.i32s(&[3]);
            }
            f.tags();
        };
        if !v(5) {
            f.arr(3);
            state(&mut f, Some("alpha"), 0);
            state(&mut f, Some("alpha"), 1);
            state(&mut f, Some("b"), 2);
        } else {
            f.arr(2);
            f.str("alpha");
            if v(7) {
                f.uuid(TOPIC_ID);
            }
            f.arr(2);
            state(&mut f, None, 0);
            state(&mut f, None, 1);
            f.tags();
            f.str("b");
            if v(7) {
                f.uuid(0);
            }
            f.arr(1);
            state(&mut f, None, 2);
            f.tags();
        }
        f.arr(2);
        // Broker 1.
        f.i32(1);
        if !v(1) {
            f.str("h1").i32(9092);
        } else {
            f.arr(2);
            f.i32(9092).str("h1");
            if v(3) {
                f.str("PLAINTEXT");
            }
            f.i16(0).tags();
            f.i32(9093).str("h1");
            if v(3) {
                f.str("INTERNAL");
            }
            f.i16(3).tags();
        }
        if v(2) {
            f.str("rack-a");
        }
        f.tags();
        // Broker 2, with a null rack.
        f.i32(2);
        if !v(1) {
            f.str("h2").i32(19092);
        } else {
            f.arr(1).i32(19092).str("h2");
            if v(3) {
                f.str("PLAINTEXT");
            }
            f.i16(0).tags();
        }
        if v(2) {
            f.null_str();
        }
        f.tags();
        if v(8) {
            // One tagged field: tag 0 (Type), one byte, value 2.
            f.varint(1).varint(0).varint(1).i8(2);
        } else {
            f.tags();
        }
        f.bytes
    }

    #[test]
    fn request_golden_every_version() {
        for version in 0..=8 {
            check::golden(&request(version), version, &request_frame(version));
        }
    }

    #[test]
    fn v8_default_type_writes_no_tagged_field_and_unknown_tags_are_skipped() {
        let mut req = request(8);
        req.request_type = 0;
        let mut out = BytesMut::new();
        req.encode(&mut out, 8).unwrap();
        assert_eq!(out.last(), Some(&0));
        // Replace the empty section with tag 0 = 1 and tag 5 (unknown, skipped).
        let mut frame = out[..out.len() - 1].to_vec();
        frame.extend_from_slice(&[2, 0, 1, 1, 5, 2, 0xaa, 0xbb]);
        let decoded = UpdateMetadataRequest::decode(&mut Bytes::from(frame), 8).unwrap();
        assert_eq!(decoded.request_type, 1);
        // A Type of the wrong size is rejected.
        let mut frame = out[..out.len() - 1].to_vec();
        frame.extend_from_slice(&[1, 0, 2, 1, 1]);
        assert!(matches!(
            UpdateMetadataRequest::decode(&mut Bytes::from(frame), 8),
            Err(CodecError::InvalidTaggedField { tag: 0, .. })
        ));
    }

    #[test]
    fn v0_needs_an_endpoint() {
        let mut req = request(0);
        req.live_brokers[1].endpoints.clear();
        assert!(matches!(req.encode(&mut BytesMut::new(), 0), Err(CodecError::Unencodable(_))));
    }

    #[test]
    fn response_golden_every_version() {
        for version in 0..=8 {
            let mut f = Frame::new(version >= 6);
            f.i16(41).tags();
            check::golden(&UpdateMetadataResponse { error_code: 41 }, version, &f.bytes);
        }
        check::golden(&UpdateMetadataResponse { error_code: 1 }, 5, &[0, 1]);
        check::golden(&UpdateMetadataResponse { error_code: 1 }, 6, &[0, 1, 0]);
    }

    #[test]
    fn large_request_round_trips() {
        let mut req = request(8);
        req.topics[1].partitions = (0..1000)
            .map(|i| UpdateMetadataPartitionState {
                partition_index: i,
                leader: i % 3,
                isr: vec![i % 3],
                replicas: vec![i % 3, (i + 1) % 3],
                offline_replicas: vec![(i + 1) % 3],
                ..Default::default()
            })
            .collect();
        check::round_trip(&req, 8);
    }

    #[test]
    fn malformed() {
        check::unsupported_versions::<UpdateMetadataRequest>(8);
        check::unsupported_versions::<UpdateMetadataResponse>(8);
        let mut f = Frame::new(false);
        f.i32(1).i32(2).i32(0).i32(i32::MAX).i32(1);
        let mut input = Bytes::from(f.bytes);
        assert!(matches!(UpdateMetadataRequest::decode(&mut input, 4), Err(CodecError::InvalidLength { .. })));
        // A compact rack length far past the end.
        let mut f = Frame::new(true);
        f.i32(1).bool(false).i32(2).i64(3).arr(0).arr(1).i32(1).arr(0);
        f.varint(u64::from(u32::MAX));
        let mut input = Bytes::from(f.bytes);
        assert!(UpdateMetadataRequest::decode(&mut input, 8).is_err());
    }
}
