"""Cross-check of the group-API request encoders (kproto_groups.py) against kafka-python's
schema-generated message classes, every version: kafka-python decodes our bytes and
re-encodes them to the same bytes.  No broker.  Only a missing kafka-python skips this file
(and scripts/test fails a skip on CI)."""
import importlib
import importlib.util

import pytest

import kproto as kp
import kproto_groups as kg

if importlib.util.find_spec("kafka") is None:
    pytest.skip("kafka-python not installed (optional codec oracle; scripts/test installs it)",
                allow_module_level=True)

CLASS_NAMES = {
    kg.OFFSET_COMMIT: "OffsetCommitRequest", kg.OFFSET_FETCH: "OffsetFetchRequest",
    kg.FIND_COORDINATOR: "FindCoordinatorRequest", kg.JOIN_GROUP: "JoinGroupRequest",
    kg.HEARTBEAT: "HeartbeatRequest", kg.LEAVE_GROUP: "LeaveGroupRequest", kg.SYNC_GROUP: "SyncGroupRequest",
    kg.DESCRIBE_GROUPS: "DescribeGroupsRequest", kg.LIST_GROUPS: "ListGroupsRequest",
    kg.OFFSET_FOR_LEADER_EPOCH: "OffsetForLeaderEpochRequest", kg.DELETE_GROUPS: "DeleteGroupsRequest",
    kg.OFFSET_DELETE: "OffsetDeleteRequest",
}
MODULES = ["kafka.protocol.consumer", "kafka.protocol.admin", "kafka.protocol.broker_version_data",
           "kafka.protocol.metadata"]


def klass(name):
    for m in MODULES:
        cls = getattr(importlib.import_module(m), name, None)
        if cls is not None:
            return cls
    raise ImportError(f"kafka-python has no {name} in {MODULES}")


def build(api, v):
    t = "topic-x"
    if api == kg.OFFSET_COMMIT:
        return kg.offset_commit_request(v, "grp", {t: {0: 5, 3: 9}, "other": {1: 2}}, 4, "member-1", metadata="md")
    if api == kg.OFFSET_FETCH:
        return kg.offset_fetch_request(v, "grp", {t: [0, 3]}, require_stable=v >= 7)
    if api == kg.FIND_COORDINATOR:
        return kg.find_coordinator_request(v, "grp")
    if api == kg.JOIN_GROUP:
        return kg.join_group_request(v, "grp", "member-1", [("range", kg.consumer_subscription([t])),
                                                             ("roundrobin", b"\x00\x01")],
                                     group_instance_id="inst" if v >= 5 else None,
                                     reason="because" if v >= 8 else None)
    if api == kg.HEARTBEAT:
        return kg.heartbeat_request(v, "grp", 3, "member-1")
    if api == kg.LEAVE_GROUP:
        return kg.leave_group_request(v, "grp", ["member-1"] if v <= 2 else ["member-1", "member-2"],
                                      reason="bye" if v >= 5 else None)
    if api == kg.SYNC_GROUP:
        return kg.sync_group_request(v, "grp", 3, "member-1", [("member-1", kg.consumer_assignment({t: [0, 1]}))])
    if api == kg.DESCRIBE_GROUPS:
        return kg.describe_groups_request(v, ["grp", "grp2"], include_ops=v >= 3)
    if api == kg.LIST_GROUPS:
        return kg.list_groups_request(v, ["Stable"] if v >= 4 else None, ["classic"] if v >= 5 else None)
    if api == kg.OFFSET_FOR_LEADER_EPOCH:
        return kg.offset_for_leader_epoch_request(v, {t: {0: (2, 1), 4: (-1, 0)}})
    if api == kg.DELETE_GROUPS:
        return kg.delete_groups_request(v, ["grp", "grp2"])
    if api == kg.OFFSET_DELETE:
        return kg.offset_delete_request(v, "grp", {t: [0, 2]})
    raise AssertionError(api)


# kafka-python has no classes for the consumer group protocol's APIs (KIP-848): their
# encoders are checked against the broker's decoder instead, in test_group_apis, where every
# field is answered (a misplaced one would be INVALID_REQUEST or a failed decode).
CASES = [(api, v) for api in sorted(kg.ENCODER_RANGES) if api in CLASS_NAMES
         for v in range(kg.ENCODER_RANGES[api][0], kg.ENCODER_RANGES[api][1] + 1)]


@pytest.mark.parametrize("api,v", CASES, ids=[f"{kg.NAMES[a]}-v{v}" for a, v in CASES])
def test_group_request_matches_schema(api, v):
    cls = klass(CLASS_NAMES[api])
    mine = kp.request_header(api, v, 42) + build(api, v)
    decoded = cls.decode(mine, version=v, header=True)
    again = bytes(decoded.encode(version=v, header=True))
    assert again == mine, f"{kg.NAMES[api]} v{v}: {mine.hex()} vs kafka-python {again.hex()} ({decoded})"
