"""Kafka's admin surface through real admin clients (confluent-kafka's AdminClient,
kafka-python's KafkaAdminClient): the group fixes, ListGroups v5, AlterConfigs, manual replica
assignments, and the operator workflows of issue 15.

One standalone broker serves the single-node checks; the cluster checks start their own.
"""
import time

import pytest

import java_client
from cluster_harness import Cluster
from common import uniq, wait_until
from gregor_fixtures import _failed, _register

ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kafka import KafkaConsumer  # noqa: E402
from kafka import TopicPartition as KTP  # noqa: E402
from kafka.admin import KafkaAdminClient  # noqa: E402

WAIT = 60
# The shortest session a group member may ask for: what the static-member checks wait out.
SESSION_MS = 4000
GROUP_OVERRIDES = {"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000"}


@pytest.fixture
def single(broker_factory):
    return broker_factory(GROUP_OVERRIDES)


@pytest.fixture
def cluster(request, zookeeper):
    c = Cluster(zookeeper, 3, overrides={"auto.leader.rebalance.enable": "false",
                                         "log.retention.check.interval.ms": "300"},
                on_new_broker=lambda b: _register(request, b))
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


def ck_admin(b):
    return AdminClient({"bootstrap.servers": b.bootstrap})


def kp_admin(b):
    return KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=30000)


def ck_create(a, name, partitions=1, rf=1, **kw):
    a.create_topics([NewTopic(name, partitions, rf, **kw)])[name].result(WAIT)


def delete_group_error(a, group):
    """None when confluent's DeleteGroups succeeds, else the error code."""
    try:
        a.delete_consumer_groups([group])[group].result(WAIT)
        return None
    except ck.KafkaException as e:
        return e.args[0].code()


# ---------------------------------------------------------------------------
# 1. group fixes
# ---------------------------------------------------------------------------

def test_delete_group_after_offset_delete_removed_every_offset(single):
    a, ka = ck_admin(single), kp_admin(single)
    topic, group = uniq("od"), uniq("g")
    ck_create(a, topic, 2)
    c = ck.Consumer({"bootstrap.servers": single.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[ck.TopicPartition(topic, 0, 5), ck.TopicPartition(topic, 1, 7)], asynchronous=False)
    c.close()
    try:
        res = ka.delete_group_offsets(group, [KTP(topic, 0), KTP(topic, 1)])
        assert all(getattr(e, "errno", 0) == 0 for e in res.values()), res
        left = ka.list_group_offsets(group)
        assert left in ({}, {group: {}}), left
        # The coordinator has nothing left to tombstone but the group itself: DeleteGroups
        # must succeed, not fail writing an empty batch (INVALID_RECORD).
        assert delete_group_error(a, group) is None
        assert group not in {g.group_id for g in a.list_consumer_groups().result(WAIT).valid}
        assert delete_group_error(a, group) == ck.KafkaError.GROUP_ID_NOT_FOUND
    finally:
        ka.close()


def _static_member_expires(a, group, close_member):
    """`close_member` joins `group` as a static member, reads its assignment and closes
    (static members send no LeaveGroup). The group stays non-empty until the session timeout,
    then DeleteGroups succeeds."""
    closed_at = close_member()
    # Right after the close the member still holds its place (KIP-345: it may come back).
    err = delete_group_error(a, group)
    if time.monotonic() - closed_at < SESSION_MS / 1000:
        assert err == ck.KafkaError.NON_EMPTY_GROUP, err
    wait_until(lambda: delete_group_error(a, group) is None, WAIT,
               f"static member of {group} expired and the group deleted", interval=0.25)
    assert time.monotonic() - closed_at >= SESSION_MS / 1000 * 0.9


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_closed_static_member_expires_at_session_timeout(single, client):
    a = ck_admin(single)
    topic, group = uniq("static"), uniq("g")
    ck_create(a, topic, 1)

    def close_member():
        if client == "confluent":
            c = ck.Consumer({"bootstrap.servers": single.bootstrap, "group.id": group,
                             "group.instance.id": "inst-1", "session.timeout.ms": SESSION_MS})
            c.subscribe([topic])
            wait_until(lambda: c.poll(0.2) is None and c.assignment(), WAIT, "static member assigned")
        else:
            c = KafkaConsumer(bootstrap_servers=single.bootstrap, group_id=group,
                              group_instance_id="inst-1", session_timeout_ms=SESSION_MS,
                              heartbeat_interval_ms=500)
            # kafka-python 3.0 may join before its first metadata names the topic, assign
            # nothing, and rejoin at once; now and then it then never applies the second
            # assignment (its own race: every answer from the broker is in its debug log).
            # Known partitions before the subscription leave nothing to rejoin for.
            wait_until(lambda: c.partitions_for_topic(topic), WAIT, f"kafka-python knows {topic}")
            c.subscribe([topic])
            wait_until(lambda: c.poll(200) is not None and c.assignment(), WAIT, "static member assigned")
        c.close()
        return time.monotonic()

    _static_member_expires(a, group, close_member)


# ---------------------------------------------------------------------------
# 2. ListGroups v5, AlterConfigs, manual assignments
# ---------------------------------------------------------------------------

def test_list_groups_v5_reports_and_filters_the_group_type(single):
    a, ka = ck_admin(single), kp_admin(single)
    topic, group = uniq("lg"), uniq("g")
    ck_create(a, topic, 1)
    c = ck.Consumer({"bootstrap.servers": single.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[ck.TopicPartition(topic, 0, 1)], asynchronous=False)
    c.close()
    try:
        listed = {g["group_id"]: g for g in ka.list_groups(types_filter=["classic"])}
        assert group in listed, listed
        # kafka-python reports the v5 field only when it used v5
        assert listed[group]["group_type"] == "classic", listed[group]
        assert group not in {g["group_id"] for g in ka.list_groups(types_filter=["consumer"])}
    finally:
        ka.close()
    res = a.list_consumer_groups(types={ck.ConsumerGroupType.CLASSIC}).result(WAIT)
    got = {g.group_id: g for g in res.valid}
    assert group in got and got[group].type == ck.ConsumerGroupType.CLASSIC, res.valid
    res = a.list_consumer_groups(types={ck.ConsumerGroupType.CONSUMER}).result(WAIT)
    assert group not in {g.group_id for g in res.valid}, res.valid


def _topic_configs(a, topic):
    res = ck.admin.ConfigResource(ck.admin.ResourceType.TOPIC, topic)
    entries = a.describe_configs([res])[res].result(WAIT)
    return {k: (e.value, e.source) for k, e in entries.items()}


DYNAMIC_TOPIC = ck.admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value
DEFAULT = ck.admin.ConfigSource.DEFAULT_CONFIG.value


def test_alter_configs_through_kafka_python_and_librdkafka(single):
    from kafka.admin import ConfigResource, ConfigResourceType
    a, ka = ck_admin(single), kp_admin(single)
    topic = uniq("ac")
    ck_create(a, topic, 1, config={"retention.ms": "7200000"})
    try:
        # kafka-python on AlterConfigs (key 33): the override set becomes what it sends
        res = ka.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                               {"cleanup.policy": "compact", "retention.ms": "3600000"})],
                               incremental=False)
        assert res == {"topic": {topic: "OK"}}, res
        got = _topic_configs(a, topic)
        assert got["cleanup.policy"] == ("compact", DYNAMIC_TOPIC), got
        assert got["retention.ms"] == ("3600000", DYNAMIC_TOPIC), got
    finally:
        ka.close()
    # librdkafka's alter_configs is AlterConfigs too (it refuses the call unless advertised)
    res = ck.admin.ConfigResource(ck.admin.ResourceType.TOPIC, topic, set_config={"segment.bytes": "2097152"})
    a.alter_configs([res])[res].result(WAIT)
    got = _topic_configs(a, topic)
    assert got["segment.bytes"] == ("2097152", DYNAMIC_TOPIC), got
    assert got["cleanup.policy"][1] == DEFAULT and got["retention.ms"][1] == DEFAULT, got
    bad = ck.admin.ConfigResource(ck.admin.ResourceType.TOPIC, topic, set_config={"cleanup.policy": "never"})
    with pytest.raises(ck.KafkaException) as e:
        a.alter_configs([bad])[bad].result(WAIT)
    assert e.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
    assert _topic_configs(a, topic)["segment.bytes"] == ("2097152", DYNAMIC_TOPIC)


def _replicas(c, broker_id, topic):
    md = c.metadata(broker_id, topic).topics[topic]
    return {p: (m.replicas, m.leader) for p, m in md.partitions.items()}


def test_manual_assignments_create_topics_and_partitions(cluster):
    from kafka.admin import NewPartitions as KNewPartitions
    c = cluster
    a = c.admin(1)
    topic = uniq("manual")
    # librdkafka wants num_partitions = len(replica_assignment) and sends -1 on the wire
    ck_create_assigned = [NewTopic(topic, 3, replica_assignment=[[1, 2], [2, 3], [3, 1]])]
    a.create_topics(ck_create_assigned)[topic].result(WAIT)
    want = {0: [1, 2], 1: [2, 3], 2: [3, 1]}
    assert c.zk_assignment(topic) == want
    c.wait_topic_online(topic, 3)
    wait_until(lambda: {p: r for p, (r, _) in _replicas(c, 2, topic).items()} == want, WAIT,
               "Metadata to show the manual assignment")
    # the preferred (first) replica leads
    assert {p: s["leader"] for p, s in c.partition_states(topic).items()} == {0: 1, 1: 2, 2: 3}

    for bad in ([[1, 7]], [[1, 1]], [[1, 2, 3]]):
        bad_topic = uniq("bad")
        with pytest.raises(ck.KafkaException) as e:
            a.create_topics([NewTopic(bad_topic, 1 + len(bad), replica_assignment=[[1, 2]] + bad)])[bad_topic].result(WAIT)
        assert e.value.args[0].code() == ck.KafkaError.INVALID_REPLICA_ASSIGNMENT, (bad, e.value)

    # add partitions with a manual assignment: librdkafka, then kafka-python
    a.create_partitions([ck.admin.NewPartitions(topic, 4, replica_assignment=[[3, 2]])])[topic].result(WAIT)
    for bad in ([[1, 9]], [[2, 2]], [[2]], [[1, 2], [2, 3]]):
        with pytest.raises(ck.KafkaException) as e:
            a.create_partitions([ck.admin.NewPartitions(topic, 5, replica_assignment=bad)])[topic].result(WAIT)
        assert e.value.args[0].code() == ck.KafkaError.INVALID_REPLICA_ASSIGNMENT, (bad, e.value)
    ka = KafkaAdminClient(bootstrap_servers=c.bootstrap(), request_timeout_ms=30000)
    try:
        res = ka.create_partitions({topic: KNewPartitions(6, [[1, 3], [2, 1]])})
        assert [(r.name, r.error_code) for r in res.results] == [(topic, 0)], res
        with pytest.raises(kafka.errors.InvalidReplicationAssignmentError):
            ka.create_partitions({topic: KNewPartitions(7, [[3, 3]])})
    finally:
        ka.close()
    want.update({3: [3, 2], 4: [1, 3], 5: [2, 1]})
    wait_until(lambda: c.zk_assignment(topic) == want, WAIT, "the added partitions in the topic znode")
    c.wait_topic_online(topic, 6)
    wait_until(lambda: {p: r for p, (r, _) in _replicas(c, 3, topic).items()} == want, WAIT,
               "Metadata to show the added partitions' assignment")


def test_delete_topic_without_a_replica_on_the_controller_is_answered_when_done(cluster):
    """DeleteTopics is answered once the topic is gone, also by a controller that holds none of
    its replicas (it used to sit out the request's whole timeout there: 10 s of 10, 30 s of 30),
    so clients that delete and re-create a topic do not time out."""
    c = cluster
    controller = c.wait_controller()
    other = next(i for i in c.live_ids() if i != controller)
    a = c.admin(controller)
    timeout = 120
    for rf_one in (True, False):
        topic = uniq("gone")
        assignment = [[other]] if rf_one else [sorted(c.live_ids())]
        a.create_topics([NewTopic(topic, 1, replica_assignment=assignment)])[topic].result(WAIT)
        c.wait_topic_online(topic, 1)
        t0 = time.monotonic()
        a.delete_topics([topic], operation_timeout=timeout, request_timeout=timeout + 10)[topic].result(timeout + 20)
        took = time.monotonic() - t0
        print(f"DeleteTopics rf {len(assignment[0])}, controller without replica: {took:.3f} s")
        # Far below the timeout: the answer follows the deletion, not the deadline.
        assert took < timeout / 4, f"DeleteTopics (rf {len(assignment[0])}) answered after {took:.1f} s"
        assert not c.exists(f"/brokers/topics/{topic}")
        # The name can be used again at once.
        a.create_topics([NewTopic(topic, 1, replica_assignment=assignment)])[topic].result(WAIT)
        c.wait_topic_online(topic, 1)


# ---------------------------------------------------------------------------
# 3. ElectLeaders, DescribeLogDirs
# ---------------------------------------------------------------------------

def _leaders(c, topic):
    return {p: s["leader"] for p, s in c.partition_states(topic).items()}


def test_elect_leaders_preferred_after_restart_and_unclean(cluster):
    from kafka.protocol.admin.topics import ElectionType as KElectionType
    c = cluster
    a = c.admin(2)
    topic, lonely = uniq("elect"), uniq("unclean")
    a.create_topics([NewTopic(topic, 3, replica_assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2]]),
                     NewTopic(lonely, 1, replica_assignment=[[2, 3]])])[topic].result(WAIT)
    c.wait_topic_online(topic, 3)
    c.wait_topic_online(lonely, 1)
    p = ck.Producer({"bootstrap.servers": c.bootstrap(), "acks": "all"})
    for i in range(30):
        p.produce(topic, value=b"v%d" % i, partition=i % 3)
    assert p.flush(WAIT) == 0

    # a restart of broker 1 leaves partition 0 led by another replica
    c.brokers[1].restart()
    wait_until(lambda: all(1 in s["isr"] for s in c.partition_states(topic).values()), WAIT,
               "broker 1 back in every ISR")
    assert _leaders(c, topic)[0] != 1, c.partition_states(topic)

    # a fresh client: the restart may have moved the controller, and librdkafka does not
    # refresh its controller id on a partition-level NOT_CONTROLLER
    a = c.admin(2)
    res = a.elect_leaders(ck.ElectionType.PREFERRED,
                          [ck.TopicPartition(topic, i) for i in range(3)]).result(WAIT)
    errors = {tp.partition: (e.code() if e else None) for tp, e in res.items()}
    assert errors == {0: None, 1: ck.KafkaError.ELECTION_NOT_NEEDED, 2: ck.KafkaError.ELECTION_NOT_NEEDED}, res
    # answered once the brokers know: the controller's record and every broker's Metadata agree
    assert _leaders(c, topic) == {0: 1, 1: 2, 2: 3}
    for i in (1, 2, 3):
        wait_until(lambda i=i: _replicas(c, i, topic)[0][1] == 1, WAIT, f"broker {i} to name leader 1")
    lows_highs = [ck.Consumer({"bootstrap.servers": c.bootstrap(), "group.id": uniq("w")})
                  .get_watermark_offsets(ck.TopicPartition(topic, i), timeout=WAIT) for i in range(3)]
    assert [hw for _lo, hw in lows_highs] == [10, 10, 10], lows_highs

    # unclean: the only ISR member dies; the out-of-sync replica leads only when asked to
    c.brokers[3].stop()
    wait_until(lambda: c.partition_state(lonely, 0)["isr"] == [2], WAIT, "the ISR of the lonely partition to shrink")
    c.brokers[2].stop()
    wait_until(lambda: c.partition_state(lonely, 0)["leader"] == -1, WAIT, "the lonely partition to lose its leader")
    c.brokers[3]._fixed_port = True
    c.brokers[3].start()
    c.wait_registered([1, 3])
    # kafka-python sends the election to the controller its first Metadata names: wait until
    # both live brokers name a live one (broker 2 may have been the controller)
    for i in (1, 3):
        wait_until(lambda i=i: c.metadata(i).controller_id in (1, 3), WAIT, f"broker {i} to name a live controller")
    assert c.partition_state(lonely, 0)["leader"] == -1
    ka = KafkaAdminClient(bootstrap_servers=c.bootstrap([1, 3]), request_timeout_ms=30000)
    try:
        with pytest.raises(Exception) as e:
            ka.elect_leaders(KElectionType.PREFERRED, {lonely: [0]})
        assert "PreferredLeaderNotAvailable" in repr(e.value) or "PREFERRED_LEADER" in repr(e.value), e.value
        ka.elect_leaders(KElectionType.UNCLEAN, {lonely: [0]})
    finally:
        ka.close()
    st = c.partition_state(lonely, 0)
    assert (st["leader"], st["isr"]) == (3, [3]), st


def test_describe_log_dirs_on_every_broker(cluster):
    c = cluster
    a = c.admin(1)
    topic = uniq("dirs")
    a.create_topics([NewTopic(topic, 2, 3)])[topic].result(WAIT)
    c.wait_topic_online(topic, 2)
    p = ck.Producer({"bootstrap.servers": c.bootstrap(), "acks": "all"})
    for i in range(20):
        p.produce(topic, value=b"x" * 200, partition=0)
    assert p.flush(WAIT) == 0
    ka = KafkaAdminClient(bootstrap_servers=c.bootstrap(), request_timeout_ms=30000)
    try:
        def sizes():
            out = {}
            for entry in ka.describe_log_dirs(topic_partitions={topic: [0, 1]}):
                [d] = entry["log_dirs"]
                assert d["error_code"] == 0 and d["total_bytes"] >= d["usable_bytes"] > 0, d
                assert d["log_dir"] == str(c.brokers[entry["broker"]].data_dir), d
                for t in d["topics"]:
                    for part in t["partitions"]:
                        out[(entry["broker"], t["name"], part["partition_index"])] = part["partition_size"]
            return out

        def replicated():
            s = sizes()
            leader_size = sum(f.stat().st_size for f in (c.brokers[1].data_dir / f"{topic}-0").glob("*.log"))
            want = {(b, topic, 0): leader_size for b in (1, 2, 3)} | {(b, topic, 1): 0 for b in (1, 2, 3)}
            return s if leader_size > 0 and s == want else None
        wait_until(replicated, WAIT, "every broker to report the same partition sizes as on disk", interval=0.2)
    finally:
        ka.close()


# ---------------------------------------------------------------------------
# 4. dynamic broker configs
# ---------------------------------------------------------------------------

def _segments(b, topic):
    return sorted(int(f.stem) for f in (b.data_dir / f"{topic}-0").glob("*.log"))


def _broker_configs(c, broker_id):
    res = ck.admin.ConfigResource(ck.admin.ResourceType.BROKER, str(broker_id))
    a = c.admin(broker_id)  # kept until the result is in: a dropped client fails its futures
    return a.describe_configs([res])[res].result(WAIT)


def test_cluster_wide_retention_applies_on_every_broker_without_restart(cluster):
    c = cluster
    a = c.admin(1)
    topic = uniq("dynret")
    a.create_topics([NewTopic(topic, 1, 3, config={"segment.bytes": "1024"})])[topic].result(WAIT)
    c.wait_topic_online(topic, 1)
    p = ck.Producer({"bootstrap.servers": c.bootstrap(), "acks": "all", "linger.ms": 0})
    hour_ago = int(time.time() * 1000) - 3_600_000
    for i in range(40):
        p.produce(topic, value=b"x" * 200, partition=0, timestamp=hour_ago)
        p.flush(WAIT)
    starts = {i: c.brokers[i].starts for i in (1, 2, 3)}
    wait_until(lambda: all(len(_segments(c.brokers[i], topic)) > 3 for i in (1, 2, 3)), WAIT,
               "every replica to have rolled segments")
    # a week's default retention keeps hour-old records (checked every 300 ms)
    time.sleep(1)  # several retention checks: nothing may be deleted
    assert all(_segments(c.brokers[i], topic)[0] == 0 for i in (1, 2, 3))

    before = _broker_configs(c, 2)
    assert before["log.retention.ms"].source == ck.admin.ConfigSource.DEFAULT_CONFIG.value, before["log.retention.ms"]
    assert before["broker.id"].is_read_only and before["broker.id"].source == \
        ck.admin.ConfigSource.STATIC_BROKER_CONFIG.value, before["broker.id"]
    assert not before["log.retention.ms"].is_read_only

    # cluster-wide (resource name "", which librdkafka and kafka-python cannot send): the Java
    # AdminClient's IncrementalAlterConfigs, as kafka-configs --entity-default sends it
    java_client.run(java_client.compile_client()[0], c.bootstrap(), c.brokers[1].base_dir / "java-tmp",
                    "set-cluster-config", "log.retention.ms", "60000")
    assert c.get_json("/config/brokers/<default>")["config"] == {"log.retention.ms": "60000"}
    notes = [c.get_json(f"/config/changes/{n}") for n in c.kz.get_children("/config/changes")]
    assert {"version": 2, "entity_path": "brokers/<default>"} in notes, notes

    # every broker deletes the hour-old segments, none restarted
    wait_until(lambda: all(_segments(c.brokers[i], topic)[0] > 0 for i in (1, 2, 3)), WAIT,
               "retention to delete old segments on every broker")
    assert {i: c.brokers[i].starts for i in (1, 2, 3)} == starts
    for i in (1, 2, 3):
        got = _broker_configs(c, i)["log.retention.ms"]
        assert (got.value, got.source) == ("60000", ck.admin.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value), got
        ai = c.admin(i)
        t = _topic_configs(ai, topic)["retention.ms"]
        assert t == ("60000", ck.admin.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value), t

    # a static-only key is refused (INVALID_REQUEST, as Kafka answers a broker config's
    # ConfigException); a per-broker value wins over the default on that broker only
    bad = ck.admin.ConfigResource(ck.admin.ResourceType.BROKER, "1", incremental_configs=[
        ck.admin.ConfigEntry("broker.id", "7", incremental_operation=ck.admin.AlterConfigOpType.SET)])
    with pytest.raises(ck.KafkaException) as e:
        a.incremental_alter_configs([bad])[bad].result(WAIT)
    assert e.value.args[0].code() == ck.KafkaError.INVALID_REQUEST
    ka = KafkaAdminClient(bootstrap_servers=c.brokers[3].bootstrap, request_timeout_ms=30000)
    try:
        from kafka.admin import ConfigResource, ConfigResourceType
        r = ka.alter_configs([ConfigResource(ConfigResourceType.BROKER, "3", {"log.retention.ms": "120000"})],
                             incremental=False, raise_on_unknown=False)
        assert "OK" in str(r), r
    finally:
        ka.close()
    got = _broker_configs(c, 3)["log.retention.ms"]
    assert (got.value, got.source) == ("120000", ck.admin.ConfigSource.DYNAMIC_BROKER_CONFIG.value), got
    assert _broker_configs(c, 2)["log.retention.ms"].value == "60000"


# ---------------------------------------------------------------------------
# 5. DescribeProducers
# ---------------------------------------------------------------------------

def test_describe_producers_reports_idempotent_producers(single):
    a = ck_admin(single)
    topic = uniq("prod")
    ck_create(a, topic, 2)
    p = ck.Producer({"bootstrap.servers": single.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    before = int(time.time() * 1000)
    for i in range(7):
        p.produce(topic, value=b"v%d" % i, partition=0, timestamp=before + i)
        p.flush(WAIT)
    ka = kp_admin(single)
    try:
        res = ka.describe_producers([KTP(topic, 0), KTP(topic, 1)])
        [prod] = res[KTP(topic, 0)].active_producers
        assert prod.producer_id >= 0 and prod.producer_epoch >= 0, prod
        # seven one-record batches: sequences 0..6; the last batch's timestamp
        assert (prod.last_sequence, prod.last_timestamp) == (6, before + 6), prod
        assert (prod.coordinator_epoch, prod.current_transaction_start_offset) == (-1, -1), prod
        assert res[KTP(topic, 1)].active_producers == [], res
        with pytest.raises(kafka.errors.UnknownTopicOrPartitionError):
            ka.describe_producers([KTP(topic, 5)], broker_id=single.broker_id)
    finally:
        ka.close()


# ---------------------------------------------------------------------------
# 6. AlterReplicaLogDirs
# ---------------------------------------------------------------------------

def test_move_a_replica_between_log_dirs_with_the_java_admin_client(broker_factory, tmp_path):
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    b = broker_factory({**GROUP_OVERRIDES, "log.dirs": ",".join(map(str, dirs))})
    topic = uniq("move")
    ck_create(ck_admin(b), topic, 1)
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    sent = [b"m%05d" % i for i in range(3000)]
    for v in sent:
        p.produce(topic, value=v, partition=0)
    assert p.flush(WAIT) == 0
    src = next(d for d in dirs if (d / f"{topic}-0").is_dir())
    dst = next(d for d in dirs if d != src)
    java_client.run(java_client.compile_client()[0], b.bootstrap, b.base_dir / "java-tmp",
                    "move-replica-dir", topic, "0", str(b.broker_id), str(dst))
    assert (dst / f"{topic}-0").is_dir() and not (src / f"{topic}-0").exists()
    ka = kp_admin(b)
    try:
        [entry] = ka.describe_log_dirs(topic_partitions={topic: [0]})
        where = {d["log_dir"]: [t["name"] for t in d["topics"]] for d in entry["log_dirs"]}
        assert where == {str(src): [], str(dst): [topic]}, where
    finally:
        ka.close()
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": uniq("g"), "auto.offset.reset": "earliest",
                     "enable.auto.commit": False})
    try:
        c.assign([ck.TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + WAIT
        while len(got) < len(sent) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
        assert got == sent
    finally:
        c.close()


# ---------------------------------------------------------------------------
# 7. DescribeTopicPartitions
# ---------------------------------------------------------------------------

def test_java_describe_topics_pages_through_describe_topic_partitions(broker_factory):
    import urllib.request

    from gregor_harness import free_port
    port = free_port()
    b = broker_factory({**GROUP_OVERRIDES, "metrics.port": str(port), "metrics.host": "127.0.0.1"})
    topic = uniq("dtp")
    ck_create(ck_admin(b), topic, 5)

    def answered():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith('kafka_network_requestmetrics_requests_total{request="DescribeTopicPartitions"'):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    java_client.run(java_client.compile_client()[0], b.bootstrap, b.base_dir / "java-tmp",
                    "describe-topics-paged", topic, "5", "2")
    # five partitions two at a time: three pages, then the missing topic's request
    assert answered() >= 4, answered()


# ---------------------------------------------------------------------------
# 8. /config/changes housekeeping
# ---------------------------------------------------------------------------

def test_expired_config_change_notifications_are_purged(request, zookeeper):
    # Kafka's expiration is 15 minutes; the test shortens it to 2 s.
    c = Cluster(zookeeper, 1, overrides={"gregor.config.change.expiration.ms": "2000"},
                on_new_broker=lambda b: _register(request, b))
    c.start()
    try:
        a = c.admin(1)

        def alter(ms):
            entry = ck.admin.ConfigEntry("log.retention.ms", str(ms),
                                         incremental_operation=ck.admin.AlterConfigOpType.SET)
            r = ck.admin.ConfigResource(ck.admin.ResourceType.BROKER, "1", incremental_configs=[entry])
            a.incremental_alter_configs([r])[r].result(WAIT)

        alter(3_600_000)
        [first] = c.kz.get_children("/config/changes")
        # every later notification makes the broker look at the old ones
        n = [3_600_001]

        def purged():
            alter(n[0])
            n[0] += 1
            return first not in c.kz.get_children("/config/changes")
        wait_until(purged, WAIT, "the expired notification to be deleted", interval=0.5)
        left = c.kz.get_children("/config/changes")
        assert left and max(left) > first, left
        assert c.get_json("/config/brokers/1")["config"] == {"log.retention.ms": str(n[0] - 1)}
    finally:
        c.cleanup(keep=_failed(request))
