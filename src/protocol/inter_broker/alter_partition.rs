//! AlterPartition (api key 56), versions 0-3, all flexible. Schemas:
//! `AlterPartitionRequest.json`, `AlterPartitionResponse.json`.

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::*;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlterPartitionRequest {
    pub broker_id: i32,
    pub broker_epoch: i64,
    pub topics: Vec<AlterPartitionTopicData>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlterPartitionTopicData {
    /// v0-1; empty when decoded from v2+.
    pub topic_name: String,
    /// v2+; nil when decoded from v0-1.
    pub topic_id: Uuid,
    pub partitions: Vec<AlterPartitionPartitionData>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlterPartitionPartitionData {
    pub partition_index: i32,
    pub leader_epoch: i32,
    /// `NewIsrWithEpochs` in v3+; v0-2 carry only the broker ids (`NewIsr`), so decoding them
    /// gives broker epochs of -1.
    pub new_isr_with_epochs: Vec<BrokerState>,
    /// v1+.
    pub leader_recovery_state: i8,
    pub partition_epoch: i32,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct BrokerState {
    pub broker_id: i32,
    pub broker_epoch: i64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlterPartitionResponse {
    pub throttle_time_ms: i32,
    pub error_code: i16,
    pub topics: Vec<AlterPartitionTopicResult>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlterPartitionTopicResult {
    /// v0-1; empty when decoded from v2+.
    pub topic_name: String,
    /// v2+; nil when decoded from v0-1.
    pub topic_id: Uuid,
    pub partitions: Vec<AlterPartitionPartitionResult>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AlterPartitionPartitionResult {
    pub partition_index: i32,
    pub error_code: i16,
    pub leader_id: i32,
    pub leader_epoch: i32,
    pub isr: Vec<i32>,
    /// v1+.
    pub leader_recovery_state: i8,
    pub partition_epoch: i32,
}

fn encode_topic_key(buf: &mut BytesMut, version: i16, topic_name: &str, topic_id: &Uuid) -> Result<(), CodecError> {
    if version <= 1 {
        put_string(buf, true, topic_name)
    } else {
        put_uuid(buf, topic_id);
        Ok(())
    }
}

fn decode_topic_key(buf: &mut Bytes, version: i16) -> Result<(String, Uuid), CodecError> {
    if version <= 1 {
        Ok((get_string(buf, true)?, Uuid::nil()))
    } else {
        Ok((String::new(), get_uuid(buf)?))
    }
}

impl Message for AlterPartitionRequest {
    const API_KEY: i16 = ALTER_PARTITION;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        buf.put_i32(self.broker_id);
        buf.put_i64(self.broker_epoch);
        put_array(buf, flex, &self.topics, |buf, t| {
            encode_topic_key(buf, version, &t.topic_name, &t.topic_id)?;
            put_array(buf, flex, &t.partitions, |buf, p| {
                buf.put_i32(p.partition_index);
                buf.put_i32(p.leader_epoch);
                if version <= 2 {
                    let ids: Vec<i32> = p.new_isr_with_epochs.iter().map(|b| b.broker_id).collect();
                    put_i32_array(buf, flex, &ids)?;
                } else {
                    put_array(buf, flex, &p.new_isr_with_epochs, |buf, b| {
                        buf.put_i32(b.broker_id);
                        buf.put_i64(b.broker_epoch);
                        put_tagged_fields_if(buf, flex);
                        Ok(())
                    })?;
                }
                if version >= 1 {
                    buf.put_i8(p.leader_recovery_state);
                }
                buf.put_i32(p.partition_epoch);
                put_tagged_fields_if(buf, flex);
                Ok(())
            })?;
            put_tagged_fields_if(buf, flex);
            Ok(())
        })?;
        put_tagged_fields_if(buf, flex);
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let broker_id = get_i32(buf)?;
        let broker_epoch = get_i64(buf)?;
        let topics = get_array(buf, flex, 2, |buf| {
            let (topic_name, topic_id) = decode_topic_key(buf, version)?;
            let partitions = get_array(buf, flex, 13, |buf| {
                let partition_index = get_i32(buf)?;
                let leader_epoch = get_i32(buf)?;
                let new_isr_with_epochs = if version <= 2 {
                    get_i32_array(buf, flex)?
                        .into_iter()
                        .map(|broker_id| BrokerState { broker_id, broker_epoch: -1 })
                        .collect()
                } else {
                    get_array(buf, flex, 13, |buf| {
                        let b = BrokerState { broker_id: get_i32(buf)?, broker_epoch: get_i64(buf)? };
                        end_struct(buf, flex)?;
                        Ok(b)
                    })?
                };
                let leader_recovery_state = if version >= 1 { get_i8(buf)? } else { 0 };
                let partition_epoch = get_i32(buf)?;
                end_struct(buf, flex)?;
                Ok(AlterPartitionPartitionData {
                    partition_index,
                    leader_epoch,
                    new_isr_with_epochs,
                    leader_recovery_state,
                    partition_epoch,
                })
            })?;
            end_struct(buf, flex)?;
            Ok(AlterPartitionTopicData { topic_name, topic_id, partitions })
        })?;
        end_struct(buf, flex)?;
        Ok(AlterPartitionRequest { broker_id, broker_epoch, topics })
    }
}

impl Message for AlterPartitionResponse {
    const API_KEY: i16 = ALTER_PARTITION;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        buf.put_i32(self.throttle_time_ms);
        buf.put_i16(self.error_code);
        put_array(buf, flex, &self.topics, |buf, t| {
            encode_topic_key(buf, version, &t.topic_name, &t.topic_id)?;
            put_array(buf, flex, &t.partitions, |buf, p| {
                buf.put_i32(p.partition_index);
                buf.put_i16(p.error_code);
                buf.put_i32(p.leader_id);
                buf.put_i32(p.leader_epoch);
                put_i32_array(buf, flex, &p.isr)?;
                if version >= 1 {
                    buf.put_i8(p.leader_recovery_state);
                }
                buf.put_i32(p.partition_epoch);
                put_tagged_fields_if(buf, flex);
                Ok(())
            })?;
            put_tagged_fields_if(buf, flex);
            Ok(())
        })?;
        put_tagged_fields_if(buf, flex);
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let throttle_time_ms = get_i32(buf)?;
        let error_code = get_i16(buf)?;
        let topics = get_array(buf, flex, 2, |buf| {
            let (topic_name, topic_id) = decode_topic_key(buf, version)?;
            let partitions = get_array(buf, flex, 19, |buf| {
                let partition_index = get_i32(buf)?;
                let error_code = get_i16(buf)?;
                let leader_id = get_i32(buf)?;
                let leader_epoch = get_i32(buf)?;
                let isr = get_i32_array(buf, flex)?;
                let leader_recovery_state = if version >= 1 { get_i8(buf)? } else { 0 };
                let partition_epoch = get_i32(buf)?;
                end_struct(buf, flex)?;
                Ok(AlterPartitionPartitionResult {
                    partition_index,
                    error_code,
                    leader_id,
                    leader_epoch,
                    isr,
                    leader_recovery_state,
                    partition_epoch,
                })
            })?;
            end_struct(buf, flex)?;
            Ok(AlterPartitionTopicResult { topic_name, topic_id, partitions })
        })?;
        end_struct(buf, flex)?;
        Ok(AlterPartitionResponse { throttle_time_ms, error_code, topics })
    }
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::golden::Frame;
    use super::*;

    const TOPIC_ID: u128 = 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10;

    fn request(version: i16) -> AlterPartitionRequest {
        let by_id = version >= 2;
        let broker =
            |broker_id: i32, epoch: i64| BrokerState { broker_id, broker_epoch: if version >= 3 { epoch } else { -1 } };
        AlterPartitionRequest {
            broker_id: 3,
            broker_epoch: 0x0abc_def0,
            topics: vec![AlterPartitionTopicData {
                topic_name: if by_id { String::new() } else { "alpha".into() },
                topic_id: if by_id { Uuid::from_u128(TOPIC_ID) } else { Uuid::nil() },
                partitions: vec![
                    AlterPartitionPartitionData {
                        partition_index: 0,
                        leader_epoch: 12,
                        new_isr_with_epochs: vec![broker(3, 100), broker(1, 101)],
                        leader_recovery_state: if version >= 1 { 1 } else { 0 },
                        partition_epoch: 40,
                    },
                    AlterPartitionPartitionData {
                        partition_index: 5,
                        leader_epoch: 2,
                        new_isr_with_epochs: vec![broker(3, 100)],
                        leader_recovery_state: 0,
                        partition_epoch: 41,
                    },
                ],
            }],
        }
    }

    fn request_frame(version: i16) -> Vec<u8> {
        let mut f = Frame::new(true);
        f.i32(3).i64(0x0abc_def0).arr(1);
        if version <= 1 {
            f.str("alpha");
        } else {
            f.uuid(TOPIC_ID);
        }
        f.arr(2);
        f.i32(0).i32(12);
        if version <= 2 {
            f.i32s(&[3, 1]);
        } else {
            f.arr(2).i32(3).i64(100).tags().i32(1).i64(101).tags();
        }
        if version >= 1 {
            f.i8(1);
        }
        f.i32(40).tags();
        f.i32(5).i32(2);
        if version <= 2 {
            f.i32s(&[3]);
        } else {
            f.arr(1).i32(3).i64(100).tags();
        }
        if version >= 1 {
            f.i8(0);
        }
        f.i32(41).tags();
        f.tags().tags();
        f.bytes
    }

    #[test]
    fn request_golden_every_version() {
        for version in 0..=3 {
            check::golden(&request(version), version, &request_frame(version));
        }
    }

    #[test]
    fn request_v0_literal() {
        let req = AlterPartitionRequest {
            broker_id: 1,
            broker_epoch: 2,
            topics: vec![AlterPartitionTopicData {
                topic_name: "t".into(),
                topic_id: Uuid::nil(),
                partitions: vec![AlterPartitionPartitionData {
                    partition_index: 0,
                    leader_epoch: 3,
                    new_isr_with_epochs: vec![BrokerState { broker_id: 1, broker_epoch: -1 }],
                    leader_recovery_state: 0,
                    partition_epoch: 4,
                }],
            }],
        };
        #[rustfmt::skip]
        let frame = [
            0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2,
            2, 2, b't', 2, 0, 0, 0, 0, 0, 0, 0, 3, 2, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0,
        ];
        check::golden(&req, 0, &frame);
    }

    fn response(version: i16) -> AlterPartitionResponse {
        let by_id = version >= 2;
        AlterPartitionResponse {
            throttle_time_ms: 10,
            error_code: 0,
            topics: vec![AlterPartitionTopicResult {
                topic_name: if by_id { String::new() } else { "alpha".into() },
                topic_id: if by_id { Uuid::from_u128(TOPIC_ID) } else { Uuid::nil() },
                partitions: vec![
                    AlterPartitionPartitionResult {
                        partition_index: 0,
                        error_code: 0,
                        leader_id: 3,
                        leader_epoch: 12,
                        isr: vec![3, 1],
                        leader_recovery_state: if version >= 1 { 1 } else { 0 },
                        partition_epoch: 41,
                    },
                    AlterPartitionPartitionResult {
                        partition_index: 5,
                        error_code: 118,
                        leader_id: -1,
                        leader_epoch: -1,
                        isr: vec![],
                        leader_recovery_state: 0,
                        partition_epoch: -1,
                    },
                ],
            }],
        }
    }

    fn response_frame(version: i16) -> Vec<u8> {
        let mut f = Frame::new(true);
        f.i32(10).i16(0).arr(1);
        if version <= 1 {
            f.str("alpha");
        } else {
            f.uuid(TOPIC_ID);
        }
        f.arr(2);
        f.i32(0).i16(0).i32(3).i32(12).i32s(&[3, 1]);
        if version >= 1 {
            f.i8(1);
        }
        f.i32(41).tags();
        f.i32(5).i16(118).i32(-1).i32(-1).i32s(&[]);
        if version >= 1 {
            f.i8(0);
        }
        f.i32(-1).tags();
        f.tags().tags();
        f.bytes
    }

    #[test]
    fn response_golden_every_version() {
        for version in 0..=3 {
            check::golden(&response(version), version, &response_frame(version));
        }
    }

    #[test]
    fn unknown_tagged_fields_in_nested_structs_are_skipped() {
        let unknown = |f: &mut Frame| {
            // One field: tag 9, two bytes.
            f.varint(1).varint(9).varint(2).i16(0x5555);
        };
        let mut f = Frame::new(true);
        f.i32(3).i64(4).arr(1).uuid(TOPIC_ID).arr(1);
        f.i32(0).i32(1).arr(1).i32(3).i64(5);
        unknown(&mut f);
        f.i8(0).i32(6);
        unknown(&mut f);
        unknown(&mut f);
        unknown(&mut f);
        let decoded = AlterPartitionRequest::decode(&mut Bytes::from(f.bytes), 3).unwrap();
        assert_eq!(
            decoded.topics[0].partitions[0],
            AlterPartitionPartitionData {
                partition_index: 0,
                leader_epoch: 1,
                new_isr_with_epochs: vec![BrokerState { broker_id: 3, broker_epoch: 5 }],
                leader_recovery_state: 0,
                partition_epoch: 6,
            }
        );
    }

    #[test]
    fn large_request_round_trips() {
        let mut req = request(3);
        req.topics[0].partitions = (0..1000)
            .map(|i| AlterPartitionPartitionData {
                partition_index: i,
                leader_epoch: i + 1,
                new_isr_with_epochs: vec![
                    BrokerState { broker_id: i % 4, broker_epoch: i64::from(i) << 20 },
                    BrokerState { broker_id: (i + 1) % 4, broker_epoch: 7 },
                ],
                leader_recovery_state: (i % 2) as i8,
                partition_epoch: i * 3,
            })
            .collect();
        check::round_trip(&req, 3);
    }

    #[test]
    fn malformed() {
        check::unsupported_versions::<AlterPartitionRequest>(3);
        check::unsupported_versions::<AlterPartitionResponse>(3);
        let mut f = Frame::new(true);
        f.i32(1).i64(2).varint(u64::from(u32::MAX)).i32(0);
        let mut input = Bytes::from(f.bytes);
        assert!(matches!(AlterPartitionRequest::decode(&mut input, 3), Err(CodecError::InvalidLength { .. })));
        // A partition's NewIsrWithEpochs count of i32::MAX.
        let mut f = Frame::new(true);
        f.i32(1).i64(2).arr(1).uuid(0).arr(1).i32(0).i32(0);
        f.varint(i32::MAX as u64).i32(0);
        let mut input = Bytes::from(f.bytes);
        assert!(matches!(AlterPartitionRequest::decode(&mut input, 3), Err(CodecError::InvalidLength { .. })));
    }
}
