//! ControlledShutdown (api key 7), versions 0-3, flexible from 3. Schemas:
//! `ControlledShutdownRequest.json`, `ControlledShutdownResponse.json`. Version 0 travels with
//! request header v0 (no client id); see [`super::request_header_version`].

use bytes::{BufMut, Bytes, BytesMut};

use super::*;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ControlledShutdownRequest {
    pub broker_id: i32,
    /// v2+; -1 when decoded from older versions.
    pub broker_epoch: i64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ControlledShutdownResponse {
    pub error_code: i16,
    pub remaining_partitions: Vec<RemainingPartition>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct RemainingPartition {
    pub topic_name: String,
    pub partition_index: i32,
}

impl Message for ControlledShutdownRequest {
    const API_KEY: i16 = CONTROLLED_SHUTDOWN;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        buf.put_i32(self.broker_id);
        if version >= 2 {
            buf.put_i64(self.broker_epoch);
        }
        put_tagged_fields_if(buf, flex);
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let broker_id = get_i32(buf)?;
        let broker_epoch = if version >= 2 { get_i64(buf)? } else { -1 };
        end_struct(buf, flex)?;
        Ok(ControlledShutdownRequest { broker_id, broker_epoch })
    }
}

impl Message for ControlledShutdownResponse {
    const API_KEY: i16 = CONTROLLED_SHUTDOWN;

    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        buf.put_i16(self.error_code);
        put_array(buf, flex, &self.remaining_partitions, |buf, p| {
            put_string(buf, flex, &p.topic_name)?;
            buf.put_i32(p.partition_index);
            put_tagged_fields_if(buf, flex);
            Ok(())
        })?;
        put_tagged_fields_if(buf, flex);
        Ok(())
    }

    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, CodecError> {
        let flex = flexible(Self::API_KEY, version)?;
        let error_code = get_i16(buf)?;
        let remaining_partitions = get_array(buf, flex, 5, |buf| {
            let p = RemainingPartition { topic_name: get_string(buf, flex)?, partition_index: get_i32(buf)? };
            end_struct(buf, flex)?;
            Ok(p)
        })?;
        end_struct(buf, flex)?;
        Ok(ControlledShutdownResponse { error_code, remaining_partitions })
    }
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::golden::Frame;
    use super::*;

    #[test]
    fn request_golden_every_version() {
        for version in 0..=3 {
            let req = ControlledShutdownRequest { broker_id: 5, broker_epoch: if version >= 2 { 0x1234 } else { -1 } };
            let mut f = Frame::new(version >= 3);
            f.i32(5);
            if version >= 2 {
                f.i64(0x1234);
            }
            f.tags();
            check::golden(&req, version, &f.bytes);
        }
        let req = ControlledShutdownRequest { broker_id: 1, broker_epoch: 2 };
        check::golden(&req, 3, &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0]);
        let req = ControlledShutdownRequest { broker_id: 1, broker_epoch: -1 };
        check::golden(&req, 1, &[0, 0, 0, 1]);
    }

    #[test]
    fn response_golden_every_version() {
        let resp = ControlledShutdownResponse {
            error_code: 0,
            remaining_partitions: vec![
                RemainingPartition { topic_name: "alpha".into(), partition_index: 2 },
                RemainingPartition { topic_name: "b".into(), partition_index: 0 },
            ],
        };
        for version in 0..=3 {
            let mut f = Frame::new(version >= 3);
            f.i16(0).arr(2);
            f.str("alpha").i32(2).tags();
            f.str("b").i32(0).tags();
            f.tags();
            check::golden(&resp, version, &f.bytes);
        }
        let resp = ControlledShutdownResponse {
            error_code: 7,
            remaining_partitions: vec![RemainingPartition { topic_name: "t".into(), partition_index: 1 }],
        };
        check::golden(&resp, 3, &[0, 7, 2, 2, b't', 0, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn large_response_round_trips() {
        let resp = ControlledShutdownResponse {
            error_code: 0,
            remaining_partitions: (0..1000)
                .map(|i| RemainingPartition { topic_name: format!("topic-{}", i % 7), partition_index: i })
                .collect(),
        };
        check::round_trip(&resp, 3);
    }

    #[test]
    fn malformed() {
        check::unsupported_versions::<ControlledShutdownRequest>(3);
        check::unsupported_versions::<ControlledShutdownResponse>(3);
        let mut input = Bytes::from_static(&[0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 1, b'x']);
        assert!(matches!(ControlledShutdownResponse::decode(&mut input, 2), Err(CodecError::InvalidLength { .. })));
        let mut input = Bytes::from_static(&[0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 2, b'x']);
        assert!(matches!(ControlledShutdownResponse::decode(&mut input, 3), Err(CodecError::InvalidLength { .. })));
    }
}
