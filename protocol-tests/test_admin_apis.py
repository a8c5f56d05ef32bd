"""The admin APIs of issue 15 by hand-built frames, at the lowest and highest advertised
version: AlterConfigs, manual replica assignments in CreateTopics/CreatePartitions."""
import pytest

import kproto as kp
import kproto_admin as ka
from gregor_harness import wait_until
from test_apis import new_topic, topic_name, wait_leader


def versions(broker, api):
    lo, hi = broker.api_versions[api]
    return [lo, hi] if lo != hi else [lo]


def describe(c, name, keys=None):
    r = c.call(kp.DESCRIBE_CONFIGS, 1, kp.describe_configs_request(1, [(kp.RESOURCE_TOPIC, name, keys)]))
    [res] = kp.decode_describe_configs(r, 1)["results"]
    return {x["name"]: (x["value"], x["config_source"]) for x in res["configs"]}


@pytest.mark.parametrize("which", ["min", "max"])
def test_alter_configs_replaces_the_override_set(broker, which):
    lo, hi = broker.api_versions[ka.ALTER_CONFIGS]
    v = lo if which == "min" else hi
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c)

        def alter(configs, validate_only=False, rtype=kp.RESOURCE_TOPIC, target=name):
            r = c.call(ka.ALTER_CONFIGS, v, ka.alter_configs_request(v, [(rtype, target, configs)], validate_only))
            [res] = ka.decode_alter_configs(r, v)["responses"]
            assert (res["resource_type"], res["resource_name"]) == (rtype, target), res
            return res["error_code"]

        assert alter({"retention.ms": "3600000", "cleanup.policy": "compact"}) == 0
        got = describe(c, name)
        assert got["retention.ms"] == ("3600000", 1) and got["cleanup.policy"] == ("compact", 1), got
        # the whole set is replaced: retention.ms goes back to the default
        assert alter({"segment.bytes": "1048576"}) == 0
        got = describe(c, name)
        assert got["segment.bytes"] == ("1048576", 1), got
        assert got["retention.ms"][1] == 5 and got["cleanup.policy"] == ("delete", 5), got
        # validate_only changes nothing; bad values and keys are refused with INVALID_CONFIG
        assert alter({"retention.ms": "1"}, validate_only=True) == 0
        assert describe(c, name)["retention.ms"][1] == 5
        assert alter({"cleanup.policy": "sometimes"}) == 40
        assert alter({"no.such.key": "1"}) == 40
        assert describe(c, name)["segment.bytes"] == ("1048576", 1)
        assert alter({"retention.ms": "1"}, target=topic_name("missing")) == 3


def test_manual_assignments_in_create_topics_and_create_partitions(broker):
    ct_hi = broker.api_versions[kp.CREATE_TOPICS][1]
    cp_lo, cp_hi = broker.api_versions[kp.CREATE_PARTITIONS]
    with kp.Conn(broker.host, broker.port) as c:
        def create(name, assignment, **kw):
            r = c.call(kp.CREATE_TOPICS, ct_hi, ka.create_topics_assigned_request(ct_hi, name, assignment, **kw))
            [t] = kp.decode_create_topics(r, ct_hi)["topics"]
            return t

        name = topic_name("manual")
        t = create(name, {0: [0], 1: [0]})
        assert t["error_code"] == 0 and (t.get("num_partitions"), t.get("replication_factor")) in \
            ((2, 1), (None, None)), t
        wait_leader(c, name, 2)
        for bad in ({0: [1]}, {0: [0, 0]}, {0: [0], 1: []}, {1: [0]}):
            assert create(topic_name("bad"), bad)["error_code"] == ka.INVALID_REPLICA_ASSIGNMENT, bad
        # partition counts and replication factor together with an assignment: INVALID_REQUEST
        assert create(topic_name("bad"), {0: [0]}, num_partitions=1)["error_code"] == 42

        for v in sorted({cp_lo, cp_hi}):
            def add(count, assignments, validate_only=False):
                r = c.call(kp.CREATE_PARTITIONS, v,
                           ka.create_partitions_assigned_request(v, name, count, assignments, validate_only))
                [res] = kp.decode_create_partitions(r, v)["results"]
                return res["error_code"], res["error_message"]

            have = len(kp.metadata(c, [name], version=9)["topics"][0]["partitions"])
            for bad in ([[1]], [[0, 0]], [[0], [0]], [[]]):
                err, msg = add(have + 1, bad)
                assert err == ka.INVALID_REPLICA_ASSIGNMENT, (bad, err, msg)
            assert add(have + 1, [[0]], validate_only=True) == (0, None)
            assert add(have + 1, [[0]])[0] == 0
            wait_leader(c, name, have + 1)
            md = kp.metadata(c, [name], version=9)["topics"][0]
            assert [p["replica_nodes"] for p in sorted(md["partitions"], key=lambda p: p["partition_index"])] == \
                [[0]] * (have + 1), md


@pytest.mark.parametrize("which", ["min", "max"])
def test_elect_leaders_on_a_single_broker(broker, which):
    lo, hi = broker.api_versions[ka.ELECT_LEADERS]
    v = lo if which == "min" else hi
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c, 2)
        missing = topic_name("missing")
        r = ka.decode_elect_leaders(c.call(ka.ELECT_LEADERS, v, ka.elect_leaders_request(
            v, {name: [0, 1, 7], missing: [0]})), v)
        assert r["error_code"] == 0, r
        codes = {tp: e for tp, (e, _m) in r["results"].items()}
        # the only broker already leads (it is every partition's preferred replica)
        assert codes == {(name, 0): ka.ELECTION_NOT_NEEDED, (name, 1): ka.ELECTION_NOT_NEEDED,
                         (name, 7): 3, (missing, 0): 3}, r
        # all partitions: those that needed no election are left out
        r = ka.decode_elect_leaders(c.call(ka.ELECT_LEADERS, v, ka.elect_leaders_request(v, None)), v)
        assert r["error_code"] == 0 and r["results"] == {}, r
        if v >= 1:
            r = ka.decode_elect_leaders(c.call(ka.ELECT_LEADERS, v, ka.elect_leaders_request(
                v, {name: [0]}, election_type=1)), v)
            assert {tp: e for tp, (e, _m) in r["results"].items()} == {(name, 0): ka.ELECTION_NOT_NEEDED}, r
            r = ka.decode_elect_leaders(c.call(ka.ELECT_LEADERS, v, ka.elect_leaders_request(
                v, {name: [0]}, election_type=5)), v)
            assert r["error_code"] == 42, r


@pytest.mark.parametrize("which", ["min", "max"])
def test_describe_log_dirs_reports_partition_sizes(broker, which):
    lo, hi = broker.api_versions[ka.DESCRIBE_LOG_DIRS]
    v = lo if which == "min" else hi
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c, 2)
        batch = kp.build_batch([kp.Record(value=b"x" * 500, key=b"k")] * 4)
        assert kp.produce(c, name, 1, batch)["error_code"] == 0
        r = ka.decode_describe_log_dirs(c.call(ka.DESCRIBE_LOG_DIRS, v, ka.describe_log_dirs_request(v, None)), v)
        assert r["error_code"] == 0, r
        [d] = r["results"]
        assert d["error_code"] == 0 and d["log_dir"] == str(broker.data_dir), d
        if v >= 4:
            assert d["total_bytes"] > 0 and 0 <= d["usable_bytes"] <= d["total_bytes"], d
        sizes = {(t["name"], p["partition"]): p["size"] for t in d["topics"] for p in t["partitions"]}
        on_disk = sum(f.stat().st_size for f in (broker.data_dir / f"{name}-1").glob("*.log"))
        assert sizes[(name, 0)] == 0 and sizes[(name, 1)] == on_disk == len(batch), (sizes, on_disk)
        assert all(not p["is_future"] and p["offset_lag"] == 0 for t in d["topics"] for p in t["partitions"])
        # only what was asked for
        r = ka.decode_describe_log_dirs(c.call(ka.DESCRIBE_LOG_DIRS, v, ka.describe_log_dirs_request(
            v, {name: [1], topic_name("missing"): [0]})), v)
        [d] = r["results"]
        assert [(t["name"], [p["partition"] for p in t["partitions"]]) for t in d["topics"]] == [(name, [1])], d


def broker_view(c, name, keys=None):
    r = c.call(kp.DESCRIBE_CONFIGS, 1, kp.describe_configs_request(1, [(kp.RESOURCE_BROKER, name, keys)]))
    [res] = kp.decode_describe_configs(r, 1)["results"]
    assert res["error_code"] == 0, res
    return {x["name"]: (x["value"], x["config_source"], x["read_only"]) for x in res["configs"]}


def test_dynamic_broker_configs_and_their_sources(broker):
    v = broker.api_versions[ka.ALTER_CONFIGS][1]
    with kp.Conn(broker.host, broker.port) as c:
        def alter(name, configs):
            r = c.call(ka.ALTER_CONFIGS, v, ka.alter_configs_request(v, [(kp.RESOURCE_BROKER, name, configs)]))
            [res] = ka.decode_alter_configs(r, v)["responses"]
            return res["error_code"]

        got = broker_view(c, "0")
        # set by the harness: static; never set: Kafka's default; broker.id is read-only
        assert got["broker.id"] == ("0", 4, True), got["broker.id"]
        assert got["log.retention.ms"][1:] == (5, False), got["log.retention.ms"]
        assert got["num.io.threads"][1] == 5, got["num.io.threads"]
        assert alter("", {"log.retention.ms": "3600000"}) == 0
        assert broker_view(c, "0", ["log.retention.ms"])["log.retention.ms"] == ("3600000", 3, False)
        assert broker_view(c, "")["log.retention.ms"] == ("3600000", 3, False)
        name = new_topic(c)
        assert describe(c, name, ["retention.ms"])["retention.ms"] == ("3600000", 3)
        assert alter("0", {"log.retention.ms": "7200000"}) == 0
        assert broker_view(c, "0", ["log.retention.ms"])["log.retention.ms"] == ("7200000", 2, False)
        # static-only keys, bad values and other brokers' ids are refused: INVALID_REQUEST, as
        # Kafka's ZkAdminManager answers a broker config's ConfigException
        assert alter("", {"broker.id": "5"}) == 42
        assert alter("", {"log.retention.ms": "soon"}) == 42
        assert alter("7", {"log.retention.ms": "1"}) == 42
        # AlterConfigs replaces the entity: without the key it falls back to the default entity
        assert alter("0", {}) == 0
        assert broker_view(c, "0", ["log.retention.ms"])["log.retention.ms"] == ("3600000", 3, False)


def test_partition_reassignment_on_a_single_broker(broker):
    """Standalone, a partition can only stay where it is: a move to its own replicas is done at
    once, anything else is refused as Kafka refuses it; nothing is ever in flight."""
    me = broker.broker_id
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c, 2)
        missing = topic_name("missing")
        r = ka.decode_alter_partition_reassignments(c.call(ka.ALTER_PARTITION_REASSIGNMENTS, 0,
            ka.alter_partition_reassignments_request(0, {(name, 0): [me], (name, 1): None, (name, 7): [me],
                                                         (missing, 0): [me]})), 0)
        assert (r["error_code"], r["error_message"]) == (0, None), r
        assert r["results"] == {(name, 0): 0, (name, 1): ka.NO_REASSIGNMENT_IN_PROGRESS, (name, 7): 3,
                                (missing, 0): 3}, r
        r = ka.decode_alter_partition_reassignments(c.call(ka.ALTER_PARTITION_REASSIGNMENTS, 0,
            ka.alter_partition_reassignments_request(0, {(name, 0): [me, me], (name, 1): [me + 7]})), 0)
        assert r["results"] == {(name, 0): ka.INVALID_REPLICA_ASSIGNMENT, (name, 1): ka.INVALID_REPLICA_ASSIGNMENT}, r
        for topics in (None, {name: [0, 1]}):
            r = ka.decode_list_partition_reassignments(c.call(ka.LIST_PARTITION_REASSIGNMENTS, 0,
                ka.list_partition_reassignments_request(0, topics)), 0)
            assert (r["error_code"], r["error_message"], r["ongoing"]) == (0, None, {}), r
        # the partition still answers at its leader epoch
        assert kp.produce(c, name, 0, kp.build_batch([kp.Record(value=b"x")]))["error_code"] == 0


@pytest.mark.parametrize("which", ["min", "max"])
def test_client_quotas_alter_and_describe(broker, which):
    lo, hi = broker.api_versions[ka.ALTER_CLIENT_QUOTAS]
    v = lo if which == "min" else hi
    client = topic_name("client")
    with kp.Conn(broker.host, broker.port) as c:
        def alter(entries, validate_only=False):
            return ka.decode_alter_client_quotas(c.call(ka.ALTER_CLIENT_QUOTAS, v, ka.alter_client_quotas_request(
                v, entries, validate_only)), v)["results"]

        def describe(components, strict=False):
            return ka.decode_describe_client_quotas(c.call(ka.DESCRIBE_CLIENT_QUOTAS, v,
                ka.describe_client_quotas_request(v, components, strict)), v)

        ent = [("client-id", client)]
        assert alter([(ent, [("producer_byte_rate", 2048.0, False)])], validate_only=True) == {
            (("client-id", client),): (0, None)}
        assert describe([("client-id", 0, client)])["entries"] == {}
        assert alter([(ent, [("producer_byte_rate", 2048.0, False), ("consumer_byte_rate", 4096.0, False)]),
                      ([("user", None), ("client-id", None)], [("consumer_byte_rate", 1e9, False)])]) == {
            (("client-id", client),): (0, None), (("user", None), ("client-id", None)): (0, None)}
        got = describe([("client-id", 0, client)], strict=True)
        assert got["error_code"] == 0 and got["entries"] == {
            (("client-id", client),): {"producer_byte_rate": 2048.0, "consumer_byte_rate": 4096.0}}, got
        # default user and default client: match type 1 (default) on both
        got = describe([("user", 1, None), ("client-id", 1, None)], strict=True)["entries"]
        assert got == {(("user", None), ("client-id", None)): {"consumer_byte_rate": 1e9}}, got
        # removing a key
        assert alter([(ent, [("consumer_byte_rate", 0.0, True)])]) == {(("client-id", client),): (0, None)}
        assert describe([("client-id", 0, client)])["entries"] == {
            (("client-id", client),): {"producer_byte_rate": 2048.0}}
        # what this broker cannot enforce, or Kafka refuses
        for key, value in (("request_percentage", 50.0), ("connection_creation_rate", 5.0), ("bogus", 1.0),
                           ("producer_byte_rate", 1.5), ("producer_byte_rate", -3.0)):
            [(code, msg)] = alter([(ent, [(key, value, False)])]).values()
            assert code == ka.INVALID_REQUEST and msg, (key, value, code, msg)
        [(code, _)] = alter([([("ip", None)], [("connection_creation_rate", 5.0, False)])]).values()
        assert code == ka.INVALID_REQUEST
        assert describe([("client-id", 0, client)])["entries"] == {
            (("client-id", client),): {"producer_byte_rate": 2048.0}}
        bad = describe([("nonsense", 2, None)])
        assert bad["error_code"] == ka.INVALID_REQUEST and bad["entries"] is None, bad


def test_describe_producers_of_a_partition(broker):
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c, 2)
        batch = kp.build_batch([kp.Record(value=b"a"), kp.Record(value=b"b"), kp.Record(value=b"c")],
                               base_timestamp=1_700_000_000_000, producer_id=4242, producer_epoch=3, base_sequence=0)
        assert kp.produce(c, name, 0, batch)["error_code"] == 0
        r = ka.decode_describe_producers(c.call(ka.DESCRIBE_PRODUCERS, 0,
            ka.describe_producers_request(0, {name: [0, 1, 9]})), 0)
        assert r["partitions"][(name, 1)] == (0, [])
        assert r["partitions"][(name, 9)][0] == 3
        code, [p] = r["partitions"][(name, 0)]
        assert code == 0 and (p["producer_id"], p["producer_epoch"], p["last_sequence"]) == (4242, 3, 2), p
        assert p["last_timestamp"] >= 1_700_000_000_000 and p["coordinator_epoch"] == -1, p
        assert p["current_txn_start_offset"] == -1, p


# ACLs (issue 14) ------------------------------------------------------------------------------

TOPIC, GROUP, ANY, LITERAL, PREFIXED, MATCH = 2, 3, 1, 3, 4, 2
READ, WRITE, ALLOW, DENY = 3, 4, 3, 2


@pytest.mark.parametrize("which", ["min", "max"])
def test_acls_created_described_and_deleted_by_filter(broker_factory, which):
    # The harness's PLAINTEXT client is User:ANONYMOUS: a super user here.
    b = broker_factory({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                        "super.users": "User:ANONYMOUS"})
    lo, hi = b.api_versions[ka.CREATE_ACLS]
    v = lo if which == "min" else hi
    for api in (ka.DESCRIBE_ACLS, ka.DELETE_ACLS):
        assert b.api_versions[api] == (lo, hi)
    with kp.Conn(b.host, b.port) as c:
        bindings = [(TOPIC, "orders", LITERAL, "User:alice", "*", READ, ALLOW),
                    (TOPIC, "ord", PREFIXED, "User:alice", "*", WRITE, ALLOW),
                    (GROUP, "g", LITERAL, "User:bob", "10.0.0.1", READ, DENY),
                    (ANY, "x", LITERAL, "User:alice", "*", READ, ALLOW),      # no resource type
                    (TOPIC, "x", MATCH, "User:alice", "*", READ, ALLOW),      # MATCH is a filter only
                    (TOPIC, "x", LITERAL, "alice", "*", READ, ALLOW)]         # no principal type
        r = ka.decode_create_acls(c.call(ka.CREATE_ACLS, v, ka.create_acls_request(v, bindings)), v)
        assert [x["error_code"] for x in r["results"]] == [0, 0, 0, 42, 42, 42]

        def describe(f):
            r = ka.decode_describe_acls(c.call(ka.DESCRIBE_ACLS, v, ka.describe_acls_request(v, f)), v)
            assert r["error_code"] == 0, r
            return sorted((x["resource_type"], x["resource_name"], x["pattern_type"], a["principal"], a["host"],
                           a["operation"], a["permission_type"]) for x in r["resources"] for a in x["acls"])
        everything = (ANY, None, ANY, None, None, ANY, ANY)
        assert describe(everything) == sorted(bindings[:3])
        # MATCH: every pattern that covers the topic "orders" (the literal and the prefix).
        assert describe((TOPIC, "orders", MATCH, None, None, ANY, ANY)) == sorted(bindings[:2])
        assert describe((ANY, None, ANY, "User:bob", None, ANY, ANY)) == [bindings[2]]

        filters = [(TOPIC, "ord", PREFIXED, None, None, ANY, ANY), (ANY, None, ANY, None, None, 0, ANY)]
        r = ka.decode_delete_acls(c.call(ka.DELETE_ACLS, v, ka.delete_acls_request(v, filters)), v)
        deleted, refused = r["filter_results"]
        assert deleted["error_code"] == 0
        assert [(m["resource_name"], m["pattern_type"], m["operation"]) for m in deleted["matching_acls"]] == [
            ("ord", PREFIXED, WRITE)]
        assert refused["error_code"] == 42 and refused["matching_acls"] == []
        assert describe(everything) == sorted([bindings[0], bindings[2]])


def test_acl_apis_without_an_authorizer_answer_security_disabled(broker):
    lo, hi = broker.api_versions[ka.CREATE_ACLS]
    with kp.Conn(broker.host, broker.port) as c:
        for v in (lo, hi):
            r = ka.decode_create_acls(c.call(ka.CREATE_ACLS, v, ka.create_acls_request(
                v, [(TOPIC, "t", LITERAL, "User:a", "*", READ, ALLOW)])), v)
            assert r["results"][0]["error_code"] == ka.SECURITY_DISABLED
            r = ka.decode_describe_acls(c.call(ka.DESCRIBE_ACLS, v, ka.describe_acls_request(
                v, (ANY, None, ANY, None, None, ANY, ANY))), v)
            assert r["error_code"] == ka.SECURITY_DISABLED
def two_dir_broker(broker_factory, tmp_path, **overrides):
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    return broker_factory({"log.dirs": ",".join(map(str, dirs)), **overrides}), [str(d) for d in dirs]


def log_dirs_view(c):
    """(topic, partition, is_future) -> (dir, size, offset lag), from DescribeLogDirs."""
    v = 4
    r = ka.decode_describe_log_dirs(c.call(ka.DESCRIBE_LOG_DIRS, v, ka.describe_log_dirs_request(v, None)), v)
    return {(t["name"], p["partition"], p["is_future"]): (d["log_dir"], p["size"], p["offset_lag"])
            for d in r["results"] for t in d["topics"] for p in t["partitions"]}


def leftovers(dirs):
    """Future and to-be-deleted directories still on disk."""
    from pathlib import Path
    return sorted(p.name for d in dirs for p in Path(d).iterdir() if p.name.endswith(("-future", "-delete")))


@pytest.mark.parametrize("which", ["min", "max"])
def test_alter_replica_log_dirs_moves_a_partition(broker_factory, tmp_path, which):
    b, dirs = two_dir_broker(broker_factory, tmp_path)
    lo, hi = b.api_versions[ka.ALTER_REPLICA_LOG_DIRS]
    v = lo if which == "min" else hi
    with kp.Conn(b.host, b.port) as c:
        name = new_topic(c, 2)
        for i in range(20):
            batch = kp.build_batch([kp.Record(value=b"%d" % i * 300, key=b"k%d" % i)] * 3)
            assert kp.produce(c, name, 0, batch)["error_code"] == 0
        before = [(r.offset, r.key, r.value) for r in kp.fetch_all(c, name, 0)]
        view = log_dirs_view(c)
        src = view[(name, 0, False)][0]
        dst = next(d for d in dirs if d != src)

        def alter(moves):
            return ka.decode_alter_replica_log_dirs(
                c.call(ka.ALTER_REPLICA_LOG_DIRS, v, ka.alter_replica_log_dirs_request(v, moves)), v)["results"]

        # Kafka's answers: a dir not in log.dirs, a partition this broker has no replica of, a
        # partition already in the dir asked for (nothing to do).
        moves = {"/not/a/log/dir": {name: [0]}}
        moves.setdefault(dst, {}).setdefault(name, []).append(7)
        moves.setdefault(view[(name, 1, False)][0], {}).setdefault(name, []).append(1)
        got = alter(moves)
        assert got == {(name, 0): ka.LOG_DIR_NOT_FOUND, (name, 7): ka.REPLICA_NOT_AVAILABLE, (name, 1): 0}, got
        assert alter({dst: {name: [0]}}) == {(name, 0): 0}

        def moved():
            now = log_dirs_view(c)
            done = now.get((name, 0, False), ("",))[0] == dst and (name, 0, True) not in now
            return done and not leftovers(dirs)
        wait_until(moved, 30, "the partition to be in its new log dir, with no future or old copy left")
        assert (tmp_path / "d1" / f"{name}-0").exists() == (dst == dirs[0])
        assert [(r.offset, r.key, r.value) for r in kp.fetch_all(c, name, 0)] == before
        # the moved log takes appends, and a second move brings it back
        assert kp.produce(c, name, 0, kp.build_batch([kp.Record(value=b"after")]))["base_offset"] == len(before)
        assert alter({src: {name: [0]}}) == {(name, 0): 0}
        wait_until(lambda: log_dirs_view(c).get((name, 0, False), ("",))[0] == src and not leftovers(dirs), 30,
                   "the partition back in its first dir")
        after = kp.fetch_all(c, name, 0)
        assert [(r.offset, r.key, r.value) for r in after[:-1]] == before and after[-1].value == b"after"


def test_kill_during_a_log_dir_move_loses_nothing(broker_factory, tmp_path):
    # A throttled copy of 600 KB in 64 KB chunks takes seconds: time to kill the broker mid-move.
    b, dirs = two_dir_broker(broker_factory, tmp_path, **{
        "replica.alter.log.dirs.io.max.bytes.per.second": "200000", "replica.fetch.max.bytes": "65536"})
    v = b.api_versions[ka.ALTER_REPLICA_LOG_DIRS][1]
    with kp.Conn(b.host, b.port) as c:
        name = new_topic(c, 1)
        for i in range(60):
            batch = kp.build_batch([kp.Record(value=bytes([i]) * 10000, key=b"k%d" % i)])
            assert kp.produce(c, name, 0, batch)["error_code"] == 0
        before = [(r.offset, r.value) for r in kp.fetch_all(c, name, 0)]
        src = log_dirs_view(c)[(name, 0, False)][0]
        dst = next(d for d in dirs if d != src)
        r = c.call(ka.ALTER_REPLICA_LOG_DIRS, v, ka.alter_replica_log_dirs_request(v, {dst: {name: [0]}}))
        assert ka.decode_alter_replica_log_dirs(r, v)["results"] == {(name, 0): 0}

        def mid_move():
            f = log_dirs_view(c).get((name, 0, True))
            return f is not None and f[0] == dst and f[1] > 0 and f[2] > 0
        wait_until(mid_move, 30, "DescribeLogDirs to show the future replica partly copied, lagging")
    assert [n for n in leftovers(dirs) if n.endswith("-future")], leftovers(dirs)
    b.restart(mode="kill")
    with kp.Conn(b.host, b.port) as c:
        wait_leader(c, name, 1)
        assert [(r.offset, r.value) for r in kp.fetch_all(c, name, 0)] == before
        wait_until(lambda: log_dirs_view(c).get((name, 0, False), ("",))[0] == dst and not leftovers(dirs), 30,
                   "the move to resume after the restart and complete")
        assert [(r.offset, r.value) for r in kp.fetch_all(c, name, 0)] == before


def test_describe_topic_partitions_pages_with_its_cursor(broker):
    v = broker.api_versions[ka.DESCRIBE_TOPIC_PARTITIONS][1]
    with kp.Conn(broker.host, broker.port) as c:
        prefix = topic_name("dtp")
        a, b_, c3, missing = (f"{prefix}-{x}" for x in "abcm")
        for name, n in ((a, 3), (b_, 2), (c3, 1)):
            new_topic(c, n, name)

        def dtp(topics, limit=2000, cursor=None):
            r = c.call(ka.DESCRIBE_TOPIC_PARTITIONS, v, ka.describe_topic_partitions_request(v, topics, limit, cursor))
            out = ka.decode_describe_topic_partitions(r, v)
            return [(t["name"], t["error_code"], [p["partition"] for p in t["partitions"]]) for t in out["topics"]], \
                out["next_cursor"], out

        # four partitions per page: all of a, the first of b, then the cursor at b's second
        got, cursor, raw = dtp([missing, c3, b_, a], limit=4)
        assert (got, cursor) == ([(a, 0, [0, 1, 2]), (b_, 0, [0])], (b_, 1)), raw
        t = raw["topics"][0]
        assert t["topic_id"] != bytes(16) and not t["is_internal"] and t["authorized_operations"] == 3576, t
        p = t["partitions"][0]
        assert p["leader"] == 0 and p["replicas"] == [0] and p["isr"] == [0] and p["offline_replicas"] == [], p
        got, cursor, raw = dtp([missing, c3, b_, a], limit=4, cursor=cursor)
        assert (got, cursor) == ([(b_, 0, [1]), (c3, 0, [0]), (missing, kp.UNKNOWN_TOPIC_OR_PARTITION, [])], None), raw
        # a page that ends exactly at a topic's end points at the next topic's start
        assert dtp([a, b_], limit=3)[:2] == ([(a, 0, [0, 1, 2])], (b_, 0))
        # the cursor's topic must be among those asked for
        got, cursor, _ = dtp([a, b_], cursor=(c3, 0))
        assert (got, cursor) == ([(a, ka.INVALID_REQUEST, []), (b_, ka.INVALID_REQUEST, [])], None), got
        # no topics: every topic from the cursor on, in name order, unknown ones never listed
        got, cursor, _ = dtp([], cursor=(b_, 1))
        assert got[:2] == [(b_, 0, [1]), (c3, 0, [0])] and cursor is None, got
        assert [n for n, _, _ in got] == sorted(n for n, _, _ in got)
        assert dtp([a], limit=0)[:2] == ([], (a, 0))
        assert dtp(["bad/name"])[0] == [("bad/name", kp.INVALID_TOPIC_EXCEPTION, [])]


def _alter_broker(c, name, configs):
    v = 2
    r = c.call(ka.ALTER_CONFIGS, v, ka.alter_configs_request(v, [(kp.RESOURCE_BROKER, name, configs)]))
    [res] = ka.decode_alter_configs(r, v)["responses"]
    return res["error_code"], res.get("error_message")


def _synonyms(c, name, key):
    v = 4
    r = c.call(kp.DESCRIBE_CONFIGS, v, kp.describe_configs_request(v, [(kp.RESOURCE_BROKER, name, [key])], True))
    [res] = kp.decode_describe_configs(r, v)["results"]
    [entry] = res["configs"]
    return entry["value"], entry["config_source"], [(s["name"], s["value"], s["source"]) for s in entry["synonyms"]]


def test_dynamic_connection_limits_apply_without_a_restart(broker_factory):
    from test_connection_limits import served, wait_for
    b = broker_factory({"max.connections.per.ip": "50"})
    with kp.Conn(b.host, b.port) as c:
        assert _alter_broker(c, "0", {"max.connections.per.ip": "3"})[0] == 0
        assert _synonyms(c, "0", "max.connections.per.ip") == (
            "3", 2, [("max.connections.per.ip", "3", 2), ("max.connections.per.ip", "50", 4),
                     ("max.connections.per.ip", "2147483647", 5)])
        # this connection is one of the three
        conns = [served(b) for _ in range(2)]
        assert all(conns)
        assert served(b) is None, "a fourth connection from 127.0.0.1 was served under the dynamic limit"
        for x in conns:
            x.close()
        # the cluster-wide default counts once the broker's own value is gone
        assert _alter_broker(c, "", {"max.connections.per.ip": "2"})[0] == 0
        assert _alter_broker(c, "0", {})[0] == 0
        assert _synonyms(c, "0", "max.connections.per.ip")[:2] == ("2", 3)
        one = wait_for(lambda: served(b), 10, "room for a second connection")
        assert served(b) is None, "a third connection was served under the cluster default of 2"
        one.close()
        assert _alter_broker(c, "", {})[0] == 0
        more = [wait_for(lambda: served(b), 10, "the static limit back") for _ in range(5)]
        for x in more:
            x.close()


def _cleaner_threads(b):
    from pathlib import Path
    return sum(1 for t in Path(f"/proc/{b.proc.pid}/task").iterdir()
               if (t / "comm").read_text().startswith("kafka-log-clean"))


def test_dynamic_cleaner_threads_and_keys_gregor_cannot_apply_live(broker_factory):
    from test_connection_limits import wait_for
    b = broker_factory()
    with kp.Conn(b.host, b.port) as c:
        wait_for(lambda: _cleaner_threads(b) == 1, 10, "the cleaner thread")
        assert _alter_broker(c, "", {"log.cleaner.threads": "2", "log.cleaner.backoff.ms": "500"})[0] == 0
        wait_for(lambda: _cleaner_threads(b) == 2, 10, "a second cleaner thread")
        assert _synonyms(c, "0", "log.cleaner.threads")[:2] == ("2", 3)
        # Kafka's bounds: at most double, at least half the current count
        code, msg = _alter_broker(c, "", {"log.cleaner.threads": "5"})
        assert code == ka.INVALID_REQUEST and "log.cleaner.threads" in msg, (code, msg)
        assert _cleaner_threads(b) == 2
        # dynamic in Kafka, not applied live by gregor: refused, naming the key, never stored
        for key, value in [("num.network.threads", "4"), ("num.replica.fetchers", "2"),
                           ("listener.name.plaintext.ssl.keystore.location", "/k.pem")]:
            code, msg = _alter_broker(c, "0", {key: value})
            assert code == ka.INVALID_REQUEST and key in msg, (key, code, msg)
        assert broker_view(c, "0", ["num.network.threads"])["num.network.threads"][1:] == (5, True)
        assert _alter_broker(c, "", {})[0] == 0
        wait_for(lambda: _cleaner_threads(b) == 1, 10, "the cleaner back to one thread")


# The SASL keys of Kafka 3.9's DynamicListenerConfig.ReconfigurableConfigs, but sasl.jaas.config
# (a password), with a value of the type Kafka's ConfigDef gives each.
DYNAMIC_SASL = {
    "sasl.mechanism.inter.broker.protocol": "PLAIN",
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
    "sasl.kerberos.service.name": "kafka",
    "sasl.kerberos.kinit.cmd": "/usr/local/bin/kinit",
    "sasl.kerberos.ticket.renew.window.factor": "0.9",
    "sasl.kerberos.ticket.renew.jitter": "0.1",
    "sasl.kerberos.min.time.before.relogin": "120000",
    "sasl.kerberos.principal.to.local.rules": "RULE:[1:$1](.*)s/@.*//,DEFAULT",
    "sasl.login.refresh.window.factor": "0.6",
    "sasl.login.refresh.window.jitter": "0.2",
    "sasl.login.refresh.min.period.seconds": "30",
    "sasl.login.refresh.buffer.seconds": "120",
}


def test_dynamic_sasl_keys_are_taken_per_broker_and_described_back(broker):
    """As Kafka 3.9 in ZooKeeper mode: each SASL key of its dynamic listener set is taken for one
    broker and described back as DYNAMIC_BROKER_CONFIG; the cluster-wide entity refuses them
    (broker id must be specified), a value of the wrong type is refused naming the key, and
    sasl.jaas.config, a password, is refused for want of a password encoder secret."""
    ver = broker.api_versions[kp.INCREMENTAL_ALTER_CONFIGS][1]
    keys = list(DYNAMIC_SASL)
    with kp.Conn(broker.host, broker.port) as c:
        def incremental(name, ops):
            r = c.call(kp.INCREMENTAL_ALTER_CONFIGS, ver, kp.incremental_alter_configs_request(
                ver, [(kp.RESOURCE_BROKER, name, ops)]))
            [res] = kp.decode_incremental_alter_configs(r, ver)["responses"]
            return res["error_code"], res["error_message"] or None

        assert incremental("0", [(k, 0, v) for k, v in DYNAMIC_SASL.items()]) == (0, None)
        assert broker_view(c, "0", keys) == {k: (v, 2, False) for k, v in DYNAMIC_SASL.items()}
        key = "sasl.kerberos.min.time.before.relogin"
        assert _synonyms(c, "0", key) == ("120000", 2, [(key, "120000", 2)])

        for name, configs, words in [
            ("", {key: "60000"}, ["broker id must be specified", key]),
            ("0", {key: "soon"}, [key, "LONG"]),
            ("0", {"sasl.login.refresh.window.factor": "2.0"}, ["sasl.login.refresh.window.factor", "1.0"]),
            ("0", {"sasl.login.refresh.buffer.seconds": "4000"}, ["sasl.login.refresh.buffer.seconds"]),
            ("0", {"sasl.jaas.config": "x required;"}, ["Password encoder secret not configured"]),
        ]:
            code, msg = incremental(name, [(k, 0, v) for k, v in configs.items()])
            assert code == ka.INVALID_REQUEST and all(w in msg for w in words), (configs, code, msg)
        assert broker_view(c, "0", keys) == {k: (v, 2, False) for k, v in DYNAMIC_SASL.items()}
        assert broker_view(c, "", keys) == {}

        # deleted, a key falls back (these are unset statically: no longer listed)
        assert incremental("0", [(key, 1, None)]) == (0, None)
        assert key not in broker_view(c, "0", keys)
        # AlterConfigs replaces the entity
        assert _alter_broker(c, "0", {"sasl.kerberos.service.name": "other"})[0] == 0
        assert broker_view(c, "0", keys) == {"sasl.kerberos.service.name": ("other", 2, False)}
        assert _alter_broker(c, "0", {})[0] == 0


def test_log_dir_moves_under_steady_producers_lose_no_acknowledged_record(broker_factory, tmp_path):
    import threading
    b, dirs = two_dir_broker(broker_factory, tmp_path)
    v = b.api_versions[ka.ALTER_REPLICA_LOG_DIRS][1]
    acked, stop, errors = [], threading.Event(), []

    def produce(name, who):
        with kp.Conn(b.host, b.port) as p:
            i = 0
            while not stop.is_set():
                value = b"%d-%06d" % (who, i)
                r = kp.produce(p, name, 0, kp.build_batch([kp.Record(value=value)] * 5))
                if r["error_code"] != 0:
                    errors.append(r)
                    return
                acked.append((r["base_offset"], value))
                i += 1

    with kp.Conn(b.host, b.port) as c:
        name = new_topic(c, 1)
        # three producers: appends arrive while the copy catches up and the swap looks
        threads = [threading.Thread(target=produce, args=(name, who)) for who in range(3)]
        for t in threads:
            t.start()
        try:
            for _ in range(2):
                mark = len(acked)
                wait_until(lambda: len(acked) > mark + 50 or errors, 30, "the producer to write more")
                src = log_dirs_view(c)[(name, 0, False)][0]
                dst = next(d for d in dirs if d != src)
                r = c.call(ka.ALTER_REPLICA_LOG_DIRS, v, ka.alter_replica_log_dirs_request(v, {dst: {name: [0]}}))
                assert ka.decode_alter_replica_log_dirs(r, v)["results"] == {(name, 0): 0}
                wait_until(lambda: log_dirs_view(c).get((name, 0, False), ("",))[0] == dst
                           and not leftovers(dirs), 60, "the move to complete while records keep coming")
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert not errors, errors
        records = kp.fetch_all(c, name, 0)
        by_offset = {r.offset: r.value for r in records}
        assert [r.offset for r in records] == list(range(len(records)))
        for base, value in acked:
            assert all(by_offset.get(base + k) == value for k in range(5)), (base, value)


@pytest.mark.parametrize("which", ["min", "max"])
def test_list_config_resources_lists_client_metrics_subscriptions(broker, which):
    lo, hi = broker.api_versions[ka.LIST_CONFIG_RESOURCES]
    v = lo if which == "min" else hi
    client_metrics, subscription = 16, topic_name("sub")
    with kp.Conn(broker.host, broker.port) as c:
        def listed(types=None):
            return ka.decode_list_config_resources(
                c.call(ka.LIST_CONFIG_RESOURCES, v, ka.list_config_resources_request(v, types)), v)

        assert (subscription, client_metrics) not in listed()["resources"]
        ops = [("metrics", 0, "org.apache.kafka.producer."), ("interval.ms", 0, "60000")]
        r = kp.decode_incremental_alter_configs(c.call(kp.INCREMENTAL_ALTER_CONFIGS, 1,
            kp.incremental_alter_configs_request(1, [(client_metrics, subscription, ops)])), 1)
        assert r["responses"][0]["error_code"] == 0, r
        got = listed()
        assert got["error_code"] == 0 and (subscription, client_metrics) in got["resources"], got
        if v >= 1:
            assert (str(broker.broker_id), 4) in got["resources"], got
            only = listed([client_metrics])["resources"]
            assert only and all(t == client_metrics for _, t in only), only
            assert listed([99])["error_code"] == 35  # UNSUPPORTED_VERSION: a type Kafka 4.1 does not know
        # an interval out of Kafka's bounds is refused and changes nothing
        r = kp.decode_incremental_alter_configs(c.call(kp.INCREMENTAL_ALTER_CONFIGS, 1,
            kp.incremental_alter_configs_request(1, [(client_metrics, subscription, [("interval.ms", 0, "1")])])), 1)
        assert r["responses"][0]["error_code"] == 42, r
        delete = [("metrics", 1, None), ("interval.ms", 1, None)]
        kp.decode_incremental_alter_configs(c.call(kp.INCREMENTAL_ALTER_CONFIGS, 1,
            kp.incremental_alter_configs_request(1, [(client_metrics, subscription, delete)])), 1)
        assert (subscription, client_metrics) not in listed()["resources"]
