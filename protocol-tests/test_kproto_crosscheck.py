"""Cross-check of the hand-written request encoders against kafka-python's
schema-generated message classes (only as an independent codec oracle; the
broker tests themselves never use a client library).

Only a missing kafka-python skips this file (and scripts/test fails a skip on CI);
any other problem importing its classes, e.g. a renamed class in a new
kafka-python, is an error, not a skip."""
import importlib.util

import pytest

import kproto as kp
from test_kproto_selftest import build_min_request

if importlib.util.find_spec("kafka") is None:
    pytest.skip("kafka-python not installed (optional codec oracle; scripts/test installs it)",
                allow_module_level=True)

from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest  # noqa: E402
from kafka.protocol.producer import ProduceRequest, InitProducerIdRequest  # noqa: E402
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest  # noqa: E402
from kafka.protocol.admin import (CreateTopicsRequest, DeleteTopicsRequest, CreatePartitionsRequest,  # noqa: E402
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

CASES = [(api, v) for api in sorted(kp.ENCODER_RANGES) for v in range(kp.ENCODER_RANGES[api][0],
                                                                       kp.ENCODER_RANGES[api][1] + 1)]


@pytest.mark.parametrize("api,v", CASES, ids=[f"{kp.API_NAMES[a]}-v{v}" for a, v in CASES])
def test_request_matches_schema(api, v):
    cls = klasses[api]
    mine = kp.request_header(api, v, 42) + build_min_request(api, v, "topic-x")
    decoded = cls.decode(mine, version=v, header=True)
    again = bytes(decoded.encode(version=v, header=True))
    assert again == mine, f"{kp.API_NAMES[api]} v{v}: {mine.hex()} vs kafka-python {again.hex()} ({decoded})"
