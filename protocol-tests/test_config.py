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
