"""Client telemetry (KIP-714) on a ZooKeeper cluster: client-metrics subscriptions managed as
CLIENT_METRICS config resources and kept in ZooKeeper, and a real producer (confluent-kafka,
librdkafka 2.16) that fetches its subscription and pushes its metrics, read back from
/metrics.

confluent-kafka's Admin API has no CLIENT_METRICS resource type, so subscriptions are managed
with raw frames (kproto), as Kafka's `kafka-client-metrics` tool sends them:
IncrementalAlterConfigs, DescribeConfigs and ListConfigResources (ListClientMetricsResources
at v0). Every wait polls for its condition.
"""
from __future__ import annotations

import re
import sys
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

ck = pytest.importorskip("confluent_kafka")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
import kproto  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from common import uniq, wait_until  # noqa: E402
from gregor_fixtures import _failed, _register  # noqa: E402
from gregor_harness import free_port  # noqa: E402

CLIENT_METRICS = 16
GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY, LIST_CONFIG_RESOURCES = 71, 72, 74
OP_SET, OP_DELETE = 0, 1
INVALID_CONFIG, INVALID_REQUEST = 40, 42
SOURCE_CLIENT_METRICS, SOURCE_DEFAULT = 7, 5
ENABLE = {"gregor.client.telemetry.enable": "true"}


def conn(b) -> kproto.Conn:
    host, port = b.bootstrap.rsplit(":", 1)
    return kproto.Conn(host, int(port), timeout=15)


def alter(b, name: str, ops: List[Tuple[str, int, Optional[str]]], validate_only: bool = False) -> dict:
    with conn(b) as c:
        body = kproto.incremental_alter_configs_request(1, [(CLIENT_METRICS, name, ops)], validate_only)
        r = c.call(kproto.INCREMENTAL_ALTER_CONFIGS, 1, body)
        return kproto.decode_incremental_alter_configs(r, 1)["responses"][0]


def describe(b, name: str) -> Dict[str, dict]:
    with conn(b) as c:
        r = c.call(kproto.DESCRIBE_CONFIGS, 4, kproto.describe_configs_request(4, [(CLIENT_METRICS, name, None)]))
        res = kproto.decode_describe_configs(r, 4)["results"][0]
    assert res["error_code"] == 0, res
    return {e["name"]: e for e in res["configs"]}


def list_resources(b, version: int, types: Optional[List[int]] = None) -> Tuple[int, List[Tuple[str, int]]]:
    """ListConfigResources (v0: ListClientMetricsResources): (error, [(name, type)])."""
    w = kproto.W(True)
    if version >= 1:
        w.array(types or [], lambda w, t: w.i8(t))
    r = flexible_call(b, LIST_CONFIG_RESOURCES, w.tags().done(), version)
    r.i32()  # throttle

    def res(rr):
        name = rr.string()
        rtype = rr.i8() if version >= 1 else CLIENT_METRICS
        rr.tags()
        return (name, rtype)

    error = r.i16()
    items = r.array(res) or []
    r.tags()
    r.end()
    return error, items


def flexible_call(b, api_key: int, body: bytes, version: int = 0) -> kproto.R:
    """A call to an API kproto does not know: flexible from v0, request and response headers."""
    with conn(b) as c:
        r = c.call(api_key, version, body, flexible=True)
    r.flex = True
    r.tags()  # the response header's tagged fields
    return r


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')


def scrape(port: int) -> List[Tuple[str, str, float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m, f"not an exposition line: {line!r}"
            out.append((m.group(1), m.group(2) or "", float(m.group(3))))
    return out


@pytest.fixture
def cluster(request, zookeeper):
    metrics_ports: Dict[int, int] = {}

    def per_broker(broker_id, _port):
        metrics_ports[broker_id] = free_port()
        return {"metrics.port": str(metrics_ports[broker_id]), "metrics.host": "127.0.0.1"}

    c = Cluster(zookeeper, 2, overrides=ENABLE, broker_overrides=per_broker,
                on_new_broker=lambda b: _register(request, b))
    c.metrics_ports = metrics_ports
    c.start()
    yield c
    c.cleanup(keep=_failed(request))


def test_telemetry_apis_are_advertised_only_when_enabled(broker_factory):
    off = broker_factory()
    with conn(off) as c:
        keys = c.api_versions(3)["api_keys"]
    # As Kafka without a receiver plugin: subscriptions can be managed, not fetched or pushed.
    assert GET_TELEMETRY_SUBSCRIPTIONS not in keys and PUSH_TELEMETRY not in keys, keys
    assert keys[LIST_CONFIG_RESOURCES] == (0, 1)

    on = broker_factory(ENABLE)
    with conn(on) as c:
        keys = c.api_versions(3)["api_keys"]
    assert keys[GET_TELEMETRY_SUBSCRIPTIONS] == (0, 0) and keys[PUSH_TELEMETRY] == (0, 0), keys

    # A client that asks without a subscription gets a new instance id and Kafka's defaults.
    r = flexible_call(on, GET_TELEMETRY_SUBSCRIPTIONS, kproto.W(True).uuid().tags().done())
    throttle, error, instance_id, _sub_id = r.i32(), r.i16(), r.uuid(), r.i32()
    compression = r.array(lambda rr: rr.i8())
    interval, max_bytes = r.i32(), r.i32()
    assert (error, throttle) == (0, 0)
    assert instance_id != b"\x00" * 16
    assert compression == [4, 3, 1, 2]
    assert (interval, max_bytes) == (300_000, 1 << 20)
    # A push from an instance id that cannot be one is INVALID_REQUEST, as Kafka answers.
    push = kproto.W(True).uuid().i32(0).bool(False).i8(0).bytes_(b"").tags().done()
    r = flexible_call(on, PUSH_TELEMETRY, push)
    assert (r.i32(), r.i16()) == (0, INVALID_REQUEST)


def test_subscriptions_live_in_zookeeper_and_a_producer_pushes_its_metrics(cluster):
    c = cluster
    b1, b2 = c.brokers[1], c.brokers[2]
    name, client_id = uniq("sub"), uniq("telemetry")

    # Kafka's refusals, and nothing reaches ZooKeeper.
    assert alter(b1, name, [("interval.ms", OP_SET, "50")])["error_code"] == INVALID_REQUEST
    assert alter(b1, name, [("bogus", OP_SET, "1")])["error_code"] == INVALID_REQUEST
    assert alter(b1, name, [("match", OP_SET, "nobody=x")])["error_code"] == INVALID_CONFIG
    assert alter(b1, name, [("match", OP_SET, "client_id=(")])["error_code"] == INVALID_CONFIG
    assert alter(b1, name, [("interval.ms", OP_SET, "1000")], validate_only=True)["error_code"] == 0
    assert not c.exists(f"/config/client-metrics/{name}")

    ops = [("metrics", OP_SET, "*"), ("interval.ms", OP_SET, "1000"),
           ("match", OP_SET, f"client_id={client_id}")]
    res = alter(b1, name, ops)
    assert res["error_code"] == 0, res
    assert c.get_json(f"/config/client-metrics/{name}") == {
        "version": 1, "config": {"metrics": "*", "interval.ms": "1000", "match": f"client_id={client_id}"}}
    notes = [c.get_json(f"/config/changes/{n}") for n in c.kz.get_children("/config/changes")]
    assert {"version": 2, "entity_path": f"client-metrics/{name}"} in notes, notes

    # The other broker learns of it from the announcement.
    wait_until(lambda: (name, CLIENT_METRICS) in list_resources(b2, 0)[1], 30, "broker 2 to list the subscription")
    error, v1 = list_resources(b2, 1, [CLIENT_METRICS])
    assert error == 0 and (name, CLIENT_METRICS) in v1
    error, everything = list_resources(b2, 1)
    assert error == 0 and (name, CLIENT_METRICS) in everything and ("1", 4) in everything, everything
    assert list_resources(b2, 1, [99])[0] == 35  # UNSUPPORTED_VERSION for a type it does not know
    configs = describe(b2, name)
    assert configs["interval.ms"]["value"] == "1000"
    assert configs["interval.ms"]["config_source"] == SOURCE_CLIENT_METRICS
    assert configs["match"]["value"] == f"client_id={client_id}"
    unknown = describe(b2, uniq("none"))["interval.ms"]
    assert (unknown["value"], unknown["config_source"]) == ("300000", SOURCE_DEFAULT)

    # A producer (enable.metrics.push is librdkafka's default) fetches it and pushes.
    topic = uniq("t")
    p = ck.Producer({"bootstrap.servers": c.bootstrap(), "client.id": client_id, "enable.metrics.push": True})

    def pushed():
        for i in range(10):
            p.produce(topic, value=b"x%d" % i)
        p.poll(0.2)
        samples = [s for port in c.metrics_ports.values() for s in scrape(port)]
        accepted = sum(v for n, labels, v in samples
                       if n == "gregor_client_telemetry_pushes_total" and labels == 'error="NONE"')
        ours = [n for n, labels, _ in samples if f'client_id="{client_id}"' in labels]
        return accepted >= 1 and ours

    wait_until(pushed, 60, "the producer's pushed metrics on /metrics")
    samples = [s for port in c.metrics_ports.values() for s in scrape(port)]
    ours = {n for n, labels, _ in samples if f'client_id="{client_id}"' in labels}
    assert any(n.startswith("org_apache_kafka_") for n in ours), sorted(ours)
    assert all('client_instance_id="' in labels for n, labels, _ in samples if n in ours)
    p.flush(30)

    # Deleting every config deletes the subscription.
    res = alter(b1, name, [("metrics", OP_DELETE, None), ("interval.ms", OP_DELETE, None),
                           ("match", OP_DELETE, None)])
    assert res["error_code"] == 0, res
    assert not c.exists(f"/config/client-metrics/{name}")
    wait_until(lambda: (name, CLIENT_METRICS) not in list_resources(b2, 0)[1], 30, "broker 2 to drop it")
