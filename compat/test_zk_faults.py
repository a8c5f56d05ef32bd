"""ZooKeeper faults: a cluster rides out a stalled ZooKeeper and a stalled broker.

Real ZooKeeper, three real gregor processes, real clients (confluent-kafka). A stall is a
SIGSTOP held for twice the session timeout, so the server expires the sessions involved;
the test then polls for the outcome (registrations back with a new session, ISR changes
working) rather than sleeping and hoping.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from cluster_harness import Cluster
from gregor_fixtures import _failed, _register
from gregor_harness import wait_until
from replication_tools import SeqProducer, sigcont, sigstop

SESSION_MS = 6000
STALL_S = 2 * SESSION_MS / 1000.0


@pytest.fixture
def cluster(request, zookeeper):
    c = Cluster(zookeeper, 3, session_timeout_ms=SESSION_MS, on_new_broker=lambda b: _register(request, b))
    try:
        c.start()
        yield c
    finally:
        c.cleanup(keep=_failed(request))


def zk_pids(zk) -> list:
    """The ZooKeeper launcher and every process below it (the JVM runs as its child)."""
    pids = [zk.proc.pid]
    out = subprocess.run(["pgrep", "-P", str(zk.proc.pid)], capture_output=True, text=True).stdout
    pids += [int(p) for p in out.split()]
    return pids


def session_owners(c: Cluster) -> dict:
    """{broker id: ephemeralOwner of /brokers/ids/<id>} for the registered brokers."""
    owners = {}
    for i in c.registered_ids():
        stat = c.kz.exists(f"/brokers/ids/{i}")
        if stat is not None:
            owners[i] = stat.ephemeralOwner
    return owners


def create_topic(c: Cluster, name: str, partitions: int, rf: int) -> None:
    a = c.admin(1)
    a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf)])[name].result(timeout=60)
    c.wait_topic_online(name, partitions, timeout=60)


def wait_full_isr(c: Cluster, topic: str, want: list, timeout: float = 60) -> None:
    wait_until(lambda: all(sorted(s["isr"]) == want for s in c.partition_states(topic).values()),
               timeout, f"every partition of {topic} with ISR {want}", interval=0.2)


def test_zookeeper_stall_keeps_brokers_serving_and_they_reregister(cluster, zookeeper):
    c = cluster
    topic = f"zkstall-{uuid.uuid4().hex[:8]}"
    create_topic(c, topic, 3, 3)
    wait_full_isr(c, topic, [1, 2, 3])
    before = session_owners(c)
    assert sorted(before) == [1, 2, 3]

    prod = SeqProducer(c.bootstrap(), topic, conf={"acks": "1", "enable.idempotence": False})
    prod.start()
    wait_until(lambda: prod.acked_count() >= 50, 60, "acks before the stall")
    pids = zk_pids(zookeeper)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        acked_at_stop = prod.acked_count()
        # The stall itself is the fault being injected; the check is that acks keep coming.
        deadline = time.monotonic() + STALL_S
        while time.monotonic() < deadline:
            time.sleep(0.2)
        acked_during = prod.acked_count() - acked_at_stop
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert acked_during > 100, f"only {acked_during} acks while ZooKeeper was stopped"
    for i, b in c.brokers.items():
        assert b.alive(), f"broker {i} exited during the ZooKeeper stall:\n{b.stderr_tail(30)}"

    # Every broker registers again in a new session (a new broker epoch).
    def reregistered():
        now = session_owners(c)
        return sorted(now) == [1, 2, 3] and all(now[i] != before[i] for i in now)

    wait_until(reregistered, 60, "every broker registered again with a new session", interval=0.2)
    c.wait_controller()
    wait_until(lambda: prod.acked_count() > acked_at_stop + acked_during + 100, 60, "acks after the stall")
    prod.stop()
    assert not prod.fatal(), prod.fatal()

    # The control plane works again: a dead follower leaves the ISR.
    victim = 3
    c.brokers[victim].kill()
    wait_until(lambda: all(victim not in s["isr"] for s in c.partition_states(topic).values()),
               c.failover_timeout, f"broker {victim} dropped from every ISR", interval=0.2)


def test_zookeeper_stall_does_not_stall_consumer_groups(cluster, zookeeper):
    """The coordinator copies membership to /consumers/<group> in ZooKeeper; while ZooKeeper is
    stopped, a member still joins, the group rebalances and commits, and the copy catches up
    once ZooKeeper is back."""
    from confluent_kafka import Consumer, TopicPartition

    c = cluster
    topic, group = f"zkgrp-{uuid.uuid4().hex[:8]}", f"zkgrp-g-{uuid.uuid4().hex[:8]}"
    create_topic(c, topic, 4, 3)
    p = Producer({"bootstrap.servers": c.bootstrap()})
    for i in range(400):
        p.produce(topic, value=b"%d" % i, partition=i % 4)
    assert p.flush(30) == 0
    conf = {"bootstrap.servers": c.bootstrap(), "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 300}
    a = Consumer(dict(conf, **{"client.id": "a"}))
    a.subscribe([topic])
    wait_until(lambda: a.poll(0.2) is not None and len(a.assignment()) == 4, 60, "the first member to own all 4")
    wait_until(lambda: c.exists(f"/consumers/{group}/ids") and len(c.kz.get_children(f"/consumers/{group}/ids")) == 1,
               60, "the first member in ZooKeeper", interval=0.2)
    b = Consumer(dict(conf, **{"client.id": "b"}))
    pids = zk_pids(zookeeper)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        stalled_at = time.monotonic()
        b.subscribe([topic])

        def rebalanced():
            a.poll(0.1)
            b.poll(0.1)
            got_a, got_b = {tp.partition for tp in a.assignment()}, {tp.partition for tp in b.assignment()}
            return got_a and got_b and not (got_a & got_b) and (got_a | got_b) == {0, 1, 2, 3}
        # Bounded by the stall itself: the rebalance must finish while ZooKeeper is stopped.
        wait_until(rebalanced, STALL_S, "both members to share the partitions during the stall", interval=0)
        a.commit(offsets=[TopicPartition(topic, tp.partition, 7) for tp in a.assignment()], asynchronous=False)
        assert time.monotonic() - stalled_at < STALL_S, "ZooKeeper was resumed before the group rebalanced"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    members = {a.memberid(), b.memberid()}
    wait_until(lambda: c.exists(f"/consumers/{group}/ids")
               and set(c.kz.get_children(f"/consumers/{group}/ids")) == members, 90,
               "both members in ZooKeeper after the stall", interval=0.2)
    committed = a.committed([TopicPartition(topic, tp.partition) for tp in a.assignment()], timeout=30)
    assert {tp.offset for tp in committed} == {7}
    a.close()
    b.close()


def test_stalled_broker_is_fenced_and_rejoins(cluster):
    c = cluster
    topic = f"brstall-{uuid.uuid4().hex[:8]}"
    create_topic(c, topic, 3, 3)
    wait_full_isr(c, topic, [1, 2, 3])
    victim = next(i for i in (1, 2, 3) if i != c.controller())
    before = session_owners(c)[victim]
    sigstop(c.brokers[victim])
    try:
        wait_until(lambda: victim not in c.registered_ids(), c.failover_timeout,
                   f"broker {victim}'s session to expire", interval=0.2)
        wait_until(lambda: all(s["leader"] != victim and victim not in s["isr"]
                               for s in c.partition_states(topic).values()),
                   c.failover_timeout, f"broker {victim} out of every leadership and ISR", interval=0.2)
    finally:
        sigcont(c.brokers[victim])
    wait_until(lambda: session_owners(c).get(victim, before) != before, 60,
               f"broker {victim} registered again in a new session", interval=0.2)
    wait_full_isr(c, topic, [1, 2, 3], timeout=90)
    assert c.brokers[victim].alive()


def test_expired_coordinator_is_back_at_once_though_its_group_moved(cluster):
    """A group coordinator stalled past its session loses the group to another broker, which
    then holds the group's /consumers/<group> znodes in its own session. Back, the stalled
    broker must not wait for those znodes (it used to, on its expired session, for minutes):
    its new session is in use within the session timeout plus 5 s, the znodes stay with the
    group's new coordinator, and a new idempotent producer bootstrapped from it is acknowledged on
    every partition."""
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    c = cluster
    topic, group = f"zkmove-{uuid.uuid4().hex[:8]}", f"zkmove-g-{uuid.uuid4().hex[:8]}"
    create_topic(c, topic, 4, 3)
    wait_full_isr(c, topic, [1, 2, 3])
    consumer = Consumer({"bootstrap.servers": c.bootstrap(), "group.id": group, "auto.offset.reset": "earliest",
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 300})
    consumer.subscribe([topic])
    ids = f"/consumers/{group}/ids"
    try:
        wait_until(lambda: consumer.poll(0.2) is None and len(consumer.assignment()) == 4
                   and c.exists(ids) and len(c.kz.get_children(ids)) == 1, 60, "the member in ZooKeeper")
        admin = AdminClient({"bootstrap.servers": c.bootstrap()})
        victim = admin.describe_consumer_groups([group])[group].result(30).coordinator.id
        member = f"{ids}/{c.kz.get_children(ids)[0]}"
        before = c.kz.exists(member).ephemeralOwner
        sigstop(c.brokers[victim])
        try:
            wait_until(lambda: victim not in c.registered_ids(), c.failover_timeout,
                       f"broker {victim}'s session to expire", interval=0.2)

            def moved():
                consumer.poll(0.1)
                for child in (c.kz.get_children(ids) if c.exists(ids) else []):
                    stat = c.kz.exists(f"{ids}/{child}")
                    if stat is not None and stat.ephemeralOwner not in (0, before):
                        return True
                return False
            wait_until(moved, 90, "the group's membership written by its new coordinator", interval=0)
            moved_to = {child: c.kz.exists(f"{ids}/{child}").ephemeralOwner for child in c.kz.get_children(ids)
                        if c.kz.exists(f"{ids}/{child}").ephemeralOwner not in (0, before)}
        finally:
            sigcont(c.brokers[victim])
        resumed = time.monotonic()
        log = c.brokers[victim].log_path
        wait_until(lambda: "session re-established" in log.read_text(errors="replace"), SESSION_MS / 1000 + 5,
                   f"broker {victim} to use a new ZooKeeper session", interval=0.1)
        back = time.monotonic() - resumed
        now = {child: c.kz.exists(f"{ids}/{child}").ephemeralOwner for child in moved_to}
        assert now == moved_to, "the stalled broker took the moved group's znodes back"
        # What it wrote back for the group before learning that it lost it goes once it does.
        victim_session = session_owners(c).get(victim)

        def only_the_coordinators():
            stats = [c.kz.exists(f"{ids}/{child}") for child in c.kz.get_children(ids)]
            return victim_session is not None and all(st is None or st.ephemeralOwner != victim_session for st in stats)
        wait_until(only_the_coordinators, 30, "the stalled broker's stale membership znodes to go", interval=0.2)
        assert {c.kz.exists(f"{ids}/{child}").ephemeralOwner for child in moved_to} == set(moved_to.values())
        p = Producer({"bootstrap.servers": c.brokers[victim].bootstrap, "enable.idempotence": True, "acks": "all"})
        acked = []
        for part in range(4):
            p.produce(topic, value=b"after", partition=part,
                      on_delivery=lambda err, msg: acked.append(msg.partition()) if err is None else None)
        assert p.flush(10) == 0 and sorted(acked) == [0, 1, 2, 3], f"acknowledged: {acked} ({back:.1f} s after resume)"
    finally:
        consumer.close()


def watches_by_session(zk) -> dict:
    """{session id: [watched paths]} from ZooKeeper's `wchc`."""
    from gregor_harness import zk_four_letter
    out = zk_four_letter(zk.host, zk.port, b"wchc", timeout=10).decode()
    sessions, current = {}, None
    for line in out.splitlines():
        if line.startswith("0x"):
            current = int(line.strip(), 16)
            sessions[current] = []
        elif line.strip() and current is not None:
            sessions[current].append(line.strip())
    return sessions


def test_watches_do_not_grow_with_topics(cluster, zookeeper):
    """A broker's ZooKeeper watches are a fixed handful, whether the cluster has 10 topics or
    1,000 (watching every topic or partition znode would cost each broker per topic)."""
    c = cluster

    def paths():
        by_session = watches_by_session(zookeeper)
        owners = session_owners(c)
        assert sorted(owners) == [1, 2, 3]
        return {i: by_session.get(owner, []) for i, owner in owners.items()}

    def counts():
        return {i: len(p) for i, p in paths().items()}

    a = c.admin(1)
    names = [f"w-{i:04d}" for i in range(1000)]
    for f in a.create_topics([NewTopic(n, 1, 1) for n in names[:10]]).values():
        f.result(timeout=120)
    wait_until(lambda: len(c.kz.get_children("/brokers/topics")) >= 10, 60, "10 topics")
    with_10 = counts()
    assert all(n > 0 for n in with_10.values()), f"wchc shows no watches for some broker: {with_10}"
    # Only the controller watches broker registrations, topics and admin requests; the others
    # learn all of that from its requests.
    controller = c.controller()
    for broker, watched in paths().items():
        controller_only = [p for p in watched if p.endswith(("/brokers", "/admin")) or "/brokers/" in p]
        if broker == controller:
            assert controller_only, f"controller {broker} watches {watched}"
        else:
            assert not controller_only, f"broker {broker} (not the controller) watches {watched}"
    for i in range(10, 1000, 100):
        for f in a.create_topics([NewTopic(n, 1, 1) for n in names[i:i + 100]]).values():
            f.result(timeout=300)
    wait_until(lambda: len(c.kz.get_children("/brokers/topics")) >= 1000, 300, "1,000 topics")
    # Every broker has taken in the new topics (so any per-topic watch would exist by now).
    wait_until(lambda: all(len(c.metadata(i, timeout=30).topics) >= 1000 for i in (1, 2, 3)), 300,
               "every broker's Metadata lists 1,000 topics", interval=1)
    with_1000 = counts()
    assert with_1000 == with_10, f"watches per broker grew with topics: {with_10} -> {with_1000}"


def test_restarted_broker_with_3000_partitions_rejoins_every_isr(cluster):
    """kill -9 of a broker hosting 3,000 replicas (300 topics x 10, replication factor 3), then
    its restart: it must be back in every ISR, and lose nothing acknowledged before the kill."""
    c = cluster
    a = c.admin(1)
    names = [f"many-{i:03d}" for i in range(300)]
    for i in range(0, len(names), 100):
        for f in a.create_topics([NewTopic(n, 10, 3) for n in names[i:i + 100]]).values():
            f.result(timeout=300)

    def isr_counts():
        md = c.metadata(1, timeout=60)
        parts = [pm for t, tm in md.topics.items() if t.startswith("many-") for pm in tm.partitions.values()]
        return len(parts), {i: sum(1 for pm in parts if i in pm.isrs) for i in (1, 2, 3)}

    wait_until(lambda: isr_counts() == (3000, {1: 3000, 2: 3000, 3: 3000}), 300,
               "3,000 partitions with full ISRs", interval=1)
    # One acknowledged record in each of a few partitions, so the victim has data to catch up on.
    p = Producer({"bootstrap.servers": c.bootstrap(), "acks": "all", "log_level": 2})
    acked = {}
    for n in names[:20]:
        p.produce(n, b"before", partition=0,
                  on_delivery=lambda err, msg: err is None and acked.setdefault(msg.topic(), msg.offset()))
    assert p.flush(60) == 0
    assert len(acked) == 20

    victim = next(i for i in (1, 2, 3) if i != c.controller())
    c.brokers[victim].kill()
    wait_until(lambda: isr_counts()[1][victim] == 0, c.failover_timeout + 60,
               f"broker {victim} out of every ISR", interval=1)
    c.brokers[victim].start(timeout=300)
    wait_until(lambda: isr_counts()[1][victim] == 3000, 300, f"broker {victim} back in all 3,000 ISRs", interval=1)
    for n, off in acked.items():
        got = read_one(c.bootstrap(), n, off)
        assert got == b"before", f"{n}@{off}: {got!r}"


def read_one(bootstrap: str, topic: str, offset: int):
    from confluent_kafka import Consumer, TopicPartition
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                     "enable.auto.commit": False, "log_level": 2})
    try:
        cons.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = cons.poll(1.0)
            if m is not None and m.error() is None:
                return m.value()
        return None
    finally:
        cons.close()


def test_unreachable_zookeeper_at_start_is_a_clear_exit(tmp_path):
    """No ZooKeeper at zookeeper.connect: the broker retries, then exits non-zero naming what it
    could not reach; no panic (the harness helper fails on one)."""
    from cluster_harness import free_port, run_broker_expect_failure
    dead = f"127.0.0.1:{free_port()}"
    r = run_broker_expect_failure(1, dead, 6000, str(tmp_path), timeout=120)
    out = (r.stdout + r.stderr).decode(errors="replace")
    assert r.returncode != 0
    assert f"cannot connect to ZooKeeper at {dead}" in out, out[-2000:]
