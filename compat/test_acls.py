"""Kafka's ACL authorizer (`authorizer.class.name=kafka.security.authorizer.AclAuthorizer`) with
real clients: confluent-kafka's AdminClient creates, describes and deletes ACLs; producers,
consumers and admin calls of SASL users are allowed or refused as Kafka would; the ACLs live in
ZooKeeper in Kafka's layout and reach every broker, also one restarted later.

Brokers keep their PLAINTEXT listener for the harness and for inter-broker traffic; its
principal, User:ANONYMOUS, is a super user (as in a Kafka cluster whose inter-broker listener is
PLAINTEXT). Clients under test come in as PLAIN users on SASL_PLAINTEXT: `admin` (a super
user), `alice` (granted ACLs as a test goes) and `mallory` (never granted more than DESCRIBE).
"""
from __future__ import annotations

import json
import time

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, AlterConfigOpType, ConfigEntry,
    ConfigResource, NewTopic, ResourcePatternType, ResourceType)
from confluent_kafka import ConsumerGroupTopicPartitions  # noqa: E402

from common import uniq  # noqa: E402
from gregor_harness import free_port, wait_until  # noqa: E402

USERS = {"admin": "admin-secret", "alice": "alice-secret", "mallory": "mallory-secret"}
JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" "
        "password=\"admin-secret\" " + " ".join(f'user_{u}="{p}"' for u, p in USERS.items()) + ";")
AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
TOPIC_AUTH, GROUP_AUTH, CLUSTER_AUTH = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                                        KafkaError.CLUSTER_AUTHORIZATION_FAILED)


def acl_overrides(ports: dict, extra=None) -> dict:
    o = {
        "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "advertised.listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,ADMIN:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": AUTHORIZER,
        "super.users": "User:admin;User:ANONYMOUS",
        "offsets.topic.replication.factor": "1",
        "connection.failed.authentication.delay.ms": "0",
    }
    o.update(extra or {})
    return o


def start(broker_factory, names=("PLAINTEXT", "SASL_PLAINTEXT"), extra=None, **kw):
    ports = {n: free_port() for n in names}
    b = broker_factory(overrides=acl_overrides(ports, extra), port=ports["PLAINTEXT"], **kw)
    b.ports = ports
    return b


def conf(b, user=None) -> dict:
    """As `user` over SASL_PLAINTEXT, or as User:ANONYMOUS (a super user) over PLAINTEXT."""
    if user is None:
        return {"bootstrap.servers": f"127.0.0.1:{b.ports['PLAINTEXT']}"}
    return {"bootstrap.servers": f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": user, "sasl.password": USERS[user]}


def admin(b, user=None) -> AdminClient:
    return AdminClient(conf(b, user))


def error_code(future) -> int:
    """The Kafka error a refused admin call's future carries (fails the test if it succeeded)."""
    with pytest.raises(KafkaException) as e:
        future.result(timeout=30)
    return e.value.args[0].code()


def topic_acl(user, topic, op, pattern=ResourcePatternType.LITERAL, permission=AclPermissionType.ALLOW, host="*"):
    return AclBinding(ResourceType.TOPIC, topic, pattern, f"User:{user}", host, op, permission)


def group_acl(user, group, op, pattern=ResourcePatternType.LITERAL, permission=AclPermissionType.ALLOW):
    return AclBinding(ResourceType.GROUP, group, pattern, f"User:{user}", "*", op, permission)


def create_acls(a: AdminClient, bindings):
    for f in a.create_acls(bindings).values():
        assert f.result(timeout=30) is None


def produce_error(c: dict, topic: str, n: int = 3, **extra):
    """Produces n records; returns None if all were acknowledged, else the first error code seen
    (delivery reports and client errors alike)."""
    errors = []

    def on_error(e):
        # librdkafka reports a fatal error as _FATAL; its cause is only in the text.
        if e.code() == KafkaError._FATAL and "Cluster authorization failed" in e.str():
            errors.append(CLUSTER_AUTH)
        errors.append(e.code())
    p = Producer({**c, "message.timeout.ms": 8000, "error_cb": on_error, **extra})
    for i in range(n):
        try:
            p.produce(topic, value=b"v%d" % i, on_delivery=lambda e, m: errors.append(e.code()) if e else None)
        except KafkaException as e:
            errors.append(e.args[0].code())
            break
    try:
        p.flush(15)
    except KafkaException as e:  # a fatal error (an idempotent producer refused its id)
        errors.append(e.args[0].code())
    # A broker's error wins over what the client made of it (_FATAL, _PURGE_QUEUE, ...).
    broker_errors = [e for e in errors if e > 0]
    return (broker_errors or errors or [None])[0]


def consume(c: dict, topic: str, n: int, group=None, timeout=20):
    """Reads n records of partition 0 from offset 0: (values, first error code or None)."""
    cons = Consumer({**c, "group.id": group or uniq("g"), "enable.auto.commit": False})
    cons.assign([TopicPartition(topic, 0, 0)])
    got, err = [], None
    deadline = time.monotonic() + timeout
    try:
        while len(got) < n and err is None and time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    err = m.error().code()
                continue
            got.append(m.value())
    finally:
        cons.close()
    return got, err


def end_offset(b, topic: str) -> int:
    c = Consumer({**conf(b), "group.id": uniq("probe")})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        c.close()


def committed(b, group: str, topic: str) -> int:
    a = admin(b)
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])
    res = a.list_consumer_group_offsets([req])[group].result(timeout=30)
    return res.topic_partitions[0].offset


def commit_error(c: dict, group: str, topic: str, offset: int):
    cons = Consumer({**c, "group.id": group, "enable.auto.commit": False})
    try:
        cons.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        return None
    except KafkaException as e:
        return e.args[0].code()
    finally:
        cons.close()


def kafka_python_commit_error(user: str, b, group: str, topic: str, offset: int):
    import kafka
    from kafka.structs import OffsetAndMetadata
    c = kafka.KafkaConsumer(bootstrap_servers=conf(b, user)["bootstrap.servers"], group_id=group,
                            security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_plain_username=user,
                            sasl_plain_password=USERS[user], enable_auto_commit=False, request_timeout_ms=10000)
    try:
        c.commit({kafka.TopicPartition(topic, 0): OffsetAndMetadata(offset, "", -1)})
        return None
    except kafka.errors.KafkaError as e:
        return type(e).__name__
    finally:
        c.close()


def kafka_python_produce_error(user: str, b, topic: str):
    import kafka
    p = kafka.KafkaProducer(bootstrap_servers=conf(b, user)["bootstrap.servers"], security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="PLAIN", sasl_plain_username=user, sasl_plain_password=USERS[user],
                            retries=0, request_timeout_ms=10000)
    try:
        p.send(topic, b"x").get(timeout=20)
        return None
    except kafka.errors.KafkaError as e:
        return type(e).__name__
    finally:
        p.close()


def kafka_python_describe_acls_error(user, b):
    from kafka.admin import (ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient,
                             ResourcePatternFilter)
    from kafka.admin import ResourceType as KpResourceType
    from kafka.errors import KafkaError as KpError
    if user is None:
        a = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    else:
        a = KafkaAdminClient(bootstrap_servers=conf(b, user)["bootstrap.servers"], security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username=user, sasl_plain_password=USERS[user])
    any_acl = ACLFilter(principal=None, host="*", operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
                        resource_pattern=ResourcePatternFilter(KpResourceType.ANY, None, ACLResourcePatternType.ANY))
    try:
        a.describe_acls(any_acl)
        return None
    except KpError as e:
        return type(e).__name__
    finally:
        a.close()


def new_topic(b, name: str, **kw):
    a = admin(b)  # kept: the futures fail once their client is gone
    for f in a.create_topics([NewTopic(name, 1, 1, **kw)]).values():
        f.result(timeout=30)
    wait_until(lambda: name in admin(b).list_topics(timeout=10).topics, 30, f"{name} to exist")


# --------------------------------------------------------------------- the negative matrix

def test_a_user_without_acls_is_refused_everywhere_and_nothing_is_written(broker_factory):
    b = start(broker_factory)
    su = admin(b)
    shown, hidden, group = uniq("shown"), uniq("hidden"), uniq("app")
    new_topic(b, shown)
    new_topic(b, hidden)
    # Data and a committed offset that belong to someone else (the super user).
    assert produce_error(conf(b), shown, 5) is None
    assert commit_error(conf(b), group, shown, 5) is None
    # mallory may see one topic and find one group's coordinator, nothing more.
    create_acls(su, [topic_acl("mallory", shown, AclOperation.DESCRIBE),
                     group_acl("mallory", "mallory-g", AclOperation.DESCRIBE)])
    m = conf(b, "mallory")
    ma = admin(b, "mallory")
    cells = 0

    # Metadata: the topic without ACLs is hidden from a listing and refused by name.
    md = ma.list_topics(timeout=10)
    assert set(md.topics) == {shown}, md.topics
    md = ma.list_topics(topic=hidden, timeout=10)
    assert md.topics[hidden].error.code() == TOPIC_AUTH
    cells += 2
    # Produce: WRITE is missing (DESCRIBE alone); nothing is appended.
    assert produce_error(m, shown) == TOPIC_AUTH
    assert produce_error(m, hidden) == TOPIC_AUTH
    assert kafka_python_produce_error("mallory", b, shown) == "TopicAuthorizationFailedError"
    assert end_offset(b, shown) == 5 and end_offset(b, hidden) == 0
    cells += 3
    # An idempotent producer: InitProducerId needs IDEMPOTENT_WRITE or WRITE on some topic.
    assert produce_error(m, shown, **{"enable.idempotence": True}) == CLUSTER_AUTH
    assert end_offset(b, shown) == 5
    cells += 1
    # Fetch: READ is missing.
    got, err = consume(m, shown, 5, group="mallory-g")
    assert (got, err) == ([], TOPIC_AUTH)
    cells += 1
    # OffsetCommit: the group allows DESCRIBE only; another group not even that.
    assert commit_error(m, "mallory-g", shown, 3) == GROUP_AUTH
    # librdkafka keeps asking for the coordinator of a group it may not describe; kafka-python
    # reports FindCoordinator's refusal.
    assert kafka_python_commit_error("mallory", b, group, shown, 1) == "GroupAuthorizationFailedError"
    assert committed(b, "mallory-g", shown) < 0
    assert committed(b, group, shown) == 5
    cells += 2
    # Reading another group: its offsets and its description.
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(shown, 0)])
    assert error_code(ma.list_consumer_group_offsets([req])[group]) == GROUP_AUTH
    [d] = ma.describe_consumer_groups([group]).values()
    assert error_code(d) == GROUP_AUTH
    cells += 2
    # Creating topics: neither CREATE on the cluster nor on the topic; nor by auto-creation.
    created = uniq("new")
    assert error_code(ma.create_topics([NewTopic(created, 1, 1)])[created]) == TOPIC_AUTH
    auto = uniq("auto")
    assert ma.list_topics(topic=auto, timeout=10).topics[auto].error.code() == TOPIC_AUTH
    listed = su.list_topics(timeout=10).topics
    assert created not in listed and auto not in listed
    cells += 2
    # Altering configs: a topic's and the cluster's.
    res = ConfigResource(ResourceType.TOPIC, shown, incremental_configs=[
        ConfigEntry("retention.ms", "1234", incremental_operation=AlterConfigOpType.SET)])
    assert error_code(ma.incremental_alter_configs([res])[res]) == TOPIC_AUTH
    res = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
        ConfigEntry("log.cleaner.threads", "2", incremental_operation=AlterConfigOpType.SET)])
    assert error_code(ma.incremental_alter_configs([res])[res]) == CLUSTER_AUTH
    [cfg] = su.describe_configs([ConfigResource(ResourceType.TOPIC, shown)]).values()
    assert cfg.result(timeout=30)["retention.ms"].value != "1234"
    cells += 2
    # Deleting a topic; granting itself ACLs; listing them.
    assert error_code(ma.delete_topics([shown])[shown]) == TOPIC_AUTH
    assert shown in su.list_topics(timeout=10).topics
    [f] = ma.create_acls([topic_acl("mallory", shown, AclOperation.ALL)]).values()
    assert error_code(f) == CLUSTER_AUTH
    any_acl = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                               AclPermissionType.ANY)
    # librdkafka 2.16 turns DescribeAcls' top-level error into an empty list; kafka-python
    # shows the broker's answer.
    assert ma.describe_acls(any_acl).result(timeout=30) == []
    assert kafka_python_describe_acls_error("mallory", b) == "ClusterAuthorizationFailedError"
    cells += 3
    assert cells == 18
    assert len(su.describe_acls(any_acl).result(timeout=30)) == 2


# --------------------------------------------------------------------- what ACLs grant

def test_prefixed_grants_a_literal_deny_and_deleting_acls(broker_factory):
    b = start(broker_factory)
    su = admin(b, "admin")
    prefix = uniq("orders")
    topic, other = prefix + "-eu", uniq("other")
    new_topic(b, topic)
    new_topic(b, other)
    a = conf(b, "alice")
    assert produce_error(a, topic) == TOPIC_AUTH
    bindings = [topic_acl("alice", prefix, AclOperation.WRITE, ResourcePatternType.PREFIXED),
                topic_acl("alice", prefix, AclOperation.READ, ResourcePatternType.PREFIXED),
                group_acl("alice", "alice-", AclOperation.READ, ResourcePatternType.PREFIXED)]
    create_acls(su, bindings)
    # Granted by prefix: produce, consume, commit, and an idempotent producer (WRITE on a topic).
    assert produce_error(a, topic, 4) is None
    assert produce_error(a, topic, 2, **{"enable.idempotence": True}) is None
    got, err = consume(a, topic, 6, group=uniq("alice-c"))
    assert err is None and len(got) == 6
    assert commit_error(a, "alice-app", topic, 6) is None
    assert committed(b, "alice-app", topic) == 6
    # Only the topics it may describe are listed; READ/WRITE imply DESCRIBE.
    assert set(admin(b, "alice").list_topics(timeout=10).topics) == {topic}
    assert produce_error(a, other) == TOPIC_AUTH
    # A DENY on the literal topic wins over the prefix's ALLOW; only for the denied host.
    create_acls(su, [topic_acl("alice", topic, AclOperation.WRITE, permission=AclPermissionType.DENY,
                               host="127.0.0.1")])
    assert produce_error(a, topic) == TOPIC_AUTH
    assert end_offset(b, topic) == 6
    # DescribeAcls with a MATCH filter finds every pattern covering the topic.
    match = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.MATCH, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)
    found = su.describe_acls(match).result(timeout=30)
    assert len(found) == 3
    assert {(x.name, x.resource_pattern_type, x.operation, x.permission_type) for x in found} == {
        (prefix, ResourcePatternType.PREFIXED, AclOperation.WRITE, AclPermissionType.ALLOW),
        (prefix, ResourcePatternType.PREFIXED, AclOperation.READ, AclPermissionType.ALLOW),
        (topic, ResourcePatternType.LITERAL, AclOperation.WRITE, AclPermissionType.DENY)}
    # Deleting the DENY by filter gives WRITE back; deleting the grants takes everything away.
    deny = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None, AclOperation.ANY,
                            AclPermissionType.DENY)
    [deleted] = su.delete_acls([deny]).values()
    assert len(deleted.result(timeout=30)) == 1
    assert produce_error(a, topic) is None
    alice_all = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None,
                                 AclOperation.ANY, AclPermissionType.ANY)
    [deleted] = su.delete_acls([alice_all]).values()
    assert len(deleted.result(timeout=30)) == 3
    assert produce_error(a, topic) == TOPIC_AUTH
    assert su.describe_acls(alice_all).result(timeout=30) == []


def test_authorized_operations_follow_the_acls(broker_factory):
    b = start(broker_factory)
    su = admin(b, "admin")
    group, topic = uniq("alice-ops"), uniq("ops")
    new_topic(b, topic)
    create_acls(su, [group_acl("alice", group, AclOperation.READ), topic_acl("alice", topic, AclOperation.READ),
                     AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:alice", "*",
                                AclOperation.DESCRIBE, AclPermissionType.ALLOW)])
    # A committed offset makes the group exist for DescribeGroups.
    assert commit_error(conf(b, "alice"), group, topic, 0) is None
    aa = admin(b, "alice")
    cluster = aa.describe_cluster(include_authorized_operations=True).result(timeout=30)
    assert set(cluster.authorized_operations) == {AclOperation.DESCRIBE}
    full = su.describe_cluster(include_authorized_operations=True).result(timeout=30)
    assert set(full.authorized_operations) == {
        AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER, AclOperation.DESCRIBE}
    [d] = aa.describe_consumer_groups([group], include_authorized_operations=True).values()
    # READ implies DESCRIBE.
    assert set(d.result(timeout=30).authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}
    # mallory may not describe the cluster: no operations at all.
    ma = admin(b, "mallory")
    none = ma.describe_cluster(include_authorized_operations=True).result(timeout=30)
    assert not none.authorized_operations


def test_without_an_authorizer_everything_is_authorized_and_acl_apis_are_disabled(broker_factory):
    b = broker_factory()
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    cluster = a.describe_cluster(include_authorized_operations=True).result(timeout=30)
    assert len(set(cluster.authorized_operations)) == 7
    [f] = a.create_acls([topic_acl("alice", "t", AclOperation.READ)]).values()
    assert error_code(f) == KafkaError.SECURITY_DISABLED
    assert kafka_python_describe_acls_error(None, b) == "SecurityDisabledError"


# --------------------------------------------------------------------- ZooKeeper, every broker, restart

def test_acls_in_zookeeper_reach_every_broker_and_a_restarted_one(broker_factory, zookeeper):
    from kazoo.client import KazooClient
    chroot = "/" + uniq("acls")
    zk_extra = lambda i: {"zookeeper.connect": zookeeper.connect + chroot, "broker.id": str(i)}  # noqa: E731
    # Broker 1 takes admin requests on its ADMIN listener, which only it has; broker 2 alone
    # has the SASL listener. So ACLs are written through 1 and enforced by 2.
    b1 = start(broker_factory, ("PLAINTEXT", "ADMIN"), zk_extra(1), broker_id=1)
    b2 = start(broker_factory, ("PLAINTEXT", "SASL_PLAINTEXT"), zk_extra(2), broker_id=2)
    via1 = AdminClient({"bootstrap.servers": f"127.0.0.1:{b1.ports['ADMIN']}"})
    topic, group = uniq("zt"), uniq("alice-z")
    direct = admin(b2)
    for f in direct.create_topics([NewTopic(topic, 1, replica_assignment=[[2]])]).values():
        f.result(timeout=30)
    wait_until(lambda: topic in admin(b2).list_topics(timeout=10).topics, 30, "the topic on broker 2")
    alice = conf(b2, "alice")
    assert produce_error(alice, topic) == TOPIC_AUTH
    prefix = topic[:4]
    create_acls(via1, [topic_acl("alice", topic, AclOperation.WRITE),
                       topic_acl("alice", prefix, AclOperation.READ, ResourcePatternType.PREFIXED),
                       group_acl("alice", group, AclOperation.READ)])

    zk = KazooClient(hosts=zookeeper.connect + chroot)
    zk.start()
    try:
        assert json.loads(zk.get(f"/kafka-acl/Topic/{topic}")[0]) == {"version": 1, "acls": [
            {"principal": "User:alice", "permissionType": "Allow", "operation": "Write", "host": "*"}]}
        assert json.loads(zk.get(f"/kafka-acl-extended/prefixed/Topic/{prefix}")[0]) == {"version": 1, "acls": [
            {"principal": "User:alice", "permissionType": "Allow", "operation": "Read", "host": "*"}]}
        literal = [zk.get(f"/kafka-acl-changes/{n}")[0].decode() for n in zk.get_children("/kafka-acl-changes")]
        assert all(n.startswith("acl_changes_") for n in zk.get_children("/kafka-acl-changes"))
        assert f"Topic:{topic}" in literal
        extended = [json.loads(zk.get(f"/kafka-acl-extended-changes/{n}")[0])
                    for n in zk.get_children("/kafka-acl-extended-changes")]
        assert {"version": 1, "resourceType": "TOPIC", "name": prefix, "patternType": "PREFIXED"} in extended
    finally:
        zk.stop()

    # Broker 2 follows the notifications: alice's grants take effect there.
    wait_until(lambda: produce_error(alice, topic, 2) is None, 30, "alice's WRITE on broker 2")
    got, err = consume(alice, topic, 2, group=group)
    assert err is None and len(got) == 2

    # While broker 2 is down, WRITE is taken back and READ denied on the literal topic.
    b2.stop()
    gone = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice", None,
                            AclOperation.WRITE, AclPermissionType.ALLOW)
    [f] = via1.delete_acls([gone]).values()
    assert len(f.result(timeout=30)) == 1
    create_acls(via1, [topic_acl("alice", topic, AclOperation.READ, permission=AclPermissionType.DENY)])
    b2.start()
    # The restarted broker reads the ACLs before it listens, so it enforces what it missed
    # (once the controller has made it the partition's leader again).
    wait_until(lambda: end_offset(b2, topic) == 2, 30, "the partition back on broker 2")
    before = 2
    assert produce_error(alice, topic) == TOPIC_AUTH
    got, err = consume(alice, topic, 2, group=group)
    assert (got, err) == ([], TOPIC_AUTH)
    assert end_offset(b2, topic) == before
