"""Cross-check of the admin request encoders (kproto_admin.py) against kafka-python's
schema-generated classes, every version: kafka-python decodes our bytes and re-encodes them
to the same bytes. No broker. Only a missing kafka-python skips this file."""
import importlib
import importlib.util

import pytest

import kproto as kp
import kproto_admin as ka

if importlib.util.find_spec("kafka") is None:
    pytest.skip("kafka-python not installed (optional codec oracle; scripts/test installs it)",
                allow_module_level=True)

CLASS_NAMES = {
    ka.ALTER_CONFIGS: "AlterConfigsRequest", ka.ELECT_LEADERS: "ElectLeadersRequest",
    ka.DESCRIBE_LOG_DIRS: "DescribeLogDirsRequest", ka.DESCRIBE_TOPIC_PARTITIONS: "DescribeTopicPartitionsRequest",
    kp.CREATE_TOPICS: "CreateTopicsRequest", kp.CREATE_PARTITIONS: "CreatePartitionsRequest",
    ka.ALTER_PARTITION_REASSIGNMENTS: "AlterPartitionReassignmentsRequest",
    ka.LIST_PARTITION_REASSIGNMENTS: "ListPartitionReassignmentsRequest",
    ka.DESCRIBE_CLIENT_QUOTAS: "DescribeClientQuotasRequest", ka.ALTER_CLIENT_QUOTAS: "AlterClientQuotasRequest",
    ka.DESCRIBE_PRODUCERS: "DescribeProducersRequest",
    ka.DESCRIBE_ACLS: "DescribeAclsRequest", ka.CREATE_ACLS: "CreateAclsRequest", ka.DELETE_ACLS: "DeleteAclsRequest",
    ka.ALTER_REPLICA_LOG_DIRS: "AlterReplicaLogDirsRequest",
    ka.LIST_CONFIG_RESOURCES: "ListConfigResourcesRequest",
}


def build(api, v):
    if api == ka.ALTER_CONFIGS:
        return ka.alter_configs_request(v, [(2, "t", {"retention.ms": "1", "x": None}), (4, "0", {})], True)
    if api == ka.ELECT_LEADERS:
        return ka.elect_leaders_request(v, {"t": [0, 2], "u": [1]}, election_type=1 if v >= 1 else 0)
    if api == ka.DESCRIBE_LOG_DIRS:
        return ka.describe_log_dirs_request(v, {"t": [0, 1]})
    if api == ka.DESCRIBE_TOPIC_PARTITIONS:
        return ka.describe_topic_partitions_request(v, ["t", "u"], 7, ("t", 3))
    if api == kp.CREATE_TOPICS:
        return ka.create_topics_assigned_request(v, "t", {0: [1, 2], 1: [2, 3]})
    if api == kp.CREATE_PARTITIONS:
        return ka.create_partitions_assigned_request(v, "t", 4, [[1, 2], [3, 1]])
    if api == ka.ALTER_PARTITION_REASSIGNMENTS:
        return ka.alter_partition_reassignments_request(v, {("t", 0): [1, 2], ("t", 1): None, ("u", 3): [4]})
    if api == ka.LIST_PARTITION_REASSIGNMENTS:
        return ka.list_partition_reassignments_request(v, {"t": [0, 2]})
    if api == ka.DESCRIBE_CLIENT_QUOTAS:
        return ka.describe_client_quotas_request(v, [("user", 0, "alice"), ("client-id", 1, None)], True)
    if api == ka.ALTER_CLIENT_QUOTAS:
        return ka.alter_client_quotas_request(v, [([("client-id", "c"), ("user", None)],
                                                   [("producer_byte_rate", 1024.0, False), ("x", 0.0, True)])], True)
    if api == ka.DESCRIBE_PRODUCERS:
        return ka.describe_producers_request(v, {"t": [0, 1]})
    if api == ka.CREATE_ACLS:
        return ka.create_acls_request(v, [(2, "t", 3, "User:a", "*", 3, 3), (3, "g", 4, "User:b", "1.2.3.4", 8, 2)])
    if api == ka.DESCRIBE_ACLS:
        return ka.describe_acls_request(v, (2, "t", 2, None, "*", 1, 3))
    if api == ka.DELETE_ACLS:
        return ka.delete_acls_request(v, [(1, None, 1, "User:a", None, 3, 1), (2, "t", 4, None, None, 1, 2)])
    if api == ka.ALTER_REPLICA_LOG_DIRS:
        return ka.alter_replica_log_dirs_request(v, {"/d1": {"t": [0, 2], "u": [1]}, "/d2": {"v": [3]}})
    if api == ka.LIST_CONFIG_RESOURCES:
        return ka.list_config_resources_request(v, [16, 2])
    raise AssertionError(api)


RANGES = {**ka.ENCODER_RANGES, kp.CREATE_TOPICS: (2, 7), kp.CREATE_PARTITIONS: (0, 3)}
CASES = [(api, v) for api in sorted(RANGES) for v in range(RANGES[api][0], RANGES[api][1] + 1)]


@pytest.mark.parametrize("api,v", CASES, ids=[f"{kp.API_NAMES[a]}-v{v}" for a, v in CASES])
def test_admin_request_matches_schema(api, v):
    import kafka.protocol.admin as admin
    cls = getattr(admin, CLASS_NAMES[api])
    mine = kp.request_header(api, v, 42) + build(api, v)
    decoded = cls.decode(mine, version=v, header=True)
    again = bytes(decoded.encode(version=v, header=True))
    assert again == mine, f"{kp.API_NAMES[api]} v{v}: {mine.hex()} vs kafka-python {again.hex()} ({decoded})"
