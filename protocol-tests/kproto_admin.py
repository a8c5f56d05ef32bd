"""Request encoders and response decoders for the admin APIs of issue 15 (AlterConfigs,
ElectLeaders, DescribeLogDirs, DescribeTopicPartitions) and manual replica assignments in
CreateTopics/CreatePartitions, written from Kafka's JSON schemas. Cross-checked against
kafka-python's classes in test_kproto_admin_crosscheck.py."""
import struct
from typing import Dict, List, Optional, Tuple

import kproto as kp
from kproto import R, W

ALTER_CONFIGS, DESCRIBE_LOG_DIRS, ELECT_LEADERS, DESCRIBE_TOPIC_PARTITIONS = 33, 35, 43, 75
# ListConfigResources (Kafka 4.1; v0 is KIP-714's ListClientMetricsResources).
LIST_CONFIG_RESOURCES = 74

NAMES = {
    ALTER_CONFIGS: "AlterConfigs", DESCRIBE_LOG_DIRS: "DescribeLogDirs", ELECT_LEADERS: "ElectLeaders",
    DESCRIBE_TOPIC_PARTITIONS: "DescribeTopicPartitions", LIST_CONFIG_RESOURCES: "ListConfigResources",
}
FLEX = {ALTER_CONFIGS: 2, DESCRIBE_LOG_DIRS: 2, ELECT_LEADERS: 2, DESCRIBE_TOPIC_PARTITIONS: 0,
        LIST_CONFIG_RESOURCES: 0}
ENCODER_RANGES = {ALTER_CONFIGS: (0, 2), DESCRIBE_LOG_DIRS: (1, 4), ELECT_LEADERS: (0, 2),
                  DESCRIBE_TOPIC_PARTITIONS: (0, 0), LIST_CONFIG_RESOURCES: (0, 1)}
kp.API_NAMES.update(NAMES)
kp.FLEX.update(FLEX)

INVALID_REPLICA_ASSIGNMENT = 39
ELECTION_NOT_NEEDED = 84
PREFERRED_LEADER_NOT_AVAILABLE = 80
ELIGIBLE_LEADERS_NOT_AVAILABLE = 83


def _w(api: int, v: int) -> W:
    return W(kp.is_flexible(api, v))


# AlterConfigs --------------------------------------------------------------

def alter_configs_request(v: int, resources: List[Tuple[int, str, Dict[str, Optional[str]]]],
                          validate_only: bool = False) -> bytes:
    w = _w(ALTER_CONFIGS, v)

    def cfg(w, item):
        w.string(item[0]).nullable_string(item[1]).tags()

    def res(w, item):
        w.i8(item[0]).string(item[1])
        w.array(list(item[2].items()), cfg)
        w.tags()

    w.array(resources, res)
    w.bool(validate_only)
    return w.tags().done()


def decode_alter_configs(r: R, v: int) -> dict:
    """AlterConfigs answers in IncrementalAlterConfigs' shape."""
    return kp.decode_incremental_alter_configs(r, v)


# CreateTopics / CreatePartitions with manual assignments ---------------------

def create_topics_assigned_request(v: int, name: str, assignment: Dict[int, List[int]],
                                   num_partitions: int = -1, replication_factor: int = -1,
                                   validate_only: bool = False) -> bytes:
    w = W(kp.is_flexible(kp.CREATE_TOPICS, v))

    def asg(w, item):
        w.i32(item[0])
        w.array(item[1], lambda w, b: w.i32(b))
        w.tags()

    def topic(w, _):
        w.string(name).i32(num_partitions).i16(replication_factor)
        w.array(sorted(assignment.items()), asg)
        w.array([], lambda w, x: None)  # configs
        w.tags()

    w.array([None], topic)
    w.i32(30000)
    if v >= 1:
        w.bool(validate_only)
    return w.tags().done()


def create_partitions_assigned_request(v: int, name: str, count: int, assignments: Optional[List[List[int]]],
                                       validate_only: bool = False) -> bytes:
    w = W(kp.is_flexible(kp.CREATE_PARTITIONS, v))

    def asg(w, brokers):
        w.array(brokers, lambda w, b: w.i32(b))
        w.tags()

    def topic(w, _):
        w.string(name).i32(count)
        w.array(assignments, asg)
        w.tags()

    w.array([None], topic)
    w.i32(30000).bool(validate_only)
    return w.tags().done()


# ElectLeaders --------------------------------------------------------------

def elect_leaders_request(v: int, partitions: Optional[Dict[str, List[int]]], election_type: int = 0,
                          timeout_ms: int = 30000) -> bytes:
    w = _w(ELECT_LEADERS, v)
    if v >= 1:
        w.i8(election_type)

    def topic(w, item):
        w.string(item[0])
        w.array(item[1], lambda w, p: w.i32(p))
        w.tags()

    w.array(None if partitions is None else sorted(partitions.items()), topic)
    w.i32(timeout_ms)
    return w.tags().done()


def decode_elect_leaders(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32()}
    out["error_code"] = r.i16() if v >= 1 else 0

    def part(rr):
        p = (rr.i32(), rr.i16(), rr.nullable_string())
        rr.tags()
        return p

    def topic(rr):
        t = rr.string()
        ps = rr.array(part)
        rr.tags()
        return t, ps

    out["results"] = {(t, p): (e, m) for t, ps in r.array(topic) for p, e, m in ps}
    r.tags()
    r.end()
    return out


# DescribeLogDirs -----------------------------------------------------------

def describe_log_dirs_request(v: int, topics: Optional[Dict[str, List[int]]]) -> bytes:
    w = _w(DESCRIBE_LOG_DIRS, v)

    def topic(w, item):
        w.string(item[0])
        w.array(item[1], lambda w, p: w.i32(p))
        w.tags()

    w.array(None if topics is None else sorted(topics.items()), topic)
    return w.tags().done()


def decode_describe_log_dirs(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32()}
    out["error_code"] = r.i16() if v >= 3 else 0

    def part(rr):
        p = {"partition": rr.i32(), "size": rr.i64(), "offset_lag": rr.i64(), "is_future": rr.bool()}
        rr.tags()
        return p

    def topic(rr):
        t = {"name": rr.string(), "partitions": rr.array(part)}
        rr.tags()
        return t

    def result(rr):
        d = {"error_code": rr.i16(), "log_dir": rr.string(), "topics": rr.array(topic)}
        if v >= 4:
            d["total_bytes"], d["usable_bytes"] = rr.i64(), rr.i64()
        rr.tags()
        return d

    out["results"] = r.array(result)
    r.tags()
    r.end()
    return out


# DescribeTopicPartitions ---------------------------------------------------

def describe_topic_partitions_request(v: int, topics: List[str], limit: int = 2000,
                                      cursor: Optional[Tuple[str, int]] = None) -> bytes:
    w = _w(DESCRIBE_TOPIC_PARTITIONS, v)

    def topic(w, name):
        w.string(name).tags()

    w.array(topics, topic)
    w.i32(limit)
    if cursor is None:
        w.i8(-1)  # null cursor
    else:
        w.i8(1)
        w.string(cursor[0]).i32(cursor[1]).tags()
    return w.tags().done()


def decode_describe_topic_partitions(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32()}

    def ints(rr):
        return rr.array(lambda x: x.i32())

    def part(rr):
        p = {"error_code": rr.i16(), "partition": rr.i32(), "leader": rr.i32(), "leader_epoch": rr.i32(),
             "replicas": ints(rr), "isr": ints(rr), "eligible_leader_replicas": ints(rr),
             "last_known_elr": ints(rr), "offline_replicas": ints(rr)}
        rr.tags()
        return p

    def topic(rr):
        t = {"error_code": rr.i16(), "name": rr.string(), "topic_id": rr.uuid(), "is_internal": rr.bool(),
             "partitions": rr.array(part), "authorized_operations": rr.i32()}
        rr.tags()
        return t

    out["topics"] = r.array(topic)
    if r.i8() == -1:
        out["next_cursor"] = None
    else:
        out["next_cursor"] = (r.string(), r.i32())
        r.tags()
    r.tags()
    r.end()
    return out


# Partition reassignment, client quotas, DescribeProducers ------------------

ALTER_PARTITION_REASSIGNMENTS, LIST_PARTITION_REASSIGNMENTS = 45, 46
DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS, DESCRIBE_PRODUCERS = 48, 49, 61
kp.API_NAMES.update({ALTER_PARTITION_REASSIGNMENTS: "AlterPartitionReassignments",
                     LIST_PARTITION_REASSIGNMENTS: "ListPartitionReassignments",
                     DESCRIBE_CLIENT_QUOTAS: "DescribeClientQuotas", ALTER_CLIENT_QUOTAS: "AlterClientQuotas",
                     DESCRIBE_PRODUCERS: "DescribeProducers"})
kp.FLEX.update({ALTER_PARTITION_REASSIGNMENTS: 0, LIST_PARTITION_REASSIGNMENTS: 0, DESCRIBE_CLIENT_QUOTAS: 1,
                ALTER_CLIENT_QUOTAS: 1, DESCRIBE_PRODUCERS: 0})
ENCODER_RANGES.update({ALTER_PARTITION_REASSIGNMENTS: (0, 0), LIST_PARTITION_REASSIGNMENTS: (0, 0),
                       DESCRIBE_CLIENT_QUOTAS: (0, 1), ALTER_CLIENT_QUOTAS: (0, 1), DESCRIBE_PRODUCERS: (0, 0)})
NO_REASSIGNMENT_IN_PROGRESS = 85
INVALID_REQUEST = 42


def _ints(w, xs):
    w.array(xs, lambda w, b: w.i32(b))


def _read_ints(rr):
    return rr.array(lambda x: x.i32())


def alter_partition_reassignments_request(v: int, moves: Dict[Tuple[str, int], Optional[List[int]]]) -> bytes:
    w = _w(ALTER_PARTITION_REASSIGNMENTS, v)
    w.i32(30000)
    by_topic: Dict[str, list] = {}
    for (t, p), r in sorted(moves.items()):
        by_topic.setdefault(t, []).append((p, r))

    def part(w, item):
        w.i32(item[0])
        w.array(item[1], lambda w, b: w.i32(b))
        w.tags()

    def topic(w, item):
        w.string(item[0])
        w.array(item[1], part)
        w.tags()

    w.array(sorted(by_topic.items()), topic)
    return w.tags().done()


def decode_alter_partition_reassignments(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.nullable_string()}

    def part(rr):
        p = (rr.i32(), rr.i16(), rr.nullable_string())
        rr.tags()
        return p

    def topic(rr):
        t = rr.string()
        ps = rr.array(part)
        rr.tags()
        return t, ps

    out["results"] = {(t, p): e for t, ps in r.array(topic) for p, e, _m in ps}
    r.tags()
    r.end()
    return out


def list_partition_reassignments_request(v: int, topics: Optional[Dict[str, List[int]]]) -> bytes:
    w = _w(LIST_PARTITION_REASSIGNMENTS, v)
    w.i32(30000)

    def topic(w, item):
        w.string(item[0])
        _ints(w, item[1])
        w.tags()

    w.array(None if topics is None else sorted(topics.items()), topic)
    return w.tags().done()


def decode_list_partition_reassignments(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.nullable_string()}

    def part(rr):
        p = (rr.i32(), _read_ints(rr), _read_ints(rr), _read_ints(rr))
        rr.tags()
        return p

    def topic(rr):
        t = rr.string()
        ps = rr.array(part)
        rr.tags()
        return t, ps

    out["ongoing"] = {(t, p[0]): p[1:] for t, ps in r.array(topic) for p in ps}
    r.tags()
    r.end()
    return out


def describe_client_quotas_request(v: int, components: List[Tuple[str, int, Optional[str]]],
                                   strict: bool = False) -> bytes:
    w = _w(DESCRIBE_CLIENT_QUOTAS, v)

    def comp(w, item):
        w.string(item[0]).i8(item[1]).nullable_string(item[2])
        w.tags()

    w.array(components, comp)
    w.bool(strict)
    return w.tags().done()


def decode_describe_client_quotas(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.nullable_string()}

    def ent(rr):
        e = (rr.string(), rr.nullable_string())
        rr.tags()
        return e

    def val(rr):
        k, x = rr.string(), struct.unpack(">d", rr._take(8))[0]
        rr.tags()
        return k, x

    def entry(rr):
        e = tuple(rr.array(ent))
        vals = dict(rr.array(val))
        rr.tags()
        return e, vals

    entries = r.array(entry)
    out["entries"] = None if entries is None else dict(entries)
    r.tags()
    r.end()
    return out


def alter_client_quotas_request(v: int, entries: List[Tuple[List[Tuple[str, Optional[str]]], List[Tuple[str, float, bool]]]],
                                validate_only: bool = False) -> bytes:
    w = _w(ALTER_CLIENT_QUOTAS, v)

    def ent(w, item):
        w.string(item[0]).nullable_string(item[1])
        w.tags()

    def op(w, item):
        w.string(item[0])
        w.raw(struct.pack(">d", item[1]))
        w.bool(item[2])
        w.tags()

    def entry(w, item):
        w.array(item[0], ent)
        w.array(item[1], op)
        w.tags()

    w.array(entries, entry)
    w.bool(validate_only)
    return w.tags().done()


def decode_alter_client_quotas(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32()}

    def ent(rr):
        e = (rr.string(), rr.nullable_string())
        rr.tags()
        return e

    def entry(rr):
        code, msg = rr.i16(), rr.nullable_string()
        e = tuple(rr.array(ent))
        rr.tags()
        return e, (code, msg)

    out["results"] = dict(r.array(entry))
    r.tags()
    r.end()
    return out


def describe_producers_request(v: int, topics: Dict[str, List[int]]) -> bytes:
    w = _w(DESCRIBE_PRODUCERS, v)

    def topic(w, item):
        w.string(item[0])
        _ints(w, item[1])
        w.tags()

    w.array(sorted(topics.items()), topic)
    return w.tags().done()


def decode_describe_producers(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32()}

    def prod(rr):
        p = {"producer_id": rr.i64(), "producer_epoch": rr.i32(), "last_sequence": rr.i32(),
             "last_timestamp": rr.i64(), "coordinator_epoch": rr.i32(), "current_txn_start_offset": rr.i64()}
        rr.tags()
        return p

    def part(rr):
        p = (rr.i32(), rr.i16(), rr.nullable_string(), rr.array(prod))
        rr.tags()
        return p

    def topic(rr):
        t = rr.string()
        ps = rr.array(part)
        rr.tags()
        return t, ps

    out["partitions"] = {(t, p[0]): (p[1], p[3]) for t, ps in r.array(topic) for p in ps}
    r.tags()
    r.end()
    return out


# DescribeAcls / CreateAcls / DeleteAcls (issue 14) ---------------------------
# A binding is (resource_type, name, pattern_type, principal, host, operation, permission); a
# filter the same with None for "any name/principal/host".

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
kp.API_NAMES.update({DESCRIBE_ACLS: "DescribeAcls", CREATE_ACLS: "CreateAcls", DELETE_ACLS: "DeleteAcls"})
kp.FLEX.update({DESCRIBE_ACLS: 2, CREATE_ACLS: 2, DELETE_ACLS: 2})
ENCODER_RANGES.update({DESCRIBE_ACLS: (1, 3), CREATE_ACLS: (1, 3), DELETE_ACLS: (1, 3)})
SECURITY_DISABLED = 54


def _acl_filter(w: W, f) -> None:
    rtype, name, pattern, principal, host, op, perm = f
    w.i8(rtype).nullable_string(name).i8(pattern).nullable_string(principal).nullable_string(host).i8(op).i8(perm)


def create_acls_request(v: int, bindings) -> bytes:
    w = _w(CREATE_ACLS, v)

    def one(w, b):
        rtype, name, pattern, principal, host, op, perm = b
        w.i8(rtype).string(name).i8(pattern).string(principal).string(host).i8(op).i8(perm).tags()
    return w.array(bindings, one).tags().done()


def decode_create_acls(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32()}
    out["results"] = r.array(lambda rr: _tagged(rr, {"error_code": rr.i16(), "error_message": rr.string()}))
    r.tags()
    return out


def _tagged(rr: R, d: dict) -> dict:
    rr.tags()
    return d


def describe_acls_request(v: int, f) -> bytes:
    w = _w(DESCRIBE_ACLS, v)
    _acl_filter(w, f)
    return w.tags().done()


def decode_describe_acls(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16(), "error_message": r.string()}

    def acl(rr):
        return _tagged(rr, {"principal": rr.string(), "host": rr.string(), "operation": rr.i8(),
                            "permission_type": rr.i8()})

    def resource(rr):
        return _tagged(rr, {"resource_type": rr.i8(), "resource_name": rr.string(), "pattern_type": rr.i8(),
                            "acls": rr.array(acl)})
    out["resources"] = r.array(resource)
    r.tags()
    return out


def delete_acls_request(v: int, filters) -> bytes:
    w = _w(DELETE_ACLS, v)

    def one(w, f):
        _acl_filter(w, f)
        w.tags()
    return w.array(filters, one).tags().done()


def decode_delete_acls(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32()}

    def matching(rr):
        return _tagged(rr, {"error_code": rr.i16(), "error_message": rr.string(), "resource_type": rr.i8(),
                            "resource_name": rr.string(), "pattern_type": rr.i8(), "principal": rr.string(),
                            "host": rr.string(), "operation": rr.i8(), "permission_type": rr.i8()})

    def result(rr):
        return _tagged(rr, {"error_code": rr.i16(), "error_message": rr.string(), "matching_acls": rr.array(matching)})
    out["filter_results"] = r.array(result)
    r.tags()
    return out


# AlterReplicaLogDirs -------------------------------------------------------

ALTER_REPLICA_LOG_DIRS = 34
kp.API_NAMES[ALTER_REPLICA_LOG_DIRS] = "AlterReplicaLogDirs"
kp.FLEX[ALTER_REPLICA_LOG_DIRS] = 2
ENCODER_RANGES[ALTER_REPLICA_LOG_DIRS] = (0, 2)
REPLICA_NOT_AVAILABLE = 9
KAFKA_STORAGE_ERROR = 56
LOG_DIR_NOT_FOUND = 57


def alter_replica_log_dirs_request(v: int, moves: Dict[str, Dict[str, List[int]]]) -> bytes:
    """moves: destination dir -> topic -> partitions."""
    w = _w(ALTER_REPLICA_LOG_DIRS, v)

    def topic(w, item):
        w.string(item[0])
        _ints(w, item[1])
        w.tags()

    def directory(w, item):
        w.string(item[0])
        w.array(sorted(item[1].items()), topic)
        w.tags()

    w.array(sorted(moves.items()), directory)
    return w.tags().done()


def decode_alter_replica_log_dirs(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32()}

    def part(rr):
        p = (rr.i32(), rr.i16())
        rr.tags()
        return p

    def topic(rr):
        t = rr.string()
        ps = rr.array(part)
        rr.tags()
        return t, ps

    out["results"] = {(t, p): e for t, ps in r.array(topic) for p, e in ps}
    r.tags()
    r.end()
    return out


# ListConfigResources ---------------------------------------------------------

def list_config_resources_request(v: int, resource_types: Optional[List[int]] = None) -> bytes:
    w = _w(LIST_CONFIG_RESOURCES, v)
    if v >= 1:
        w.array(resource_types or [], lambda w, t: w.i8(t))
    return w.tags().done()


def decode_list_config_resources(r: R, v: int) -> dict:
    out = {"throttle_time_ms": r.i32(), "error_code": r.i16()}

    def res(rr):
        name = rr.string()
        rtype = rr.i8() if v >= 1 else 16
        rr.tags()
        return (name, rtype)

    out["resources"] = r.array(res) or []
    r.tags()
    r.end()
    return out
