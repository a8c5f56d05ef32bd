"""Every served API at its lowest and highest advertised version, by hand-built frames.

Each request must get a well-formed response (body decodes completely, no trailing
bytes) carrying the request's correlation id, and the top-level/per-item error
codes must say success where the request is valid.
"""
import struct
import time
import uuid

import pytest

import kproto as kp
from gregor_harness import wait_until

APIS = sorted(kp.EXPECTED_RANGES)


def advertised(broker, api):
    with kp.Conn(broker.host, broker.port) as c:
        av = c.api_versions(0)
    assert av["error_code"] == 0
    assert api in av["api_keys"], f"{kp.API_NAMES[api]} (key {api}) not advertised; got {sorted(av['api_keys'])}"
    return av["api_keys"][api]


def topic_name(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def new_topic(c, partitions=1, name=None):
    name = name or topic_name()
    res = kp.create_topic(c, name, partitions)
    assert res["error_code"] == 0, f"CreateTopics {name}: error {res['error_code']} {res.get('error_message')}"
    wait_leader(c, name, partitions)
    return name


def wait_leader(c, name, partitions):
    def ok():
        md = kp.metadata(c, [name], version=9)
        t = md["topics"][0]
        return (t["error_code"] == 0 and len(t["partitions"]) == partitions
                and all(p["leader_id"] >= 0 and p["error_code"] == 0 for p in t["partitions"]))
    deadline = time.monotonic() + 30
    while not ok():
        assert time.monotonic() < deadline, f"topic {name} never got leaders for {partitions} partitions"
        time.sleep(0.05)


def sample_records(n=3, prefix=b"r"):
    base = 1_700_000_000_000
    return [kp.Record(value=prefix + b"-v%d" % i, key=prefix + b"-k%d" % i, headers=[("h%d" % i, b"x" * i)],
                      timestamp=base + i * 10) for i in range(n)]


def test_expected_apis_advertised(broker):
    with kp.Conn(broker.host, broker.port) as c:
        av = c.api_versions(0)
    missing = []
    for api, (lo, hi) in kp.EXPECTED_RANGES.items():
        got = av["api_keys"].get(api)
        if got is None or got[0] > lo or got[1] < hi:
            missing.append(f"{kp.API_NAMES[api]}: expected {lo}-{hi}, advertised {got}")
    assert not missing, "; ".join(missing)


def test_advertised_versions_within_codec_knowledge(broker):
    """If the broker advertises a version beyond what these tests can encode, say so."""
    with kp.Conn(broker.host, broker.port) as c:
        av = c.api_versions(0)
    beyond = [f"{kp.API_NAMES[a]} {av['api_keys'][a]} vs {kp.ENCODER_RANGES[a]}" for a in kp.ENCODER_RANGES
              if a in av["api_keys"] and (av["api_keys"][a][0] < kp.ENCODER_RANGES[a][0]
                                           or av["api_keys"][a][1] > kp.ENCODER_RANGES[a][1])]
    assert not beyond, "advertised ranges outside the tested ranges: " + "; ".join(beyond)


@pytest.mark.parametrize("which", ["min", "max"])
@pytest.mark.parametrize("api", APIS, ids=[kp.API_NAMES[a] for a in APIS])
def test_api_at_version(broker, api, which):
    lo, hi = advertised(broker, api)
    v = lo if which == "min" else hi
    elo, ehi = kp.ENCODER_RANGES[api]
    assert elo <= v <= ehi, f"{kp.API_NAMES[api]} v{v} advertised but outside the encoder range {elo}-{ehi}"
    with kp.Conn(broker.host, broker.port) as c:
        CHECKS[api](broker, c, v)


# ---------------------------------------------------------------------------
# per-API checks
# ---------------------------------------------------------------------------

def check_api_versions(broker, c, v):
    av = c.api_versions(v)
    assert av["error_code"] == 0
    for api, (lo, hi) in kp.EXPECTED_RANGES.items():
        assert api in av["api_keys"], f"ApiVersions v{v}: {kp.API_NAMES[api]} missing"
    lo, hi = av["api_keys"][kp.API_VERSIONS]
    assert lo == 0 and hi >= 3


def check_metadata(broker, c, v):
    name = new_topic(c, 2)
    topics = None if v >= 1 else []  # v0: empty = all; v1+: null = all
    r = c.call(kp.METADATA, v, kp.metadata_request(v, topics))
    md = kp.decode_metadata(r, v)
    assert [(b["node_id"], b["host"], b["port"]) for b in md["brokers"]] == [(0, broker.host, broker.port)]
    if v >= 1:
        assert md["controller_id"] == 0
    if v >= 2:
        assert md["cluster_id"], "cluster_id empty"
    by = {t["name"]: t for t in md["topics"]}
    assert name in by, f"created topic missing from Metadata v{v}: {sorted(by)}"
    t = by[name]
    assert t["error_code"] == 0
    assert sorted(p["partition_index"] for p in t["partitions"]) == [0, 1]
    for p in t["partitions"]:
        assert p["error_code"] == 0 and p["leader_id"] == 0
        assert p["replica_nodes"] == [0] and p["isr_nodes"] == [0]
    if v >= 10:
        assert t["topic_id"] != b"\x00" * 16, "topic_id is the zero UUID"
    # an unknown topic by name (no auto-create) => UNKNOWN_TOPIC_OR_PARTITION
    if v >= 4:
        r = c.call(kp.METADATA, v, kp.metadata_request(v, [topic_name("missing")], allow_auto=False))
        md = kp.decode_metadata(r, v)
        assert md["topics"][0]["error_code"] == kp.UNKNOWN_TOPIC_OR_PARTITION


def check_produce(broker, c, v):
    name = new_topic(c)
    for expect_base in (0, 3):
        if v >= 3:
            batch = kp.build_batch(sample_records(3))
        else:  # Produce v0-1 carry message format v0, v2 format v1 (test_old_formats.py has more)
            magic = 1 if v == 2 else 0
            batch = kp.message_set([kp.Message(r.value, r.key, r.timestamp if magic else -1, 0, magic)
                                    for r in sample_records(3)])
        r = c.call(kp.PRODUCE, v, kp.produce_request(v, {name: {0: batch}}, acks=-1))
        resp = kp.decode_produce(r, v)
        [t] = resp["responses"]
        assert t["name"] == name
        [p] = t["partitions"]
        assert p["index"] == 0
        assert p["error_code"] == 0, f"Produce v{v}: error {p['error_code']}"
        assert p["base_offset"] == expect_base
        assert p["log_append_time_ms"] == -1
        if v >= 5:
            assert p["log_start_offset"] == 0
    assert kp.list_offset(c, name, 0, kp.LATEST)["offset"] == 6


def check_fetch(broker, c, v):
    name = new_topic(c)
    recs = sample_records(4)
    assert kp.produce(c, name, 0, kp.build_batch(recs))["error_code"] == 0
    key = kp.topic_id(c, name) if v >= 13 else name
    if v >= 13:
        assert key != b"\x00" * 16, "Fetch v13+ advertised but Metadata returns a zero topic id"
    for start in (0, 2):
        r = c.call(kp.FETCH, v, kp.fetch_request(v, {key: {0: start}}, max_wait_ms=0))
        resp = kp.decode_fetch(r, v)
        if v >= 7:
            assert resp["error_code"] == 0
            assert resp["session_id"] == 0
        [t] = resp["responses"]
        assert t.get("topic", t.get("topic_id")) == key
        [p] = t["partitions"]
        assert p["error_code"] == 0
        assert p["high_watermark"] == 4
        if v < 4:  # message sets, down-converted: format v0 for Fetch v0-1, v1 for v2-3; no headers
            magic = 0 if v <= 1 else 1
            got = [(m.offset, m.magic, m.key, m.value, m.timestamp) for m in kp.decode_message_set(p["records"])]
            want = [(i, magic, x.key, x.value, x.timestamp if magic else -1) for i, x in enumerate(recs)]
            assert got == want[start:], f"Fetch v{v} from {start}: {got}"
            continue
        assert p["last_stable_offset"] == 4
        if v >= 5:
            assert p["log_start_offset"] == 0
        batches = kp.decode_batches(p["records"])
        assert batches and all(b.crc_ok for b in batches), "fetched batch missing or CRC invalid"
        got = [(r.offset, r.key, r.value, r.headers, r.timestamp) for b in batches for r in b.records]
        want = [(i, x.key, x.value, x.headers, x.timestamp) for i, x in enumerate(recs)]
        # the broker returns whole batches: records below `start` may be included
        assert [g for g in got if g[0] >= start] == want[start:]
    # offset beyond the log end => OFFSET_OUT_OF_RANGE
    r = c.call(kp.FETCH, v, kp.fetch_request(v, {key: {0: 100}}, max_wait_ms=0))
    p = kp.decode_fetch(r, v)["responses"][0]["partitions"][0]
    assert p["error_code"] == kp.OFFSET_OUT_OF_RANGE
    if v >= 13:  # unknown topic id
        r = c.call(kp.FETCH, v, kp.fetch_request(v, {b"\x42" * 16: {0: 0}}, max_wait_ms=0))
        resp = kp.decode_fetch(r, v)
        errs = [p["error_code"] for t in resp["responses"] for p in t["partitions"]]
        assert resp["error_code"] == kp.UNKNOWN_TOPIC_ID or errs == [kp.UNKNOWN_TOPIC_ID], resp


def check_list_offsets(broker, c, v):
    name = new_topic(c)
    recs = sample_records(3)
    assert kp.produce(c, name, 0, kp.build_batch(recs))["error_code"] == 0
    if v == 0:
        # v0 lists offsets, newest first: segment starts (dated by file mtime) and the log end
        for ts, most, want in [(kp.EARLIEST, 1, [0]), (kp.LATEST, 1, [3]), (kp.LATEST, 10, [3, 0]),
                               (1, 10, [])]:
            r = c.call(kp.LIST_OFFSETS, v, kp.list_offsets_request(v, {name: {0: ts}}, max_num_offsets=most))
            [p] = kp.decode_list_offsets(r, v)["topics"][0]["partitions"]
            assert (p["error_code"], p["old_style_offsets"]) == (0, want), f"ListOffsets v0 ts={ts} max={most}: {p}"
        r = c.call(kp.LIST_OFFSETS, v, kp.list_offsets_request(v, {name: {7: kp.LATEST}}))
        [p] = kp.decode_list_offsets(r, v)["topics"][0]["partitions"]
        assert (p["error_code"], p["old_style_offsets"]) == (kp.UNKNOWN_TOPIC_OR_PARTITION, []), p
        return
    queries = {kp.EARLIEST: 0, kp.LATEST: 3, recs[1].timestamp: 1, recs[1].timestamp - 5: 1,
               recs[2].timestamp + 1: -1}
    for ts, want in queries.items():
        r = c.call(kp.LIST_OFFSETS, v, kp.list_offsets_request(v, {name: {0: ts}}))
        resp = kp.decode_list_offsets(r, v)
        [t] = resp["topics"]
        [p] = t["partitions"]
        assert p["error_code"] == 0, f"ListOffsets v{v} ts={ts}: error {p['error_code']}"
        assert p["offset"] == want, f"ListOffsets v{v} ts={ts}: offset {p['offset']} != {want}"
        if ts >= 0 and want >= 0:
            assert p["timestamp"] == recs[want].timestamp
    if v >= 7:  # MAX_TIMESTAMP
        r = c.call(kp.LIST_OFFSETS, v, kp.list_offsets_request(v, {name: {0: kp.MAX_TIMESTAMP}}))
        p = kp.decode_list_offsets(r, v)["topics"][0]["partitions"][0]
        assert (p["error_code"], p["offset"], p["timestamp"]) == (0, 2, recs[2].timestamp), \
            f"ListOffsets v{v} MAX_TIMESTAMP (-3): got {p}, want offset 2 / timestamp {recs[2].timestamp}"


def check_create_topics(broker, c, v):
    name = topic_name()
    r = c.call(kp.CREATE_TOPICS, v, kp.create_topics_request(v, [(name, 3, 1)]))
    resp = kp.decode_create_topics(r, v)
    [t] = resp["topics"]
    assert t["name"] == name
    assert t["error_code"] == 0, f"CreateTopics v{v}: {t['error_code']} {t.get('error_message')}"
    if v >= 5:
        assert t["num_partitions"] == 3 and t["replication_factor"] == 1
    if v >= 7:
        assert t["topic_id"] != b"\x00" * 16
    wait_leader(c, name, 3)
    r = c.call(kp.CREATE_TOPICS, v, kp.create_topics_request(v, [(name, 3, 1)]))
    [t] = kp.decode_create_topics(r, v)["topics"]
    assert t["error_code"] == kp.TOPIC_ALREADY_EXISTS


def check_delete_topics(broker, c, v):
    name = new_topic(c)
    r = c.call(kp.DELETE_TOPICS, v, kp.delete_topics_request(v, [name]))
    resp = kp.decode_delete_topics(r, v)
    [t] = resp["responses"]
    assert t["name"] == name
    assert t["error_code"] == 0, f"DeleteTopics v{v}: error {t['error_code']}"
    deadline = time.monotonic() + 30
    while kp.metadata(c, [name])["topics"][0]["error_code"] != kp.UNKNOWN_TOPIC_OR_PARTITION:
        assert time.monotonic() < deadline, "deleted topic still in metadata"
        time.sleep(0.05)
    r = c.call(kp.DELETE_TOPICS, v, kp.delete_topics_request(v, [name]))
    [t] = kp.decode_delete_topics(r, v)["responses"]
    assert t["error_code"] == kp.UNKNOWN_TOPIC_OR_PARTITION
    assert t["name"] == name, f"DeleteTopics v{v} error result for an unknown topic names {t['name']!r}, not {name!r}"


def check_create_partitions(broker, c, v):
    name = new_topic(c, 1)
    r = c.call(kp.CREATE_PARTITIONS, v, kp.create_partitions_request(v, [(name, 3)]))
    resp = kp.decode_create_partitions(r, v)
    [t] = resp["results"]
    assert t["name"] == name and t["error_code"] == 0, f"CreatePartitions v{v}: {t}"
    wait_leader(c, name, 3)


def check_describe_configs(broker, c, v):
    name = new_topic(c)
    r = c.call(kp.DESCRIBE_CONFIGS, v, kp.describe_configs_request(v, [(kp.RESOURCE_TOPIC, name, None)]))
    resp = kp.decode_describe_configs(r, v)
    [res] = resp["results"]
    assert res["error_code"] == 0, f"DescribeConfigs v{v}: {res['error_code']} {res['error_message']}"
    assert res["resource_type"] == kp.RESOURCE_TOPIC and res["resource_name"] == name
    names = {x["name"] for x in res["configs"]}
    assert "retention.ms" in names and "cleanup.policy" in names, sorted(names)
    r = c.call(kp.DESCRIBE_CONFIGS, v, kp.describe_configs_request(v, [(kp.RESOURCE_BROKER, "0", None)]))
    [res] = kp.decode_describe_configs(r, v)["results"]
    assert res["error_code"] == 0 and res["configs"], f"broker configs: {res['error_code']}"


def check_incremental_alter_configs(broker, c, v):
    name = new_topic(c)
    r = c.call(kp.INCREMENTAL_ALTER_CONFIGS, v, kp.incremental_alter_configs_request(
        v, [(kp.RESOURCE_TOPIC, name, [("retention.ms", 0, "123456789")])]))
    resp = kp.decode_incremental_alter_configs(r, v)
    [res] = resp["responses"]
    assert res["error_code"] == 0, f"IncrementalAlterConfigs v{v}: {res}"
    assert res["resource_name"] == name
    r = c.call(kp.DESCRIBE_CONFIGS, 1, kp.describe_configs_request(1, [(kp.RESOURCE_TOPIC, name, ["retention.ms"])]))
    [res] = kp.decode_describe_configs(r, 1)["results"]
    vals = {x["name"]: x["value"] for x in res["configs"]}
    assert vals.get("retention.ms") == "123456789", vals


def check_describe_cluster(broker, c, v):
    r = c.call(kp.DESCRIBE_CLUSTER, v, kp.describe_cluster_request(v))
    resp = kp.decode_describe_cluster(r, v)
    assert resp["error_code"] == 0
    assert resp["cluster_id"]
    assert resp["controller_id"] == 0
    assert [(b["broker_id"], b["host"], b["port"]) for b in resp["brokers"]] == [(0, broker.host, broker.port)]
    md = kp.metadata(c, [], version=9)
    assert md["cluster_id"] == resp["cluster_id"]


def test_describe_cluster_other_endpoint_types_refused_with_kafkas_codes(broker):
    # A broker serves only broker endpoints: asking it for controllers is MISMATCHED_ENDPOINT_TYPE
    # (114), any other type UNSUPPORTED_ENDPOINT_TYPE (115), as Kafka's brokers answer.
    with kp.Conn(broker.host, broker.port) as c:
        for endpoint_type, code in [(2, 114), (3, 115)]:
            r = c.call(kp.DESCRIBE_CLUSTER, 1, kp.describe_cluster_request(1, endpoint_type))
            resp = kp.decode_describe_cluster(r, 1)
            assert resp["error_code"] == code, (endpoint_type, resp)
            assert resp["brokers"] == [], resp


def check_init_producer_id(broker, c, v):
    r = c.call(kp.INIT_PRODUCER_ID, v, kp.init_producer_id_request(v))
    a = kp.decode_init_producer_id(r, v)
    assert a["error_code"] == 0 and a["producer_id"] >= 0 and a["producer_epoch"] >= 0, a
    r = c.call(kp.INIT_PRODUCER_ID, v, kp.init_producer_id_request(v))
    b = kp.decode_init_producer_id(r, v)
    assert b["error_code"] == 0 and b["producer_id"] != a["producer_id"], (a, b)


def check_delete_records(broker, c, v):
    name = new_topic(c)
    assert kp.produce(c, name, 0, kp.build_batch(sample_records(5)))["error_code"] == 0
    assert kp.produce(c, name, 0, kp.build_batch(sample_records(2)))["error_code"] == 0
    r = c.call(kp.DELETE_RECORDS, v, kp.delete_records_request(v, {name: {0: 3}}))
    resp = kp.decode_delete_records(r, v)
    [t] = resp["topics"]
    [p] = t["partitions"]
    assert p["error_code"] == 0 and p["low_watermark"] == 3, p
    assert kp.list_offset(c, name, 0, kp.EARLIEST)["offset"] == 3
    assert kp.list_offset(c, name, 0, kp.LATEST)["offset"] == 7
    p = kp.fetch(c, name, 0, 3)
    assert p["error_code"] == 0
    assert [r.offset for b in kp.decode_batches(p["records"]) for r in b.records if r.offset >= 3][:1] == [3]
    p = kp.fetch(c, name, 0, 1)
    assert p["error_code"] == kp.OFFSET_OUT_OF_RANGE


CHECKS = {
    kp.API_VERSIONS: check_api_versions, kp.METADATA: check_metadata, kp.PRODUCE: check_produce,
    kp.FETCH: check_fetch, kp.LIST_OFFSETS: check_list_offsets, kp.CREATE_TOPICS: check_create_topics,
    kp.DELETE_TOPICS: check_delete_topics, kp.CREATE_PARTITIONS: check_create_partitions,
    kp.DESCRIBE_CONFIGS: check_describe_configs, kp.INCREMENTAL_ALTER_CONFIGS: check_incremental_alter_configs,
    kp.DESCRIBE_CLUSTER: check_describe_cluster, kp.INIT_PRODUCER_ID: check_init_producer_id,
    kp.DELETE_RECORDS: check_delete_records,
}


# ---------------------------------------------------------------------------
# ApiVersions specifics
# ---------------------------------------------------------------------------

def test_api_versions_v0_exact_layout(broker):
    with kp.Conn(broker.host, broker.port) as c:
        corr = c.send(kp.API_VERSIONS, 0, b"")
        payload = kp.recv_frame(c.sock)
    (rc, err, n) = struct.unpack(">ihi", payload[:10])
    assert rc == corr and err == 0
    assert len(payload) == 10 + 6 * n, "v0 body must be error_code + array of (key,min,max) only"


def test_api_versions_v3_flexible_request_header_v0_response(broker):
    with kp.Conn(broker.host, broker.port) as c:
        corr = c.send(kp.API_VERSIONS, 3, kp.api_versions_request(3, "gregor-tests", "1.0.0"))
        payload = kp.recv_frame(c.sock)
    # response header v0: correlation id immediately followed by the body (no tag byte)
    r = kp.R(payload)
    assert r.i32() == corr
    body = kp.decode_api_versions(r, 3)
    assert body["error_code"] == 0
    assert body["api_keys"][kp.API_VERSIONS][1] >= 3


def test_api_versions_unsupported_version_answered_in_v0(broker):
    with kp.Conn(broker.host, broker.port) as c:
        corr = c.send(kp.API_VERSIONS, 99, kp.api_versions_request(3), flexible=True)
        payload = kp.recv_frame(c.sock)
        r = kp.R(payload)
        assert r.i32() == corr
        body = kp.decode_api_versions(r, 0)  # strict v0 layout, no trailing bytes
        assert body["error_code"] == kp.UNSUPPORTED_VERSION
        assert kp.API_VERSIONS in body["api_keys"], "error response must list at least ApiVersions"
        lo, hi = body["api_keys"][kp.API_VERSIONS]
        assert lo == 0 and hi >= 3
        # the connection stays usable
        assert c.api_versions(0)["error_code"] == 0


def test_api_versions_v3_invalid_software_name(broker):
    with kp.Conn(broker.host, broker.port) as c:
        r = c.call(kp.API_VERSIONS, 3, kp.api_versions_request(3, "-bad name!", "1.0"))
        assert kp.decode_api_versions(r, 3)["error_code"] == kp.INVALID_REQUEST


def test_null_client_id_accepted(broker):
    with kp.Conn(broker.host, broker.port) as c:
        corr = c.send(kp.METADATA, 1, kp.metadata_request(1, []), client_id=None)
        md = kp.decode_metadata(c.recv(kp.METADATA, 1, corr), 1)
        assert md["brokers"][0]["port"] == broker.port


def test_acks0_produce_gets_no_response(broker):
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c)
        c.send(kp.PRODUCE, 8, kp.produce_request(8, {name: {0: kp.build_batch(sample_records(2))}}, acks=0))
        # the next response on this connection must belong to the next request
        corr = c.send(kp.API_VERSIONS, 0, b"")
        r = c.recv(kp.API_VERSIONS, 0, corr)
        assert kp.decode_api_versions(r, 0)["error_code"] == 0
        deadline = time.monotonic() + 30
        while kp.list_offset(c, name, 0, kp.LATEST)["offset"] != 2:
            assert time.monotonic() < deadline, "acks=0 records never appeared"
            time.sleep(0.05)


def test_produce_gzip_batch_roundtrip(broker):
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c)
        recs = sample_records(50, b"gz")
        p = kp.produce(c, name, 0, kp.build_batch(recs, codec=kp.CODEC_GZIP))
        assert p["error_code"] == 0
        got = kp.fetch_all(c, name, 0)
        assert [(r.key, r.value, r.headers, r.timestamp) for r in got] == \
               [(r.key, r.value, r.headers, r.timestamp) for r in recs]


def test_duplicate_header_keys_preserved(broker):
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c)
        rec = kp.Record(value=b"v", key=b"k", headers=[("a", b"1"), ("a", b"2"), ("b", None), ("a", b"3")])
        assert kp.produce(c, name, 0, kp.build_batch([rec]))["error_code"] == 0
        [got] = kp.fetch_all(c, name, 0)
        assert got.headers == rec.headers


def test_fetch_returns_stored_batch_bytes(broker):
    """The broker must store the client's batch as-is (only offset/epoch patched): CRC still valid."""
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c)
        batch = kp.build_batch(sample_records(3))
        kp.produce(c, name, 0, batch)
        batch2 = kp.build_batch(sample_records(2, b"second"))
        kp.produce(c, name, 0, batch2)
        p = kp.fetch(c, name, 0, 0)
        bs = kp.decode_batches(p["records"])
        assert [b.base_offset for b in bs] == [0, 3]
        assert bs[0].raw[17:] == batch[17:] and bs[1].raw[17:] == batch2[17:]
        assert all(b.crc_ok for b in bs)


# ---------------------------------------------------------------------------
# behaviour clients depend on (KAFKA-FACTS §7.4)
# ---------------------------------------------------------------------------

def test_metadata_empty_list_semantics(broker):
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c)
        v0 = kp.decode_metadata(c.call(kp.METADATA, 0, kp.metadata_request(0, [])), 0)
        assert name in {t["name"] for t in v0["topics"]}, "Metadata v0 with [] must list all topics"
        v1 = kp.decode_metadata(c.call(kp.METADATA, 1, kp.metadata_request(1, [])), 1)
        assert v1["topics"] == [], "Metadata v1+ with [] must list no topics"
        v1all = kp.decode_metadata(c.call(kp.METADATA, 1, kp.metadata_request(1, None)), 1)
        assert name in {t["name"] for t in v1all["topics"]}, "Metadata v1+ with null must list all topics"


def test_metadata_auto_create(broker):
    with kp.Conn(broker.host, broker.port) as c:
        name = topic_name("auto")
        md = kp.metadata(c, [name], version=9, allow_auto=True)
        assert md["topics"][0]["error_code"] in (0, 5), md["topics"][0]  # 5 = LEADER_NOT_AVAILABLE while creating
        wait_leader(c, name, 1)
        assert kp.produce(c, name, 0, kp.build_batch(sample_records(1)))["error_code"] == 0


def test_produce_to_missing_partition(broker):
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c, 1)
        p = kp.produce(c, name, 5, kp.build_batch(sample_records(1)))
        assert p["error_code"] == kp.UNKNOWN_TOPIC_OR_PARTITION, p
        r = c.call(kp.METADATA, 4, kp.metadata_request(4, [name], allow_auto=False))
        assert kp.decode_metadata(r, 4)["topics"][0]["error_code"] == 0


def test_fetch_returns_oversized_first_batch(broker):
    """KIP-74: at least the first batch is returned even if larger than the byte limits."""
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c)
        big = kp.Record(value=b"B" * 300_000, key=b"big")
        assert kp.produce(c, name, 0, kp.build_batch([big]))["error_code"] == 0
        r = c.call(kp.FETCH, 11, kp.fetch_request(11, {name: {0: 0}}, max_bytes=1000, partition_max_bytes=1000))
        p = kp.decode_fetch(r, 11)["responses"][0]["partitions"][0]
        assert p["error_code"] == 0
        recs = [x for b in kp.decode_batches(p["records"]) for x in b.records]
        assert [x.value for x in recs] == [big.value], "oversized first batch not returned whole"


def test_create_partitions_cannot_shrink(broker):
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c, 3)
        r = c.call(kp.CREATE_PARTITIONS, 3, kp.create_partitions_request(3, [(name, 2)]))
        [t] = kp.decode_create_partitions(r, 3)["results"]
        assert t["error_code"] == 37, t  # INVALID_PARTITIONS


def test_fetch_v17_as_the_first_request_of_a_connection(broker):
    """Kafka 3.9's tools (the replica verification tool among them) send Fetch at 3.9's highest
    version, 17, without asking ApiVersions first: it is served like v16, its follower-only
    directory id (a tagged field) accepted, and the connection stays open for more."""
    with kp.Conn(broker.host, broker.port) as c:
        name = new_topic(c)
        assert kp.produce(c, name, 0, kp.build_batch(sample_records(2)))["error_code"] == 0
        tid = kp.topic_id(c, name)
    with kp.Conn(broker.host, broker.port) as c:
        for _ in range(2):
            resp = kp.decode_fetch(c.call(kp.FETCH, 17, kp.fetch_request(17, {tid: {0: 0}}, max_wait_ms=0)), 17)
            assert resp["error_code"] == 0, resp
            [t] = resp["responses"]
            [p] = t["partitions"]
            assert (p["error_code"], p["high_watermark"]) == (0, 2), p
            assert [r.offset for b in kp.decode_batches(p["records"]) for r in b.records] == [0, 1]


def _features_of(c) -> dict:
    """ApiVersions v3's tagged fields: supported features (tag 0), the finalized-features
    epoch (tag 1, absent when -1) and the finalized features (tag 2); an empty array is
    not written, as Kafka writes tagged fields only when they differ from the default."""
    tags = c.api_versions(3)["tags"]

    def features(tag):
        if tag not in tags:
            return {}
        r = kp.R(tags[tag], flexible=True)

        def feature(rr):
            name, a, b = rr.string(), rr.i16(), rr.i16()
            rr.tags()
            return name, (a, b)
        out = dict(r.array(feature) or [])
        r.end()
        return out
    epoch = struct.unpack(">q", tags[1])[0] if 1 in tags else -1
    return {"supported": features(0), "epoch": epoch, "finalized": features(2)}


# The consumer group protocol (KIP-848) is on by default, as on Kafka 4.x: `group.version` is
# supported up to 1 and finalized at 1, as a 4.x broker lists it.
GROUP_VERSION = {"supported": {"group.version": (0, 1)}, "finalized": {"group.version": (1, 1)}}


def test_api_versions_features_are_those_of_a_zookeeper_mode_kafka(broker):
    """A Kafka 3.9 broker in ZooKeeper mode supports no features (KafkaServer builds
    BrokerFeatures.createEmpty(); metadata.version, kraft.version and the others are KRaft's),
    with the epoch of the enabled /feature znode its controller created (version 0); standalone,
    the embedded tree has the same node. The one feature listed is the new group protocol's."""
    with kp.Conn(broker.host, broker.port) as c:
        assert _features_of(c) == dict(GROUP_VERSION, epoch=0)


def test_feature_znode_is_created_by_the_controller_and_its_version_is_the_epoch(zookeeper, request):
    from cluster_harness import Cluster
    from gregor_fixtures import _failed, _register
    cluster = Cluster(zookeeper, 2, on_new_broker=lambda b: _register(request, b))
    try:
        cluster.start()
        wait_until(lambda: cluster.exists("/feature"), 30, "/feature to be created")
        assert cluster.get_json("/feature") == {"features": {}, "version": 2, "status": 1}
        conns = [kp.Conn(b.host, b.port) for b in cluster.brokers.values()]
        try:
            # The controller and the other broker, which learns of the node from its watch.
            for c in conns:
                wait_until(lambda: _features_of(c)["epoch"] == 0, 30, "the epoch of the new /feature")
            # Rewritten (by an operator, or a controller upgrading its JSON): every broker
            # follows the znode's version, as Kafka's FinalizedFeatureChangeListener does.
            cluster.kz.set("/feature", b'{"features":{},"version":2,"status":1}')
            for c in conns:
                wait_until(lambda: _features_of(c)["epoch"] == 1, 30, "the epoch to follow /feature")
                assert _features_of(c) == dict(GROUP_VERSION, epoch=1)
        finally:
            for c in conns:
                c.close()
    finally:
        cluster.cleanup(keep=_failed(request))
