//! LeaderAndIsr (api key 4), versions 0-7, flexible from 4. Schemas: `LeaderAndIsrRequest.json`,
//! `LeaderAndIsrResponse.json`.

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::*;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaderAndIsrRequest {
    pub controller_id: i32,
    /// v7+.
    pub is_kraft_controller: bool,
    pub controller_epoch: i32,
    /// v2+; -1 when decoded from older versions.
    pub broker_epoch: i64,
    /// Kafka's `Type`, v5+ (0 unknown, 1 incremental, 2 full).
    pub request_type: i8,
    pub topics: Vec<LeaderAndIsrTopicState>,
    pub live_leaders: Vec<LeaderAndIsrLiveLeader>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaderAndIsrTopicState {
    pub topic_name: String,
    /// v5+; nil when decoded from older versions.
    pub topic_id: Uuid,
    pub partitions: Vec<LeaderAndIsrPartitionState>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaderAndIsrPartitionState {
    pub partition_index: i32,
    pub controller_epoch: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub isr: Vec<i32>,
    /// The partition's ZooKeeper version (Kafka renamed `ZkVersion` to `PartitionEpoch`).
    pub partition_epoch: i32,
    pub replicas: Vec<i32>,
    /// v3+.
    pub adding_replicas: Vec<i32>,
    /// v3+.
    pub removing_replicas: Vec<i32>,
    /// v1+.
    pub is_new: bool,
    /// v6+.
    pub leader_recovery_state: i8,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaderAndIsrLiveLeader {
    pub broker_id: i32,
    pub host_name: String,
    pub port: i32,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaderAndIsrResponse {
    pub error_code: i16,
    pub partition_errors: Vec<LeaderAndIsrPartitionError>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaderAndIsrPartitionError {
    /// v0-4; empty when decoded from v5+, which identify topics by id only.
    pub topic_name: String,
    /// v5+; nil when decoded from older versions.
    pub topic_id: Uuid,
    pub partition_index: i32,
    pub error_code: i16,
}

/// Fewest bytes a partition state can take: five i32s; used to bound array counts.
const MIN_PARTITION_STATE: usize = 20;

fn encode_partition_state(
    buf: &mut BytesMut,
    version: i16,
    flex: bool,
    topic_name: Option<&str>,
    p: &LeaderAndIsrPartitionState,
) -> Result<(), CodecError> {
    if let Some(name) = topic_name {
        put_string(buf, flex, name)?;
    }
    buf.put_i32(p.partition_index);
    buf.put_i32(p.controller_epoch);
    buf.put_i32(p.leader);
    buf.put_i32(p.leader_epoch);
    put_i32_array(buf, flex, &p.isr)?;
    buf.put_i32(p.partition_epoch);
    put_i32_array(buf, flex, &p.replicas)?;
    if version >= 3 {
        put_i32_array(buf, flex, &p.adding_replicas)?;
        put_i32_array(buf, flex, &p.removing_replicas)?;
    }
    if version >= 1 {
        put_bool(buf, p.is_new);
    }
    if version >= 6 {
        buf.put_i8(p.leader_recovery_state);
    }
    put_tagged_fields_if(buf, flex);
    Ok(())
}

/// Decodes a partition state, with its topic name in v0-1.
fn decode_partition_state(
    buf: &mut Bytes,
    version: i16,
    flex: bool,
) -> Result<(Option<String>, LeaderAndIsrPartitionState), CodecError> {
    let topic_name = if version <= 1 { Some(get_string(buf, flex)?) } else { None };
    let mut p = LeaderAndIsrPartitionState {
        partition_index: get_i32(buf)?,
        controller_epoch: get_i32(buf)?,
        leader: get_i32(buf)?,
        leader_epoch: get_i32(buf)?,
        isr: get_i32_array(buf, flex)?,
        partition_epoch: get_i32(buf)?,
        replicas: get_i32_array(buf, flex)?,
        ..Default::default()
    };
    if version >= 3 {
        p.adding_replicas = get_i32_array(buf, flex)?;
        p.removing_replicas = get_i32_array(buf, flex)?;
    }
    if version >= 1 {
        p.is_new = get_bool(buf)?;
    }
    if version >= 6 {
        p.leader_recovery_state = get_i8(buf)?;
    }
    end_struct(buf, flex)?;
    Ok((topic_name, p))
}

impl Message for LeaderAndIsrRequest {
    const API_KEY: i16 = LEADER_AND_ISR;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        buf.put_i32(self.controller_id);
        if version >= 7 {
            put_bool(buf, self.is_kraft_controller);
        }
        buf.put_i32(self.controller_epoch);
        if version >= 2 {
            buf.put_i64(self.broker_epoch);
        }
        if version >= 5 {
            buf.put_i8(self.request_type);
        }
        if version <= 1 {
            let flat: Vec<(&str, &LeaderAndIsrPartitionState)> =
                self.topics.iter().flat_map(|t| t.partitions.iter().map(|p| (t.topic_name.as_str(), p))).collect();
            put_array(buf, flex, &flat, |buf, (name, p)| encode_partition_state(buf, version, flex, Some(name), p))?;
        } else {
            put_array(buf, flex, &self.topics, |buf, t| {
                put_string(buf, flex, &t.topic_name)?;
                if version >= 5 {
                    put_uuid(buf, &t.topic_id);
                }
                put_array(buf, flex, &t.partitions, |buf, p| encode_partition_state(buf, version, flex, None, p))?;
                put_tagged_fields_if(buf, flex);
                Ok(())
            })?;
        }
        put_array(buf, flex, &self.live_leaders, |buf, l| {
            buf.put_i32(l.broker_id);
            put_string(buf, flex, &l.host_name)?;
            buf.put_i32(l.port);
            put_tagged_fields_if(buf, flex);
            Ok(())
        })?;
        put_tagged_fields_if(buf, flex);
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let mut req = LeaderAndIsrRequest { controller_id: get_i32(buf)?, broker_epoch: -1, ..Default::default() };
        if version >= 7 {
            req.is_kraft_controller = get_bool(buf)?;
        }
        req.controller_epoch = get_i32(buf)?;
        if version >= 2 {
            req.broker_epoch = get_i64(buf)?;
        }
        if version >= 5 {
            req.request_type = get_i8(buf)?;
        }
        if version <= 1 {
            let flat = get_array(buf, flex, MIN_PARTITION_STATE, |buf| {
                let (name, p) = decode_partition_state(buf, version, flex)?;
                Ok((name.unwrap_or_default(), p))
            })?;
            req.topics = group_by_key(flat)
                .into_iter()
                .map(|(topic_name, partitions)| LeaderAndIsrTopicState {
                    topic_name,
                    topic_id: Uuid::nil(),
                    partitions,
                })
                .collect();
        } else {
            req.topics = get_array(buf, flex, 2, |buf| {
                let topic_name = get_string(buf, flex)?;
                let topic_id = if version >= 5 { get_uuid(buf)? } else { Uuid::nil() };
                let partitions =
                    get_array(buf, flex, MIN_PARTITION_STATE, |buf| Ok(decode_partition_state(buf, version, flex)?.1))?;
                end_struct(buf, flex)?;
                Ok(LeaderAndIsrTopicState { topic_name, topic_id, partitions })
            })?;
        }
        req.live_leaders = get_array(buf, flex, 9, |buf| {
            let leader = LeaderAndIsrLiveLeader {
                broker_id: get_i32(buf)?,
                host_name: get_string(buf, flex)?,
                port: get_i32(buf)?,
            };
            end_struct(buf, flex)?;
            Ok(leader)
        })?;
        end_struct(buf, flex)?;
        Ok(req)
    }
}

impl Message for LeaderAndIsrResponse {
    const API_KEY: i16 = LEADER_AND_ISR;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        buf.put_i16(self.error_code);
        if version <= 4 {
            put_array(buf, flex, &self.partition_errors, |buf, e| {
                put_string(buf, flex, &e.topic_name)?;
                buf.put_i32(e.partition_index);
                buf.put_i16(e.error_code);
                put_tagged_fields_if(buf, flex);
                Ok(())
            })?;
        } else {
            let by_topic = group_by_key(self.partition_errors.iter().map(|e| (e.topic_id, e)).collect());
            put_array(buf, flex, &by_topic, |buf, (topic_id, errors)| {
                put_uuid(buf, topic_id);
                put_array(buf, flex, errors, |buf, e| {
                    buf.put_i32(e.partition_index);
                    buf.put_i16(e.error_code);
                    put_tagged_fields_if(buf, flex);
                    Ok(())
                })?;
                put_tagged_fields_if(buf, flex);
                Ok(())
            })?;
        }
        put_tagged_fields_if(buf, flex);
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let error_code = get_i16(buf)?;
        let partition_errors = if version <= 4 {
            get_array(buf, flex, 7, |buf| {
                let e = LeaderAndIsrPartitionError {
                    topic_name: get_string(buf, flex)?,
                    topic_id: Uuid::nil(),
                    partition_index: get_i32(buf)?,
                    error_code: get_i16(buf)?,
                };
                end_struct(buf, flex)?;
                Ok(e)
            })?
        } else {
            let topics = get_array(buf, flex, 18, |buf| {
                let topic_id = get_uuid(buf)?;
                let errors = get_array(buf, flex, 6, |buf| {
                    let e = LeaderAndIsrPartitionError {
                        topic_name: String::new(),
                        topic_id,
                        partition_index: get_i32(buf)?,
                        error_code: get_i16(buf)?,
                    };
                    end_struct(buf, flex)?;
                    Ok(e)
                })?;
                end_struct(buf, flex)?;
                Ok(errors)
            })?;
            topics.into_iter().flatten().collect()
        };
        end_struct(buf, flex)?;
        Ok(LeaderAndIsrResponse { error_code, partition_errors })
    }
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::golden::Frame;
    use super::*;

    const TOPIC_ID: u128 = 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff;

    /// A request using every field, as decoding at `version` gives it back: fields the version
    /// lacks hold their decode-time defaults.
    fn request(version: i16) -> LeaderAndIsrRequest {
        let v = |since: i16| version >= since;
        let state = |partition_index: i32, leader: i32| LeaderAndIsrPartitionState {
            partition_index,
            controller_epoch: 3,
            leader,
            leader_epoch: 11,
            isr: vec![leader, 2],
            partition_epoch: 21,
            replicas: vec![leader, 2, 3],
            adding_replicas: if v(3) { vec![3] } else { vec![] },
            removing_replicas: if v(3) { vec![9, 8] } else { vec![] },
            is_new: v(1),
            leader_recovery_state: if v(6) { 1 } else { 0 },
        };
        LeaderAndIsrRequest {
            controller_id: 1,
            is_kraft_controller: v(7),
            controller_epoch: 3,
            broker_epoch: if v(2) { 0x0102_0304_0506 } else { -1 },
            request_type: if v(5) { 2 } else { 0 },
            topics: vec![
                LeaderAndIsrTopicState {
                    topic_name: "alpha".into(),
                    topic_id: if v(5) { Uuid::from_u128(TOPIC_ID) } else { Uuid::nil() },
                    partitions: vec![state(0, 1), state(1, 2)],
                },
                LeaderAndIsrTopicState { topic_name: "b".into(), topic_id: Uuid::nil(), partitions: vec![state(4, 3)] },
            ],
            live_leaders: vec![
                LeaderAndIsrLiveLeader { broker_id: 1, host_name: "h1".into(), port: 9092 },
                LeaderAndIsrLiveLeader { broker_id: 3, host_name: "host-3".into(), port: 9093 },
            ],
        }
    }

    /// The request's frame, written field by field in schema order.
    fn request_frame(version: i16) -> Vec<u8> {
        let v = |since: i16| version >= since;
        let req = request(version);
        let mut f = Frame::new(v(4));
        f.i32(1);
        if v(7) {
            f.bool(true);
        }
        f.i32(3);
        if v(2) {
            f.i64(0x0102_0304_0506);
        }
        if v(5) {
            f.i8(2);
        }
        let state = |f: &mut Frame, topic: Option<&str>, p: &LeaderAndIsrPartitionState| {
            if let Some(name) = topic {
                f.str(name);
            }
            f.i32(p.partition_index).i32(3).i32(p.leader).i32(11);
            f.i32s(&p.isr).i32(21).i32s(&p.replicas);
            if v(3) {
                f.i32s(&p.adding_replicas).i32s(&p.removing_replicas);
            }
            if v(1) {
                f.bool(true);
            }
            if v(6) {
                f.i8(1);
            }
            f.tags();
        };
        if !v(2) {
            f.arr(3);
            for t in &req.topics {
                for p in &t.partitions {
                    state(&mut f, Some(&t.topic_name), p);
                }
            }
        } else {
            f.arr(2);
            for (i, t) in req.topics.iter().enumerate() {
                f.str(&t.topic_name);
                if v(5) {
                    f.uuid(if i == 0 { TOPIC_ID } else { 0 });
                }
                f.arr(t.partitions.len());
                for p in &t.partitions {
                    state(&mut f, None, p);
                }
                f.tags();
            }
        }
        f.arr(2);
        f.i32(1).str("h1").i32(9092).tags();
        f.i32(3).str("host-3").i32(9093).tags();
        f.tags();
        f.bytes
    }

    #[test]
    fn request_golden_every_version() {
        for version in 0..=7 {
            check::golden(&request(version), version, &request_frame(version));
        }
    }

    #[test]
    fn request_v0_literal() {
        let req = LeaderAndIsrRequest {
            controller_id: 1,
            controller_epoch: 2,
            broker_epoch: -1,
            topics: vec![LeaderAndIsrTopicState {
                topic_name: "t".into(),
                partitions: vec![LeaderAndIsrPartitionState {
                    partition_index: 0,
                    controller_epoch: 2,
                    leader: 1,
                    leader_epoch: 5,
                    isr: vec![1],
                    partition_epoch: 7,
                    replicas: vec![1],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            live_leaders: vec![LeaderAndIsrLiveLeader { broker_id: 1, host_name: "h".into(), port: 9092 }],
            ..Default::default()
        };
        #[rustfmt::skip]
        let frame = [
            0, 0, 0, 1, 0, 0, 0, 2, // controller id, controller epoch
            0, 0, 0, 1, // one ungrouped partition state
            0, 1, b't', 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 5,
            0, 0, 0, 1, 0, 0, 0, 1, // isr [1]
            0, 0, 0, 7, // zk version
            0, 0, 0, 1, 0, 0, 0, 1, // replicas [1]
            0, 0, 0, 1, 0, 0, 0, 1, 0, 1, b'h', 0, 0, 0x23, 0x84, // live leaders
        ];
        check::golden(&req, 0, &frame);
    }

    #[test]
    fn ungrouped_versions_regroup_by_topic() {
        let mut req = request(1);
        // Interleave: alpha/0, b/4, alpha/1 on the wire must come back as two topics.
        let moved = req.topics[0].partitions.pop().unwrap();
        req.topics.push(LeaderAndIsrTopicState {
            topic_name: "alpha".into(),
            topic_id: Uuid::nil(),
            partitions: vec![moved.clone()],
        });
        let mut out = BytesMut::new();
        req.encode(&mut out, 1).unwrap();
        let decoded = LeaderAndIsrRequest::decode(&mut out.freeze(), 1).unwrap();
        assert_eq!(decoded.topics.len(), 2);
        assert_eq!(decoded.topics[0].topic_name, "alpha");
        assert_eq!(decoded.topics[0].partitions[1], moved);
        assert_eq!(decoded.topics[1].topic_name, "b");
    }

    fn response(version: i16) -> LeaderAndIsrResponse {
        let grouped = version >= 5;
        let error = |topic: &str, id: u128, partition_index: i32, error_code: i16| LeaderAndIsrPartitionError {
            topic_name: if grouped { String::new() } else { topic.into() },
            topic_id: if grouped { Uuid::from_u128(id) } else { Uuid::nil() },
            partition_index,
            error_code,
        };
        LeaderAndIsrResponse {
            error_code: 0,
            partition_errors: vec![
                error("alpha", TOPIC_ID, 0, 0),
                error("alpha", TOPIC_ID, 1, 56),
                error("b", 7, 4, 3),
            ],
        }
    }

    fn response_frame(version: i16) -> Vec<u8> {
        let mut f = Frame::new(version >= 4);
        f.i16(0);
        if version <= 4 {
            f.arr(3);
            f.str("alpha").i32(0).i16(0).tags();
            f.str("alpha").i32(1).i16(56).tags();
            f.str("b").i32(4).i16(3).tags();
        } else {
            f.arr(2);
            f.uuid(TOPIC_ID).arr(2);
            f.i32(0).i16(0).tags();
            f.i32(1).i16(56).tags();
            f.tags();
            f.uuid(7).arr(1).i32(4).i16(3).tags().tags();
        }
        f.tags();
        f.bytes
    }

    #[test]
    fn response_golden_every_version() {
        for version in 0..=7 {
            check::golden(&response(version), version, &response_frame(version));
        }
    }

    #[test]
    fn large_request_round_trips() {
        let mut req = request(7);
        req.topics[0].partitions = (0..1000)
            .map(|i| LeaderAndIsrPartitionState {
                partition_index: i,
                leader: i % 5,
                isr: vec![i % 5, (i + 1) % 5],
                replicas: vec![i % 5, (i + 1) % 5, (i + 2) % 5],
                adding_replicas: vec![(i + 2) % 5],
                ..Default::default()
            })
            .collect();
        check::round_trip(&req, 7);
    }

    #[test]
    fn malformed() {
        check::unsupported_versions::<LeaderAndIsrRequest>(7);
        check::unsupported_versions::<LeaderAndIsrResponse>(7);
        // v3 (classic): topic_states count of i32::MAX after the fixed fields.
        let mut f = Frame::new(false);
        f.i32(1).i32(2).i64(3).i32(i32::MAX).i32(0);
        let mut input = Bytes::from(f.bytes);
        assert!(matches!(LeaderAndIsrRequest::decode(&mut input, 3), Err(CodecError::InvalidLength { .. })));
        // v7 (compact): a topic's partition count of u32::MAX - 1.
        let mut f = Frame::new(true);
        f.i32(1).bool(false).i32(2).i64(3).i8(0).arr(1).str("t").uuid(0);
        f.varint(u64::from(u32::MAX)).i32(0).i32(0);
        let mut input = Bytes::from(f.bytes);
        assert!(matches!(LeaderAndIsrRequest::decode(&mut input, 7), Err(CodecError::InvalidLength { .. })));
        // v5 response: a topic count of i32::MAX as a compact length.
        let mut f = Frame::new(true);
        f.i16(0).varint(i32::MAX as u64);
        let mut input = Bytes::from(f.bytes);
        assert!(LeaderAndIsrResponse::decode(&mut input, 5).is_err());
    }
}
