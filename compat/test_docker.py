"""gregor as a drop-in broker in docker-compose, on the real Docker engine.

The images are built offline by scripts/images (a debootstrap root filesystem imported as the
base), with the broker binary under test (GREGOR_BIN). Each test runs its own compose project
on free host ports and removes it, volumes included, afterwards.

Skipped, with "no Docker engine" in the reason, only where no Docker engine answers.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Dict, List

import pytest

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import java_client
from cluster_harness import kcat_list
from gregor_harness import REPO, free_port, gregor_bin, wait_until
from replication_tools import SeqProducer, produce_sync, read_partitions
from test_metrics import Scrape

COMPOSE_FILE = REPO / "docker-compose.yml"
KCAT_IMAGE = "gregor-test-kcat:latest"
BASE_IMAGE = "gregor-base:bookworm"
SNIPPET_MARK = "# written for confluentinc/cp-kafka"


def _engine_answers() -> str:
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    r = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    return "" if r.returncode == 0 else (r.stderr.strip() or "docker info failed")


def _compose_command() -> List[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    raise AssertionError("a Docker engine answers but neither docker-compose nor `docker compose` exists")


def _run(cmd: List[str], timeout: float = 300, env=None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


@pytest.fixture(scope="module")
def images():
    why = _engine_answers()
    if why:
        pytest.skip(f"no Docker engine: {why}")
    env = dict(os.environ, GREGOR_BIN=str(gregor_bin()))
    _run([str(REPO / "scripts" / "images")], timeout=1500, env=env)
    if subprocess.run(["docker", "image", "inspect", KCAT_IMAGE], capture_output=True).returncode != 0:
        dockerfile = (f"FROM {BASE_IMAGE}\n"
                      "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
                      "--no-install-recommends kcat && rm -rf /var/lib/apt/lists/*\n")
        r = subprocess.run(["docker", "build", "-q", "-t", KCAT_IMAGE, "-"], input=dockerfile, text=True,
                           capture_output=True, timeout=900)
        assert r.returncode == 0, r.stderr
    return _compose_command()


class Project:
    """One compose project: its own containers, network and volumes, on free host ports."""

    def __init__(self, compose: List[str], file: Path, env: Dict[str, str], tmp: Path):
        self.name = "gregortest" + uuid.uuid4().hex[:8]
        self.compose = compose
        self.file = file
        self.env = dict(os.environ, **env)
        self.tmp = tmp

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return _run([*self.compose, "-p", self.name, "-f", str(self.file), *args], timeout, self.env, check)

    def container(self, service: str) -> str:
        cid = self.run("ps", "-q", service).stdout.strip()
        assert cid, f"no container for {service}"
        return cid

    def inspect(self, service: str) -> dict:
        return json.loads(_run(["docker", "inspect", self.container(service)]).stdout)[0]

    @property
    def network(self) -> str:
        return f"{self.name}_default"

    def down(self) -> None:
        logs = self.run("logs", "--no-color", "--tail", "200", check=False)
        (self.tmp / f"{self.name}.log").write_text(logs.stdout + logs.stderr)
        self.run("down", "-v", "--remove-orphans", "-t", "5", check=False)


@pytest.fixture
def project_factory(images, tmp_path):
    made: List[Project] = []

    def make(file: Path = COMPOSE_FILE, env: Dict[str, str] = None) -> Project:
        p = Project(images, file, env or {}, tmp_path)
        made.append(p)
        return p

    yield make
    for p in made:
        p.down()


def three_brokers(project_factory):
    ports = [free_port() for _ in range(3)]
    p = project_factory(env={f"GREGOR_PORT_{i + 1}": str(port) for i, port in enumerate(ports)})
    p.run("up", "-d", timeout=300)
    bootstrap = ",".join(f"localhost:{port}" for port in ports)
    wait_until(lambda: len(kcat_list(bootstrap).get("brokers", [])) == 3, 120,
               "kcat on the host to list 3 brokers", interval=0.5)
    return p, bootstrap


def create_topic(bootstrap: str, topic: str, partitions: int, rf: int) -> None:
    admin = admin_for(bootstrap)
    admin.create_topics([NewTopic(topic, partitions, rf)])[topic].result(60)

    def online():
        md = admin.list_topics(topic, timeout=10).topics[topic]
        return (md.error is None and len(md.partitions) == partitions
                and all(pm.leader >= 0 and len(pm.isrs) == rf for pm in md.partitions.values()))

    wait_until(online, 60, f"{topic}: every partition led with a full ISR", interval=0.2)


_ADMINS: Dict[str, AdminClient] = {}


def admin_for(bootstrap: str) -> AdminClient:
    # One client per cluster: a new one per poll would log every refused bootstrap connection.
    if bootstrap not in _ADMINS:
        _ADMINS[bootstrap] = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    return _ADMINS[bootstrap]


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    md = admin_for(bootstrap).list_topics(topic, timeout=10)
    return md.topics[topic].partitions[partition].leader


def full_isr(bootstrap: str, topic: str, rf: int) -> bool:
    md = admin_for(bootstrap).list_topics(topic, timeout=10).topics[topic]
    return md.error is None and all(pm.leader >= 0 and len(pm.isrs) == rf for pm in md.partitions.values())


def scrape(p: Project, service: str) -> Scrape:
    """/metrics of one broker, fetched inside its container (the port is not published)."""
    http = ('exec 3<>/dev/tcp/127.0.0.1/9404 && printf "GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n'
            'Connection: close\\r\\n\\r\\n" >&3 && cat <&3')
    raw = _run(["docker", "exec", p.container(service), "bash", "-c", http], timeout=30).stdout
    # text mode has turned the HTTP CRLFs into newlines
    head, _, body = raw.partition("\n\n")
    assert head.startswith("HTTP/1.1 200"), head
    return Scrape(body)


def assert_every_ack_read_once(prod: SeqProducer, bootstrap: str, topic: str, partitions: int) -> int:
    assert not prod.failed, f"{len(prod.failed)} records failed: {list(prod.failed.items())[:3]}"
    assert not prod.double_acks, prod.double_acks[:3]
    _, recs = read_partitions(bootstrap, topic, range(partitions))
    seen: Dict[int, List[tuple]] = {}
    for p, rs in recs.items():
        for off, _key, value in rs:
            seen.setdefault(int(value.decode()), []).append((p, off))
    for n, at in prod.acked.items():
        assert seen.get(n) == [at], f"record {n} acknowledged at {at}, read at {seen.get(n)}"
    return len(prod.acked)


def test_compose_cluster_serves_host_and_container_clients(project_factory):
    p, bootstrap = three_brokers(project_factory)
    md = kcat_list(bootstrap)
    assert sorted(b["id"] for b in md["brokers"]) == [1, 2, 3]
    assert all(b["name"].startswith("localhost:") for b in md["brokers"]), md["brokers"]

    topic = "compose-rf3"
    create_topic(bootstrap, topic, 3, 3)
    values = list(range(300))
    acked, failed = produce_sync(bootstrap, topic, values)
    assert not failed and len(acked) == 300

    # Every record counted once, by its partition's leader.
    brokers = ("kafka1", "kafka2", "kafka3")
    scrapes = {b: scrape(p, b) for b in brokers}
    name = "kafka_server_brokertopicmetrics_messagesin_total"
    assert sum(s.value(name, topic=topic) for s in scrapes.values()) == 300
    assert sum(s.value("kafka_server_brokertopicmetrics_bytesin_total", topic=topic) for s in scrapes.values()) > 0
    assert sum(s.total("kafka_network_requestmetrics_requests_total", request="Produce") for s in scrapes.values()) > 0
    assert sum(s.value("kafka_controller_kafkacontroller_activecontrollercount") for s in scrapes.values()) == 1
    assert all(s.get("kafka_server_replicamanager_underreplicatedpartitions") == 0 for s in scrapes.values())

    # A client in another container on the compose network, through the internal listener.
    out = _run(["docker", "run", "--rm", "--network", p.network, KCAT_IMAGE,
                "kcat", "-b", "kafka2:29092", "-C", "-t", topic, "-o", "beginning", "-e", "-q",
                "-f", "%s\\n"], timeout=120).stdout
    assert sorted(int(v) for v in out.split()) == values
    listed = _run(["docker", "run", "--rm", "--network", p.network, KCAT_IMAGE,
                   "kcat", "-b", "kafka1:29092", "-L", "-J"], timeout=60).stdout
    assert sorted(b["name"] for b in json.loads(listed)["brokers"]) == [
        "kafka1:29092", "kafka2:29092", "kafka3:29092"]

    # The Java client on the host, through the external listener.
    cp, classes = java_client.compile_client()
    try:
        java_client.run(cp, bootstrap, p.tmp / "java-tmp", "produce-consume", replication_factor=3)
    finally:
        shutil.rmtree(classes, ignore_errors=True)

    for service in ("kafka1", "kafka2", "kafka3", "zookeeper"):
        info = p.inspect(service)
        wait_until(lambda: p.inspect(service)["State"]["Health"]["Status"] == "healthy", 90,
                   f"{service} healthy")
        if service != "zookeeper":
            assert info["Config"]["User"] == "appuser"
            status = _run(["docker", "exec", p.container(service), "cat", "/proc/1/status"]).stdout
            uids = re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split()
            assert set(uids) == {"1000"}, f"{service}'s broker runs as uids {uids}"
            assert "gregor" in re.search(r"^Name:\s+(.*)$", status, re.M).group(1)


def test_kill_and_network_cut_of_a_leader_under_acks_all(project_factory):
    p, bootstrap = three_brokers(project_factory)
    topic = "compose-faults"
    create_topic(bootstrap, topic, 3, 3)
    prod = SeqProducer(bootstrap, topic)
    prod.start()
    try:
        wait_until(lambda: prod.acked_count() >= 200, 60, "first acknowledgements", interval=0.1)

        victim = leader_of(bootstrap, topic, 0)
        p.run("kill", "-s", "KILL", f"kafka{victim}")
        wait_until(lambda: leader_of(bootstrap, topic, 0) not in (victim, -1), 90,
                   f"partition 0 to move off killed broker {victim}", interval=0.5)
        before = prod.acked_count()
        wait_until(lambda: prod.acked_count() >= before + 200, 90, "acks after the failover", interval=0.1)
        p.run("start", f"kafka{victim}")
        wait_until(lambda: full_isr(bootstrap, topic, 3), 120, f"kafka{victim} back in every ISR", interval=0.5)

        victim = leader_of(bootstrap, topic, 1)
        p_cid = p.container(f"kafka{victim}")
        _run(["docker", "network", "disconnect", p.network, p_cid])
        try:
            wait_until(lambda: leader_of(bootstrap, topic, 1) not in (victim, -1), 120,
                       f"partition 1 to move off cut-off broker {victim}", interval=0.5)
            before = prod.acked_count()
            wait_until(lambda: prod.acked_count() >= before + 200, 90, "acks during the cut", interval=0.1)
        finally:
            # Reconnect under the same name, so the other brokers resolve it again.
            _run(["docker", "network", "connect", "--alias", f"kafka{victim}", p.network, p_cid])
        wait_until(lambda: full_isr(bootstrap, topic, 3), 180, f"kafka{victim} back in every ISR", interval=0.5)
        before = prod.acked_count()
        wait_until(lambda: prod.acked_count() >= before + 100, 60, "acks after the cut healed", interval=0.1)
    finally:
        prod.stop()
    assert prod.unflushed == 0
    assert assert_every_ack_read_once(prod, bootstrap, topic, 3) >= 700


def test_stop_is_clean_and_down_up_keeps_data(project_factory):
    p, bootstrap = three_brokers(project_factory)
    topic = "compose-volumes"
    create_topic(bootstrap, topic, 2, 3)
    acked, failed = produce_sync(bootstrap, topic, range(500))
    assert not failed

    # compose's default stop timeout is 10 s; a broker that needs longer is SIGKILLed (137).
    started = time.monotonic()
    p.run("stop", timeout=120)
    took = time.monotonic() - started
    for service in ("kafka1", "kafka2", "kafka3"):
        state = p.inspect(service)["State"]
        assert state["ExitCode"] == 0, f"{service} exited {state['ExitCode']} after {took:.1f}s"
    logs = p.run("logs", "--no-color", "kafka1").stdout
    assert "shutting down" in logs, logs[-2000:]

    p.run("down", timeout=120)
    p.run("up", "-d", timeout=300)
    wait_until(lambda: len(kcat_list(bootstrap).get("brokers", [])) == 3, 120, "3 brokers again", interval=0.5)
    wait_until(lambda: full_isr(bootstrap, topic, 3), 120, "every ISR full again", interval=0.5)
    _, recs = read_partitions(bootstrap, topic, range(2))
    back = {int(v.decode()): (part, off) for part, rs in recs.items() for off, _k, v in rs}
    assert back == acked


def confluent_snippet() -> str:
    text = (REPO / "docs" / "docker.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        if SNIPPET_MARK in block:
            return block
    raise AssertionError(f"docs/docker.md has no ```yaml block containing {SNIPPET_MARK!r}")


def test_confluent_compose_snippet_with_only_the_image_changed(project_factory, tmp_path):
    snippet = confluent_snippet()
    assert "image: gregor:latest" in snippet and "image: gregor-zookeeper:latest" in snippet
    # The snippet publishes the host's 9092; here a free port stands in for it.
    port = free_port()
    file = tmp_path / "confluent-compose.yml"
    file.write_text(snippet.replace('"9092:9092"', f'"{port}:{port}"').replace("localhost:9092", f"localhost:{port}"))
    p = project_factory(file=file)
    p.run("up", "-d", timeout=300)
    bootstrap = f"localhost:{port}"
    wait_until(lambda: len(kcat_list(bootstrap).get("brokers", [])) == 1, 120, "the broker listed", interval=0.5)

    topic = "snippet-topic"
    acked, failed = produce_sync(bootstrap, topic, range(100))
    assert not failed and len(acked) == 100
    group = "snippet-group"
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "log_level": 2})
    try:
        cons.subscribe([topic])
        got = []
        wait_until(lambda: (got.extend(m for m in [cons.poll(0.5)] if m is not None and not m.error())
                            or len(got) >= 100), 90, "the group to read 100 records", interval=0)
        cons.commit(asynchronous=False)
        committed = cons.committed([TopicPartition(topic, 0)], timeout=20)
        assert committed[0].offset == 100
    finally:
        cons.close()
