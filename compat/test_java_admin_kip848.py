"""The Java Admin client (kafka-clients 3.9.1) against new-protocol groups (KIP-848) and
client-metrics subscriptions (KIP-714), via compat/java/GregorKip848.java.

3.9's describeConsumerGroups asks ConsumerGroupDescribe (69) first and falls back to
DescribeGroups for the groups that answer GROUP_ID_NOT_FOUND (classic or unknown ones);
listConsumerGroups sends ListGroups v5 with type and state filters; listClientMetricsResources
is ListClientMetricsResources (74 v0). The group's members are librdkafka consumers and a Java
3.9 consumer, all with group.protocol=consumer.

Jars and javac as in test_java.py: missing ones FAIL unless GREGOR_SKIP_JAVA=1.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from typing import List

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

import java_client  # noqa: E402
from common import uniq, wait_until  # noqa: E402
from gregor_fixtures import _failed  # noqa: E402
from groups_tools import Worker  # noqa: E402

if os.environ.get("GREGOR_SKIP_JAVA") == "1":
    pytest.skip("GREGOR_SKIP_JAVA=1", allow_module_level=True)

WAIT = 60
PARTS = 6
MAIN = "GregorKip848"
OVERRIDES = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "5",
    "group.consumer.heartbeat.interval.ms": "1000",
    "group.consumer.min.heartbeat.interval.ms": "1000",
    "group.consumer.session.timeout.ms": "10000",
    "group.consumer.min.session.timeout.ms": "6000",
    "gregor.client.telemetry.enable": "true",
}


@pytest.fixture(scope="module")
def java_classpath():
    cp, out = java_client.compile_client()
    yield cp
    shutil.rmtree(out, ignore_errors=True)


def run_java(cp, broker, *args) -> List[str]:
    out = java_client.run(cp, broker.bootstrap, broker.base_dir / "java-tmp", *args, timeout=180, main_class=MAIN)
    return out.splitlines()


class JavaConsumer:
    """GregorKip848 `consumer`: a Java 3.9 group.protocol=consumer member; runs until stdin closes."""

    def __init__(self, cp, broker, group, topic):
        tmp = broker.base_dir / "java-tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(["java", "-Xmx256m", f"-Djava.io.tmpdir={tmp}", "-cp", cp, MAIN,
                                      broker.bootstrap, "consumer", group, topic],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: List[str] = []
        self.err: List[bytes] = []
        threading.Thread(target=lambda: self.lines.extend(ln.decode(errors="replace").strip()
                                                          for ln in self.proc.stdout), daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()

    def assignment(self) -> set:
        last = [ln for ln in list(self.lines) if ln.startswith("ASSIGNED ")]
        if not last:
            return set()
        return {int(p) for p in last[-1].split(" ", 1)[1].split(",") if p}

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                rc = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
            assert rc == 0, f"Java consumer exited {rc}: {b''.join(self.err).decode(errors='replace')[-3000:]}"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def members(request):
    made = []
    log_dir = tempfile.mkdtemp(prefix="gregor-java848-")

    def worker(name, bootstrap, group, topic, protocol="consumer") -> Worker:
        extra = {"group.protocol": protocol, "topic.metadata.refresh.interval.ms": 1000}
        w = Worker(name, bootstrap, group, topic, log_dir=log_dir, extra=extra).start()
        made.append(w)
        return w

    def java(cp, broker, group, topic) -> JavaConsumer:
        j = JavaConsumer(cp, broker, group, topic)
        made.append(j)
        return j

    yield worker, java
    for m in made:
        m.kill()
    if _failed(request):
        for m in made:
            if isinstance(m, JavaConsumer):
                request.node.add_report_section("call", "java consumer", "\n".join(m.lines[-20:]) + "\n"
                                                + b"".join(m.err).decode(errors="replace")[-4000:])
            else:
                request.node.add_report_section("call", f"worker {m.name}", m.stderr_tail())


def create_topic(bootstrap: str, name: str) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(name, num_partitions=PARTS, replication_factor=1)])[name].result(timeout=WAIT)


def parse(lines: List[str], tag: str) -> dict:
    out = {}
    for ln in lines:
        if ln.startswith(tag + " "):
            rest = ln[len(tag) + 1:]
            if tag == "GROUP":
                g = json.loads(rest)
                out[g["group_id"]] = g
            elif tag == "GROUPERR":
                gid, err = rest.split(" ", 1)
                out[gid] = err
            else:
                key, js = rest.split(" ", 1)
                out[key] = json.loads(js)
    return out


def test_describe_and_list_a_new_protocol_group_next_to_a_classic_one(broker_factory, java_classpath, members):
    worker, java = members
    b = broker_factory(overrides=OVERRIDES)
    topic, group, classic_group = uniq("j848"), uniq("g-new"), uniq("g-classic")
    create_topic(b.bootstrap, topic)
    w0 = worker("rdk-0", b.bootstrap, group, topic)
    w1 = worker("rdk-1", b.bootstrap, group, topic)
    j = java(java_classpath, b, group, topic)
    c0 = worker("classic-0", b.bootstrap, classic_group, topic, protocol="classic")

    def split():
        a = {"rdk-0": w0.assignment(), "rdk-1": w1.assignment(), "java": j.assignment()}
        flat = sorted(p for s in a.values() for p in s)
        return a if flat == list(range(PARTS)) and all(len(s) == 2 for s in a.values()) else None

    try:
        owned = wait_until(split, WAIT, "three new-protocol members with two partitions each", interval=0.2)
    except TimeoutError as e:
        raise AssertionError(f"{e}: {w0.assignment()} {w1.assignment()} {j.assignment()}") from None
    wait_until(lambda: c0.assignment() == set(range(PARTS)), WAIT, "the classic member to own every partition")
    missing = uniq("g-none")

    # The members settle (assignment == target) a heartbeat after their last change.
    def described():
        lines = run_java(java_classpath, b, "describe-groups", group, classic_group, missing)
        d = parse(lines, "GROUP")
        g = d.get(group)
        ok = g and g["state"] == "Stable" and all(m["assignment"] == m["target_assignment"] for m in g["members"])
        return (d, parse(lines, "GROUPERR")) if ok else None

    d, errs = wait_until(described, WAIT, "describeConsumerGroups to show a Stable group", interval=1)
    g = d[group]
    assert g["type"] == "Consumer" and g["state"] == "Stable" and not g["simple"], g
    assert g["assignor"] == "uniform", g
    assert g["coordinator"] == b.broker_id, g
    by_client = {m["client_id"]: m for m in g["members"]}
    assert set(by_client) == {"rdk-0", "rdk-1", f"java-{group}"}, g
    assert by_client["rdk-0"]["member_id"] == w0.member_id()
    assert by_client["rdk-1"]["member_id"] == w1.member_id()
    # Kafka gives a member that sent no id (the Java 3.9 client) a base64 Uuid, 22 characters.
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", by_client[f"java-{group}"]["member_id"]), by_client
    for client, parts in (("rdk-0", owned["rdk-0"]), ("rdk-1", owned["rdk-1"]), (f"java-{group}", owned["java"])):
        m = by_client[client]
        want = sorted(f"{topic}:{p}" for p in parts)
        assert m["assignment"] == want and m["target_assignment"] == want, (client, m, want)
        assert m["instance_id"] is None and m["host"], m

    # The classic group comes from DescribeGroups, as 3.9 falls back to it.
    c = d[classic_group]
    assert c["type"] == "Classic" and c["state"] == "Stable", c
    assert c["assignor"] in ("range", "roundrobin", "cooperative-sticky"), c
    assert [m["client_id"] for m in c["members"]] == ["classic-0"], c
    assert c["members"][0]["assignment"] == sorted(f"{topic}:{p}" for p in range(PARTS)), c
    assert c["members"][0]["target_assignment"] is None, c
    # A group nobody knows: DescribeGroups' Dead with no members, as Kafka answers 3.9.
    assert not errs, errs
    assert d[missing]["state"] == "Dead" and d[missing]["members"] == [], d[missing]

    lists = parse(run_java(java_classpath, b, "list-groups"), "LIST")
    every = {x["group_id"]: x for x in lists["all"]}
    assert every[group] == {"group_id": group, "simple": False, "state": "Stable", "type": "Consumer"}, every
    assert every[classic_group] == {"group_id": classic_group, "simple": False, "state": "Stable",
                                    "type": "Classic"}, every
    assert {x["group_id"] for x in lists["type-consumer"]} >= {group}
    assert classic_group not in {x["group_id"] for x in lists["type-consumer"]}
    assert {x["group_id"] for x in lists["type-classic"]} >= {classic_group}
    assert group not in {x["group_id"] for x in lists["type-classic"]}
    assert {x["group_id"] for x in lists["state-stable"]} >= {group, classic_group}

    # Every member leaves: the group is Empty and still a consumer group.
    for m in (w0, w1):
        m.close()
    j.close()
    c0.close()
    d = wait_until(lambda: (lambda x: x if x[group]["state"] == "Empty" else None)(
        parse(run_java(java_classpath, b, "describe-groups", group), "GROUP")), WAIT, "the group to be Empty", interval=1)
    assert d[group]["type"] == "Consumer" and d[group]["members"] == [], d[group]


def test_client_metrics_subscriptions_through_the_admin_client(broker_factory, java_classpath):
    b = broker_factory(overrides=OVERRIDES)
    lines = run_java(java_classpath, b, "client-metrics", uniq("sub"))
    refusals = [ln for ln in lines if ln.startswith("REFUSED")]
    assert len(refusals) == 6, lines
