"""Cross-check of the hand-written request encoders against kafka-python's
schema-generated message classes (only as an independent codec oracle; the
broker tests themselves never use a client library). Skipped without kafka-python >= 3."""
import pytest

import kproto as kp
from test_kproto_selftest import build_min_request

klasses = {}
try:
    from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
    from kafka.protocol.producer import ProduceRequest, InitProducerIdRequest
    from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
    from kafka.protocol.admin import (CreateTopicsRequest, DeleteTopicsRequest, CreatePartitionsRequest,
                                      DeleteRecordsRequest, DescribeConfigsRequest,
                                      IncrementalAlterConfigsRequest, DescribeClusterRequest)
    klasses = {
        kp.API_VERSIONS: ApiVersionsRequest, kp.METADATA: MetadataRequest, kp.PRODUCE: ProduceRequest,
        kp.FETCH: FetchRequest, kp.LIST_OFFSETS: ListOffsetsRequest, kp.CREATE_TOPICS: CreateTopicsRequest,
        kp.DELETE_TOPICS: DeleteTopicsRequest, kp.CREATE_PARTITIONS: CreatePartitionsRequest,
        kp.DESCRIBE_CONFIGS: DescribeConfigsRequest, kp.INCREMENTAL_ALTER_CONFIGS: IncrementalAlterConfigsRequest,
        kp.DESCRIBE_CLUSTER: DescribeClusterRequest, kp.INIT_PRODUCER_ID: InitProducerIdRequest,
        kp.DELETE_RECORDS: DeleteRecordsRequest,
    }
except Exception:  # noqa: BLE001
    pass

CASES = [(api, v) for api in sorted(kp.ENCODER_RANGES) for v in range(kp.ENCODER_RANGES[api][0],
                                                                       kp.ENCODER_RANGES[api][1] + 1)]


@pytest.mark.skipif(not klasses, reason="kafka-python 3.x protocol classes not available")
@pytest.mark.parametrize("api,v", CASES, ids=[f"{kp.API_NAMES[a]}-v{v}" for a, v in CASES])
def test_request_matches_schema(api, v):
    cls = klasses[api]
    mine = kp.request_header(api, v, 42) + build_min_request(api, v, "topic-x")
    decoded = cls.decode(mine, version=v, header=True)
    again = bytes(decoded.encode(version=v, header=True))
    assert again == mine, f"{kp.API_NAMES[api]} v{v}: {mine.hex()} vs kafka-python {again.hex()} ({decoded})"
