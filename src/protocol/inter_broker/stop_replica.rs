//! StopReplica (api key 5), versions 0-4, flexible from 2. Schemas: `StopReplicaRequest.json`,
//! `StopReplicaResponse.json`.

use bytes::{BufMut, Bytes, BytesMut};

use super::*;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct StopReplicaRequest {
    pub controller_id: i32,
    /// v4+.
    pub is_kraft_controller: bool,
    pub controller_epoch: i32,
    /// v1+; -1 when decoded from v0.
    pub broker_epoch: i64,
    pub topics: Vec<StopReplicaTopicState>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct StopReplicaTopicState {
    pub topic_name: String,
    pub partitions: Vec<StopReplicaPartitionState>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct StopReplicaPartitionState {
    pub partition_index: i32,
    /// v3+; -1 when decoded from older versions.
    pub leader_epoch: i32,
    /// Per partition from v3; v0-2 carry one flag for the whole request.
    pub delete_partition: bool,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct StopReplicaResponse {
    pub error_code: i16,
    pub partition_errors: Vec<StopReplicaPartitionError>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct StopReplicaPartitionError {
    pub topic_name: String,
    pub partition_index: i32,
    pub error_code: i16,
}

impl StopReplicaRequest {
    /// The single v0-2 `DeletePartitions` flag, which only exists if every partition agrees.
    fn delete_partitions(&self) -> Result<bool, CodecError> {
        let mut flags = self.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.delete_partition));
        let first = flags.next().unwrap_or(false);
        if flags.all(|f| f == first) {
            Ok(first)
        } else {
            Err(CodecError::Unencodable("StopReplica v0-2 has one delete flag, but partitions disagree".into()))
        }
    }
}

impl Message for StopReplicaRequest {
    const API_KEY: i16 = STOP_REPLICA;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        // Checked before writing anything so a refused request leaves no partial frame.
        let delete_partitions = if version <= 2 { self.delete_partitions()? } else { false };
        buf.put_i32(self.controller_id);
        if version >= 4 {
            put_bool(buf, self.is_kraft_controller);
        }
        buf.put_i32(self.controller_epoch);
        if version >= 1 {
            buf.put_i64(self.broker_epoch);
        }
        if version <= 2 {
            put_bool(buf, delete_partitions);
        }
        match version {
            0 => {
                let flat: Vec<(&str, i32)> = self
                    .topics
                    .iter()
                    .flat_map(|t| t.partitions.iter().map(|p| (t.topic_name.as_str(), p.partition_index)))
                    .collect();
                put_array(buf, flex, &flat, |buf, (name, index)| {
                    put_string(buf, flex, name)?;
                    buf.put_i32(*index);
                    Ok(())
                })?;
            }
            1 | 2 => {
                put_array(buf, flex, &self.topics, |buf, t| {
                    put_string(buf, flex, &t.topic_name)?;
                    put_array(buf, flex, &t.partitions, |buf, p| {
                        buf.put_i32(p.partition_index);
                        Ok(())
                    })?;
                    put_tagged_fields_if(buf, flex);
                    Ok(())
                })?;
            }
            _ => {
                put_array(buf, flex, &self.topics, |buf, t| {
                    put_string(buf, flex, &t.topic_name)?;
                    put_array(buf, flex, &t.partitions, |buf, p| {
                        buf.put_i32(p.partition_index);
                        buf.put_i32(p.leader_epoch);
                        put_bool(buf, p.delete_partition);
                        put_tagged_fields_if(buf, flex);
                        Ok(())
                    })?;
                    put_tagged_fields_if(buf, flex);
                    Ok(())
                })?;
            }
        }
        put_tagged_fields_if(buf, flex);
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let mut req = StopReplicaRequest { controller_id: get_i32(buf)?, broker_epoch: -1, ..Default::default() };
        if version >= 4 {
            req.is_kraft_controller = get_bool(buf)?;
        }
        req.controller_epoch = get_i32(buf)?;
        if version >= 1 {
            req.broker_epoch = get_i64(buf)?;
        }
        let delete_partition = if version <= 2 { get_bool(buf)? } else { false };
        let old_partition =
            |partition_index| StopReplicaPartitionState { partition_index, leader_epoch: -1, delete_partition };
        req.topics = match version {
            0 => {
                let flat = get_array(buf, flex, 6, |buf| Ok((get_string(buf, flex)?, old_partition(get_i32(buf)?))))?;
                group_by_key(flat)
                    .into_iter()
                    .map(|(topic_name, partitions)| StopReplicaTopicState { topic_name, partitions })
                    .collect()
            }
            1 | 2 => get_array(buf, flex, 2, |buf| {
                let topic_name = get_string(buf, flex)?;
                let partitions = get_i32_array(buf, flex)?.into_iter().map(old_partition).collect();
                end_struct(buf, flex)?;
                Ok(StopReplicaTopicState { topic_name, partitions })
            })?,
            _ => get_array(buf, flex, 2, |buf| {
                let topic_name = get_string(buf, flex)?;
                let partitions = get_array(buf, flex, 9, |buf| {
                    let p = StopReplicaPartitionState {
                        partition_index: get_i32(buf)?,
                        leader_epoch: get_i32(buf)?,
                        delete_partition: get_bool(buf)?,
                    };
                    end_struct(buf, flex)?;
                    Ok(p)
                })?;
                end_struct(buf, flex)?;
                Ok(StopReplicaTopicState { topic_name, partitions })
            })?,
        };
        end_struct(buf, flex)?;
        Ok(req)
    }
}

impl Message for StopReplicaResponse {
    const API_KEY: i16 = STOP_REPLICA;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        buf.put_i16(self.error_code);
        put_array(buf, flex, &self.partition_errors, |buf, e| {
            put_string(buf, flex, &e.topic_name)?;
            buf.put_i32(e.partition_index);
            buf.put_i16(e.error_code);
            put_tagged_fields_if(buf, flex);
            Ok(())
        })?;
        put_tagged_fields_if(buf, flex);
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let error_code = get_i16(buf)?;
        let partition_errors = get_array(buf, flex, 7, |buf| {
            let e = StopReplicaPartitionError {
                topic_name: get_string(buf, flex)?,
                partition_index: get_i32(buf)?,
                error_code: get_i16(buf)?,
            };
            end_struct(buf, flex)?;
            Ok(e)
        })?;
        end_struct(buf, flex)?;
        Ok(StopReplicaResponse { error_code, partition_errors })
    }
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::golden::Frame;
    use super::*;

    fn request(version: i16) -> StopReplicaRequest {
        let per_partition = version >= 3;
        let partition = |partition_index: i32, leader_epoch: i32, delete: bool| {
            StopReplicaPartitionState {
                partition_index,
                leader_epoch: if per_partition { leader_epoch } else { -1 },
                // Old versions share one flag; newer ones may mix.
                delete_partition: if per_partition { delete } else { true },
            }
        };
        StopReplicaRequest {
            controller_id: 2,
            is_kraft_controller: version >= 4,
            controller_epoch: 9,
            broker_epoch: if version >= 1 { 77 } else { -1 },
            topics: vec![
                StopReplicaTopicState {
                    topic_name: "alpha".into(),
                    partitions: vec![partition(0, 5, true), partition(3, 6, false)],
                },
                StopReplicaTopicState { topic_name: "b".into(), partitions: vec![partition(1, 7, true)] },
            ],
        }
    }

    fn request_frame(version: i16) -> Vec<u8> {
        let mut f = Frame::new(version >= 2);
        f.i32(2);
        if version >= 4 {
            f.bool(true);
        }
        f.i32(9);
        if version >= 1 {
            f.i64(77);
        }
        if version <= 2 {
            f.bool(true);
        }
        match version {
            0 => {
                f.arr(3);
                f.str("alpha").i32(0).str("alpha").i32(3).str("b").i32(1);
            }
            1 | 2 => {
                f.arr(2);
                f.str("alpha").i32s(&[0, 3]).tags();
                f.str("b").i32s(&[1]).tags();
            }
            _ => {
                f.arr(2);
                f.str("alpha").arr(2);
                f.i32(0).i32(5).bool(true).tags();
                f.i32(3).i32(6).bool(false).tags();
                f.tags();
                f.str("b").arr(1).i32(1).i32(7).bool(true).tags().tags();
            }
        }
        f.tags();
        f.bytes
    }

    #[test]
    fn request_golden_every_version() {
        for version in 0..=4 {
            check::golden(&request(version), version, &request_frame(version));
        }
    }

    #[test]
    fn request_v1_literal() {
        let req = StopReplicaRequest {
            controller_id: 1,
            controller_epoch: 2,
            broker_epoch: 3,
            topics: vec![StopReplicaTopicState {
                topic_name: "t".into(),
                partitions: vec![StopReplicaPartitionState {
                    partition_index: 4,
                    leader_epoch: -1,
                    delete_partition: false,
                }],
            }],
            ..Default::default()
        };
        #[rustfmt::skip]
        let frame = [
            0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, // ids, epochs, delete=false
            0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 4,
        ];
        check::golden(&req, 1, &frame);
    }

    #[test]
    fn mixed_delete_flags_cannot_use_old_versions() {
        let req = request(3);
        for version in 0..=2 {
            let mut out = BytesMut::new();
            assert!(matches!(req.encode(&mut out, version), Err(CodecError::Unencodable(_))));
            assert!(out.is_empty());
        }
    }

    fn response(_version: i16) -> StopReplicaResponse {
        StopReplicaResponse {
            error_code: 0,
            partition_errors: vec![
                StopReplicaPartitionError { topic_name: "alpha".into(), partition_index: 0, error_code: 0 },
                StopReplicaPartitionError { topic_name: "b".into(), partition_index: 1, error_code: 74 },
            ],
        }
    }

    fn response_frame(version: i16) -> Vec<u8> {
        let mut f = Frame::new(version >= 2);
        f.i16(0).arr(2);
        f.str("alpha").i32(0).i16(0).tags();
        f.str("b").i32(1).i16(74).tags();
        f.tags();
        f.bytes
    }

    #[test]
    fn response_golden_every_version() {
        for version in 0..=4 {
            check::golden(&response(version), version, &response_frame(version));
        }
    }

    #[test]
    fn large_request_round_trips() {
        let mut req = request(4);
        req.topics[0].partitions = (0..1000)
            .map(|i| StopReplicaPartitionState {
                partition_index: i,
                leader_epoch: i * 2,
                delete_partition: i % 3 == 0,
            })
            .collect();
        check::round_trip(&req, 4);
    }

    #[test]
    fn malformed() {
        check::unsupported_versions::<StopReplicaRequest>(4);
        check::unsupported_versions::<StopReplicaResponse>(4);
        let mut f = Frame::new(false);
        f.i32(1).i32(2).bool(false).i32(i32::MAX).i16(1);
        let mut input = Bytes::from(f.bytes);
        assert!(matches!(StopReplicaRequest::decode(&mut input, 0), Err(CodecError::InvalidLength { .. })));
        let mut f = Frame::new(true);
        f.i32(1).bool(false).i32(2).i64(3).varint(u64::from(u32::MAX));
        let mut input = Bytes::from(f.bytes);
        assert!(matches!(StopReplicaRequest::decode(&mut input, 4), Err(CodecError::InvalidLength { .. })));
    }
}
