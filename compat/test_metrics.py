"""Prometheus metrics on /metrics (`metrics.port`) and JSON logs (`GREGOR_LOG_FORMAT=json`).

Real brokers, real clients (kcat, confluent-kafka), a real ZooKeeper for the cluster case.
Every wait polls a scrape or a log for the condition; nothing sleeps and hopes.
"""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from typing import Dict, FrozenSet, Optional, Tuple

import pytest

import gregor_harness
from cluster_harness import Cluster
from common import uniq, wait_until
from gregor_fixtures import _failed, _register

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat not installed (scripts/test installs it)")

Series = Tuple[str, FrozenSet[Tuple[str, str]]]

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Scrape:
    """One /metrics answer, parsed."""

    def __init__(self, text: str):
        self.text = text
        self.types: Dict[str, str] = {}
        self.samples: Dict[Series, float] = {}
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                self.types[name] = kind
                continue
            if not line or line.startswith("#"):
                continue
            m = _SAMPLE.match(line)
            assert m, f"not an exposition line: {line!r}"
            labels = frozenset(_LABEL.findall(m.group(2) or ""))
            key = (m.group(1), labels)
            assert key not in self.samples, f"series twice: {line!r}"
            self.samples[key] = float(m.group(3))

    def get(self, name: str, **labels: str) -> Optional[float]:
        return self.samples.get((name, frozenset(labels.items())))

    def value(self, name: str, **labels: str) -> float:
        """The series' value, 0 if it does not exist (yet)."""
        return self.get(name, **labels) or 0.0

    def total(self, name: str, **labels: str) -> float:
        """Sum over every series of `name` carrying at least `labels`."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)


def scrape(port: int, path: str = "/metrics") -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers["Content-Type"]
        return Scrape(r.read().decode())


def with_metrics(overrides: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, str], int]:
    port = gregor_harness.free_port()
    o = {"metrics.port": str(port), "metrics.host": "127.0.0.1"}
    o.update(overrides or {})
    return o, port


def kcat(args, input=None, timeout=120):
    p = subprocess.run([KCAT, "-m", "30"] + args, input=input, capture_output=True, timeout=timeout)
    assert p.returncode == 0, f"kcat {' '.join(args)} exited {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}"
    return p


# -- one broker ------------------------------------------------------------------------------

@needs_kcat
def test_produce_and_fetch_move_kafkas_metrics(broker_factory):
    overrides, port = with_metrics()
    b = broker_factory(overrides)
    topic = uniq("metrics")
    before = scrape(port)
    assert before.get("kafka_server_brokertopicmetrics_messagesin_total", topic=topic) is None
    all_before = before.value("kafka_server_brokertopicmetrics_messagesin_total")
    produce_before = before.total("kafka_network_requestmetrics_requests_total", request="Produce")

    n = 1000
    kcat(["-P", "-b", b.bootstrap, "-t", topic], input="".join(f"record-{i}\n" for i in range(n)).encode())

    # kcat exits once every record is acknowledged, and the counters move before the answer.
    after = scrape(port)
    assert after.get("kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == n
    assert after.value("kafka_server_brokertopicmetrics_messagesin_total") - all_before == n
    bytes_in = after.value("kafka_server_brokertopicmetrics_bytesin_total", topic=topic)
    # Batches are stored as they came: what was counted in is what the log holds.
    assert bytes_in > n * len("record-0")
    assert after.total("kafka_log_log_size", topic=topic) == bytes_in
    assert after.get("kafka_log_log_size", topic=topic, partition="0") == bytes_in
    assert after.get("kafka_log_log_logendoffset", topic=topic, partition="0") == n
    assert after.get("kafka_log_log_logstartoffset", topic=topic, partition="0") == 0
    assert after.total("kafka_network_requestmetrics_requests_total", request="Produce") > produce_before
    produce_versions = [dict(ls)["version"] for (name, ls) in after.samples
                        if name == "kafka_network_requestmetrics_requests_total" and ("request", "Produce") in ls]
    assert produce_versions and all(v.isdigit() for v in produce_versions), produce_versions
    assert after.value("kafka_network_requestmetrics_totaltimems_count", request="Produce") >= 1
    assert after.value("kafka_network_requestmetrics_totaltimems_bucket", request="Produce", le="+Inf") >= 1
    assert after.total("kafka_network_requestmetrics_requests_total", request="Metadata") >= 1

    out = kcat(["-C", "-b", b.bootstrap, "-t", topic, "-o", "beginning", "-e", "-q"]).stdout.decode()
    assert len(out.splitlines()) == n
    fetched = scrape(port)
    assert fetched.value("kafka_server_brokertopicmetrics_bytesout_total", topic=topic) >= bytes_in
    assert fetched.value("kafka_server_brokertopicmetrics_bytesout_total") >= bytes_in
    assert fetched.value("kafka_network_requestmetrics_totaltimems_count", request="FetchConsumer") >= 1
    assert fetched.get("kafka_network_requestmetrics_totaltimems_count", request="FetchFollower") is None
    assert fetched.value("kafka_server_brokertopicmetrics_replicationbytesout_total", topic=topic) == 0

    # The broker's state, computed at the scrape.
    s = fetched
    for name, want in [
        ("kafka_server_replicamanager_partitioncount", 1),
        ("kafka_server_replicamanager_leadercount", 1),
        ("kafka_server_replicamanager_underreplicatedpartitions", 0),
        ("kafka_controller_kafkacontroller_activecontrollercount", 1),
        ("kafka_controller_kafkacontroller_offlinepartitionscount", 0),
        ("kafka_controller_kafkacontroller_globaltopiccount", 1),
        ("kafka_controller_kafkacontroller_globalpartitioncount", 1),
        ("kafka_server_replicamanager_isrshrinks_total", 0),
        ("kafka_server_replicamanager_isrexpands_total", 0),
    ]:
        assert s.get(name) == want, f"{name} = {s.get(name)}, want {want}"
    # kcat's last fetch may still be waiting out its max.wait.ms after kcat left.
    wait_until(lambda: all(scrape(port).get("kafka_server_delayedoperationpurgatory_purgatorysize",
                                            delayedOperation=op) == 0 for op in ("Produce", "Fetch")),
               30, "both purgatories to be empty")
    # Standalone has no ZooKeeper session to report.
    assert not any(name.startswith("kafka_server_sessionexpirelistener") for name, _ in s.samples)
    assert s.value("kafka_server_socket_server_metrics_connection_creation_total", listener="PLAINTEXT") >= 2
    assert s.get("kafka_server_socket_server_metrics_connection_count", listener="PLAINTEXT") is not None

    # Counters are counters, state is gauges, latency is a histogram.
    for name in ("kafka_server_brokertopicmetrics_messagesin_total", "kafka_server_brokertopicmetrics_bytesin_total",
                 "kafka_server_brokertopicmetrics_bytesout_total", "kafka_network_requestmetrics_requests_total",
                 "kafka_server_replicamanager_isrshrinks_total", "kafka_server_replicamanager_isrexpands_total"):
        assert s.types.get(name) == "counter", (name, s.types.get(name))
    for name in ("kafka_server_replicamanager_underreplicatedpartitions", "kafka_log_log_size",
                 "kafka_server_delayedoperationpurgatory_purgatorysize",
                 "kafka_server_socket_server_metrics_connection_count",
                 "kafka_controller_kafkacontroller_activecontrollercount"):
        assert s.types.get(name) == "gauge", (name, s.types.get(name))
    assert s.types.get("kafka_network_requestmetrics_totaltimems") == "histogram"


def test_long_poll_and_open_connections_are_counted(broker_factory):
    """A consumer's fetch waiting for data sits in the Fetch purgatory, and an open
    connection is counted, until they end."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    overrides, port = with_metrics({"num.partitions": "1"})
    b = broker_factory(overrides)
    topic = uniq("longpoll")
    p = Producer({"bootstrap.servers": b.bootstrap})
    p.produce(topic, b"one")
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": uniq("g"), "enable.auto.commit": False,
                  "fetch.wait.max.ms": 5000, "fetch.min.bytes": 1 << 20})
    try:
        c.assign([TopicPartition(topic, 0, 1)])
        c.poll(0.1)

        def parked():
            c.poll(0.1)
            s = scrape(port)
            return (s.value("kafka_server_delayedoperationpurgatory_purgatorysize", delayedOperation="Fetch") >= 1
                    and s.value("kafka_server_socket_server_metrics_connection_count", listener="PLAINTEXT") >= 1)

        wait_until(parked, 30, "a long-polling fetch in the Fetch purgatory and an open connection")
    finally:
        c.close()
    wait_until(lambda: scrape(port).value("kafka_server_delayedoperationpurgatory_purgatorysize",
                                          delayedOperation="Fetch") == 0,
               30, "the Fetch purgatory to empty once the consumer left")


@pytest.mark.parametrize("value", ["http", "0", "65536", "-1"])
def test_bad_metrics_port_is_refused_naming_the_key(broker_factory, value):
    with pytest.raises(gregor_harness.BrokerStartError) as e:
        broker_factory({"metrics.port": value})
    msg = str(e.value)
    assert "exited with code" in msg and "exited with code 0" not in msg, msg
    assert f'invalid value "{value}" for configuration metrics.port' in msg.split("during startup", 1)[-1], msg


def test_metrics_port_in_use_stops_the_broker_naming_the_keys(broker_factory):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(gregor_harness.BrokerStartError) as e:
            broker_factory({"metrics.port": str(port), "metrics.host": "127.0.0.1"})
    msg = str(e.value).split("during startup", 1)[-1]
    assert f"cannot listen on 127.0.0.1:{port} for metrics (metrics.host, metrics.port)" in msg, msg


def test_only_metrics_is_served(broker_factory):
    overrides, port = with_metrics()
    broker_factory(overrides)
    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(port, "/")
    assert e.value.code == 404
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405


# -- logs ------------------------------------------------------------------------------------

@needs_kcat
def test_json_logs_are_one_object_per_line(broker_factory):
    b = broker_factory(env={"GREGOR_LOG_FORMAT": "json"})
    topic = uniq("jsonlog")
    kcat(["-P", "-b", b.bootstrap, "-t", topic], input=b"a\nb\n")
    assert b.stop() == 0
    lines = [l for l in b.log_path.read_text().splitlines() if l.strip()]
    events = []
    for line in lines:
        obj = json.loads(line)  # every line, or the collector chokes
        assert {"timestamp", "level", "target", "message"} <= obj.keys(), obj
        events.append(obj)
    messages = [e["message"] for e in events]
    for wanted in ("broker started", "listening", "became controller", "created topic", "shutting down",
                   "logs flushed; clean shutdown recorded"):
        assert wanted in messages, f"no {wanted!r} event in {messages}"
    started = next(e for e in events if e["message"] == "broker started")
    assert started["level"] == "INFO" and started["broker_id"] == 0, started  # fields at the top level
    created = next(e for e in events if e["message"] == "created topic")
    assert created["topic"] == topic
    assert created["span"]["name"] == "connection" and "peer" in created["span"], created
    # Nothing is logged per request at info.
    assert messages.count("created topic") == 1


def test_text_logs_stay_the_default(broker_factory):
    b = broker_factory()
    assert b.stop() == 0
    text = b.log_path.read_text()
    assert " INFO gregor::broker: broker started" in text, text[-2000:]
    assert not text.lstrip().startswith("{")


def test_unknown_log_format_is_refused(broker_factory):
    with pytest.raises(gregor_harness.BrokerStartError) as e:
        broker_factory(env={"GREGOR_LOG_FORMAT": "xml"})
    msg = str(e.value).split("during startup", 1)[-1]
    assert 'GREGOR_LOG_FORMAT="xml" is not a log format' in msg, msg


# -- a cluster: replication, ISR, controller and ZooKeeper gauges ----------------------------

@pytest.fixture
def metrics_cluster(request, zookeeper):
    ports: Dict[int, int] = {}

    def on_new_broker(b):
        _register(request, b)
        port = gregor_harness.free_port()
        ports[b.broker_id] = port
        b.overrides.update({"metrics.port": str(port), "metrics.host": "127.0.0.1"})

    # A short replica lag so that a dead follower leaves the ISR by the leader's doing, well
    # before its ZooKeeper session expires and the controller acts.
    c = Cluster(zookeeper, 2, session_timeout_ms=10000, on_new_broker=on_new_broker,
                overrides={"replica.lag.time.max.ms": "1000", "offsets.topic.replication.factor": "1"})
    c.metrics_ports = ports  # type: ignore[attr-defined]
    try:
        c.start()
        yield c
    finally:
        c.cleanup(keep=_failed(request))


def test_cluster_reports_replication_isr_controller_and_session(metrics_cluster):
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    c = metrics_cluster
    ports = c.metrics_ports
    replicated, single = uniq("rf2"), uniq("rf1")
    admin = c.admin(1)
    for f in admin.create_topics([NewTopic(replicated, 1, 2), NewTopic(single, 2, 1)]).values():
        f.result(30)
    c.wait_topic_online(replicated, 1)
    c.wait_topic_online(single, 2)
    leader = c.partition_state(replicated, 0)["leader"]
    follower = 3 - leader

    def both():
        return {i: scrape(ports[i]) for i in (1, 2)}

    def settled():
        s = both()
        return (sum(x.value("kafka_controller_kafkacontroller_activecontrollercount") for x in s.values()) == 1
                and all(x.get("kafka_server_sessionexpirelistener_sessionstate") == 1 for x in s.values())
                and s[leader].value("kafka_server_replicamanager_underreplicatedpartitions") == 0
                and all(x.value("kafka_server_replicamanager_partitioncount") == 2 for x in s.values()))

    wait_until(settled, 60, "one active controller, sessions connected, each broker hosting 2 partitions")

    n = 500
    p = Producer({"bootstrap.servers": c.bootstrap(), "acks": "all"})
    for i in range(n):
        p.produce(replicated, f"v{i}".encode())
    assert p.flush(60) == 0

    s = both()
    assert s[leader].get("kafka_server_brokertopicmetrics_messagesin_total", topic=replicated) == n
    # The follower appends the same batches, as replication, not as messages in.
    assert s[follower].value("kafka_server_brokertopicmetrics_messagesin_total", topic=replicated) == 0
    bytes_in = s[leader].value("kafka_server_brokertopicmetrics_bytesin_total", topic=replicated)
    assert bytes_in > 0
    wait_until(lambda: scrape(ports[follower]).value("kafka_server_brokertopicmetrics_replicationbytesin_total",
                                                      topic=replicated) == bytes_in,
               30, "the follower to have replicated every byte")
    s = both()
    assert s[leader].value("kafka_server_brokertopicmetrics_replicationbytesout_total", topic=replicated) >= bytes_in
    assert s[follower].get("kafka_log_log_size", topic=replicated, partition="0") == bytes_in
    assert s[leader].value("kafka_network_requestmetrics_totaltimems_count", request="FetchFollower") >= 1
    assert s[leader].total("kafka_network_requestmetrics_requests_total", request="Fetch") >= 1
    assert s[follower].total("kafka_network_requestmetrics_requests_total", request="LeaderAndIsr") >= 1
    for i in (1, 2):
        assert s[i].get("kafka_server_sessionexpirelistener_zookeeperexpires_total") == 0

    # A dead follower that falls behind leaves the ISR: the leader shrinks it.
    c.brokers[follower].kill()
    p1 = Producer({"bootstrap.servers": c.brokers[leader].bootstrap, "acks": "1"})
    p1.produce(replicated, b"after the follower died")
    assert p1.flush(30) == 0
    wait_until(lambda: (lambda x: x.value("kafka_server_replicamanager_underreplicatedpartitions") == 1
                        and x.value("kafka_server_replicamanager_isrshrinks_total") >= 1)(scrape(ports[leader])),
               30, "the leader to report its partition under-replicated after an ISR shrink")
    assert "ISR shrunk" in c.brokers[leader].log_path.read_text()

    # Once the session expires, the surviving broker is (or stays) the controller and counts
    # the single-replica partition the dead broker led as offline.
    wait_until(lambda: (lambda x: x.value("kafka_controller_kafkacontroller_activecontrollercount") == 1
                        and x.value("kafka_controller_kafkacontroller_offlinepartitionscount") == 1)(
        scrape(ports[leader])), c.failover_timeout, "the controller to count one offline partition")

    # Back, caught up, back in the ISR: the leader expands it; nothing is offline any more.
    c.brokers[follower].start()
    wait_until(lambda: (lambda x: x.value("kafka_server_replicamanager_underreplicatedpartitions") == 0
                        and x.value("kafka_server_replicamanager_isrexpands_total") >= 1
                        and x.value("kafka_controller_kafkacontroller_offlinepartitionscount") == 0)(
        scrape(ports[leader])), c.failover_timeout, "the ISR to expand and the offline partition to return")
    assert "ISR expanded" in c.brokers[leader].log_path.read_text()
