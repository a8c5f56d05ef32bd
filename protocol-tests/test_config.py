"""Broker configuration sources: server.properties / TOML file, KAFKA_* env, --override."""
import uuid

import kproto as kp
from test_apis import wait_leader


def auto_create_partitions(broker):
    with kp.Conn(broker.host, broker.port) as c:
        name = f"cfg-{uuid.uuid4().hex[:8]}"
        kp.metadata(c, [name], version=9, allow_auto=True)
        md = {}

        def created():
            t = kp.metadata(c, [name], version=9)["topics"][0]
            md["n"] = len(t["partitions"])
            return t["error_code"] == 0 and t["partitions"]
        from gregor_harness import wait_until
        wait_until(created, 30, f"auto-created topic {name}")
        wait_leader(c, name, md["n"])
        return md["n"]


def test_server_properties_file(broker_factory, tmp_path):
    f = tmp_path / "server.properties"
    f.write_text("# comment\nnum.partitions=2\nauto.create.topics.enable=true\n")
    b = broker_factory(config_file=f)
    assert auto_create_partitions(b) == 2


def test_toml_file(broker_factory, tmp_path):
    f = tmp_path / "gregor.toml"
    f.write_text('"num.partitions" = 5\n')
    b = broker_factory(config_file=f)
    assert auto_create_partitions(b) == 5


def test_env_var(broker_factory):
    b = broker_factory(env={"KAFKA_NUM_PARTITIONS": "4"})
    assert auto_create_partitions(b) == 4


def test_override_flag(broker_factory):
    b = broker_factory({"num.partitions": "3"})
    assert auto_create_partitions(b) == 3


def test_auto_create_disabled(broker_factory):
    b = broker_factory({"auto.create.topics.enable": "false"})
    with kp.Conn(b.host, b.port) as c:
        name = f"noauto-{uuid.uuid4().hex[:8]}"
        md = kp.metadata(c, [name], version=9, allow_auto=True)
        assert md["topics"][0]["error_code"] == kp.UNKNOWN_TOPIC_OR_PARTITION
        p = kp.produce(c, name, 0, kp.build_batch([kp.Record(b"x")]))
        assert p["error_code"] == kp.UNKNOWN_TOPIC_OR_PARTITION


# -- the shipped example files, end to end --------------------------------------------------

import pytest  # noqa: E402
from pathlib import Path  # noqa: E402

import gregor_harness  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BROKER_RESOURCE = 4
STATIC_BROKER_CONFIG = 4


def broker_config(b, names):
    with kp.Conn(b.host, b.port) as c:
        r = c.call(kp.DESCRIBE_CONFIGS, 4, kp.describe_configs_request(4, [(BROKER_RESOURCE, str(b.broker_id), names)]))
        res = kp.decode_describe_configs(r, 4)["results"][0]
    assert res["error_code"] == 0, res
    return {e["name"]: (e["value"], e["config_source"]) for e in res["configs"]}


@pytest.mark.parametrize("name", ["server.properties", "gregor.toml"])
def test_shipped_config_file_loads(broker_factory, name):
    """config/<name> as shipped (the harness overrides only listeners, log.dirs and broker.id):
    the broker starts and serves the file's values, e.g. offsets.topic.replication.factor=1
    (Kafka's default is 3) as a static broker config."""
    b = broker_factory(config_file=REPO / "config" / name)
    got = broker_config(b, ["offsets.topic.replication.factor", "num.partitions"])
    assert got["offsets.topic.replication.factor"] == ("1", STATIC_BROKER_CONFIG), got
    assert got["num.partitions"][0] == "1", got
    assert auto_create_partitions(b) == 1


def test_server_properties_value_reaches_the_broker(broker_factory):
    b = broker_factory(config_file=REPO / "config" / "server.properties")
    assert broker_config(b, ["group.initial.rebalance.delay.ms"])["group.initial.rebalance.delay.ms"] == \
        ("0", STATIC_BROKER_CONFIG)  # Kafka's default is 3000


@pytest.mark.parametrize("how,key,value", [
    ("override", "num.partitions", "lots"),
    ("override", "auto.create.topics.enable", "maybe"),
    ("override", "log.retention.hours", "1.5x"),
    ("override", "transaction.partition.verification.enable", "sometimes"),
    # The I/O pool needs a thread at least.
    ("override", "num.io.threads", "0"),
    ("properties", "num.io.threads", "-2"),
    ("properties", "num.partitions", "lots"),
    ("toml", "num.partitions", '"many"'),
])
def test_bad_config_value_exits_naming_the_key(broker_factory, tmp_path, how, key, value):
    """A bad value ends the binary at startup with a non-zero exit and a message naming the key
    (not a panic: the process guard would fail the test on one)."""
    kw = {}
    if how == "override":
        kw["overrides"] = {key: value}
    elif how == "properties":
        f = tmp_path / "server.properties"
        f.write_text(f"{key}={value}\n")
        kw["config_file"] = f
    else:
        f = tmp_path / "gregor.toml"
        f.write_text(f'"{key}" = {value}\n')
        kw["config_file"] = f
    with pytest.raises(gregor_harness.BrokerStartError) as e:
        broker_factory(**kw)
    msg = str(e.value)
    assert "exited with code" in msg and "exited with code 0" not in msg, msg
    assert key in msg.split("during startup", 1)[-1], f"the error does not name {key}:\n{msg}"


# -- security settings gregor cannot honour yet are refused, not served as PLAINTEXT ----------

import socket  # noqa: E402


def refused_at_start(broker_factory, tmp_path, overrides):
    """Starts the binary with `overrides` while this test holds the listener port, and returns
    the startup error. A broker that tried to bind would fail with "cannot listen" instead of
    the refusal, and one that touched log.dirs would have created it."""
    port = gregor_harness.free_port()
    data = tmp_path / "never-created"
    cfg = {k: v.format(port=port) for k, v in overrides.items()}
    cfg["log.dirs"] = str(data)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        with pytest.raises(gregor_harness.BrokerStartError) as e:
            broker_factory(cfg, port=port)
    msg = str(e.value)
    assert "exited with code" in msg and "exited with code 0" not in msg, msg
    assert "cannot listen" not in msg, f"the broker tried to bind before refusing:\n{msg}"
    assert not data.exists(), f"the broker created {data} before refusing"
    return msg.split("during startup", 1)[-1], port


def test_secured_listener_is_refused_at_start(broker_factory, tmp_path):
    out, port = refused_at_start(broker_factory, tmp_path, {
        "listeners": "SASL_SSL://127.0.0.1:{port}",
        "advertised.listeners": "SASL_SSL://127.0.0.1:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
        "ssl.keystore.location": "/nonexistent/keystore.jks",
        "sasl.enabled.mechanisms": "PLAIN",
    })
    # SASL_SSL is served now; a keystore it cannot read (JKS) still stops it before any bind.
    assert "ssl.keystore.location: /nonexistent/keystore.jks: only PEM keystores are supported" in out, out


def test_an_authorizer_other_than_kafkas_acl_authorizer_is_refused_at_start(broker_factory, tmp_path):
    # Kafka's ZooKeeper ACL authorizer is served (compat/test_acls.py); a class gregor cannot
    # load would leave every API unchecked, so it stops the broker.
    out, _ = refused_at_start(broker_factory, tmp_path, {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
    })
    assert ("authorizer.class.name: org.apache.kafka.metadata.authorizer.StandardAuthorizer cannot be loaded by "
            "gregor") in out, out


def test_custom_plaintext_listener_names_are_served(broker_factory):
    """The docker-compose shape: INTERNAL and EXTERNAL, both mapped to PLAINTEXT. Each listener
    answers, and Metadata advertises the listener the client came in on."""
    internal, external = gregor_harness.free_port(), gregor_harness.free_port()
    listeners = f"INTERNAL://127.0.0.1:{internal},EXTERNAL://127.0.0.1:{external}"
    b = broker_factory({
        "listeners": listeners,
        "advertised.listeners": listeners,
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
    }, port=internal)
    for port in (internal, external):
        assert kp.API_VERSIONS in gregor_harness.api_versions_probe(b.host, port)
        with kp.Conn(b.host, port) as c:
            assert [br["port"] for br in kp.metadata(c, [])["brokers"]] == [port]


def test_secrets_are_described_as_sensitive(broker_factory):
    """A secret left in server.properties (accepted while only PLAINTEXT listeners exist) is
    never returned in clear: DescribeConfigs gives a null value and is_sensitive, as Kafka."""
    b = broker_factory({
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required password="s3cret";',
        "ssl.keystore.password": "s3cret",
        "num.partitions": "3",
    })
    with kp.Conn(b.host, b.port) as c:
        body = kp.describe_configs_request(4, [(4, str(b.broker_id), None)])
        r = kp.decode_describe_configs(c.call(kp.DESCRIBE_CONFIGS, 4, body), 4)
    configs = {x["name"]: x for x in r["results"][0]["configs"]}
    for key in ("sasl.jaas.config", "ssl.keystore.password"):
        assert configs[key]["value"] is None and configs[key]["is_sensitive"], configs[key]
    assert configs["num.partitions"]["value"] == "3" and not configs["num.partitions"]["is_sensitive"]
    assert not any("s3cret" in (x["value"] or "") for x in configs.values())
