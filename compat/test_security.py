"""TLS and SASL listeners with real clients (kcat, confluent-kafka, the Java client) and raw
frames, certificates made by openssl (security_certs.py).

One broker serves five listeners at once: PLAINTEXT (the harness's), SSL (client certificate
requested), MTLS (SSL, certificate required, inline PEM keystore with an encrypted key, a
principal mapping rule), SASL_SSL and SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
The negative matrix asserts, for each cell, Kafka's refusal and that nothing was written.
"""
from __future__ import annotations

import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "protocol-tests"))
import kproto  # noqa: E402

from common import uniq  # noqa: E402
from gregor_harness import free_port, gregor_bin, wait_until  # noqa: E402
from security_certs import Certs  # noqa: E402

SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA = 17, 36, 3
PLAIN_USERS = {"admin": "admin-secret", "alice": "alice-secret"}
JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" "
        "password=\"admin-secret\" " + " ".join(f'user_{u}="{p}"' for u, p in PLAIN_USERS.items()) + ";")
DELAY_MS = 300


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("certs"))


class Secured:
    """The broker and the port of each of its listeners."""

    def __init__(self, broker, ports, certs):
        self.broker, self.ports, self.certs = broker, ports, certs

    def addr(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def log(self) -> str:
        return self.broker.stderr_tail(100000)


def secured_overrides(ports, certs, extra=None):
    c = certs
    o = {
        "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "advertised.listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_SSL:SASL_SSL,"
                                          "SASL_PLAINTEXT:SASL_PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": c.path("broker-keystore.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": c.path("ca.pem"),
        "ssl.client.auth": "requested",
        # MTLS: inline keystore, encrypted PKCS#8 key, client certificates required and mapped.
        "listener.name.mtls.ssl.keystore.location": "",
        "listener.name.mtls.ssl.keystore.certificate.chain": c.text("broker.pem"),
        "listener.name.mtls.ssl.keystore.key": c.text("broker-enc.key"),
        "listener.name.mtls.ssl.key.password": "keypass",
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.principal.mapping.rules": "RULE:^CN=([^,]*),.*$/$1/L,DEFAULT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "connection.failed.authentication.delay.ms": str(DELAY_MS),
        "offsets.topic.replication.factor": "1",
    }
    o.update(extra or {})
    return o


def start_secured(broker_factory, certs, extra=None) -> Secured:
    ports = {n: free_port() for n in ["PLAINTEXT", "SSL", "MTLS", "SASL_SSL", "SASL_PLAINTEXT"]}
    b = broker_factory(overrides=secured_overrides(ports, certs, extra), port=ports["PLAINTEXT"])
    return Secured(b, ports, certs)


@pytest.fixture
def secured(broker_factory, certs) -> Secured:
    s = start_secured(broker_factory, certs)
    add_scram_user(s, "bob", "bob-secret", ScramMechanism.SCRAM_SHA_512)
    add_scram_user(s, "carol", "carol-secret", ScramMechanism.SCRAM_SHA_256)
    return s


def add_scram_user(s: Secured, user, password, mechanism):
    a = AdminClient({"bootstrap.servers": s.addr("PLAINTEXT")})
    up = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 4096), password.encode())
    for f in a.alter_user_scram_credentials([up]).values():
        assert f.result(timeout=30) is None


def client_conf(s: Secured, how: str, user=None, password=None, cert=None) -> dict:
    """confluent-kafka settings for one way in: SSL, MTLS, SASL_SSL/<mech>, SASL_PLAINTEXT/<mech>."""
    c = s.certs
    listener, _, mech = how.partition("/")
    conf = {"bootstrap.servers": s.addr(listener), "security.protocol": "SSL" if listener == "MTLS" else listener}
    if listener in ("SSL", "MTLS", "SASL_SSL"):
        conf["ssl.ca.location"] = c.path("ca.pem")
    if cert:
        conf["ssl.certificate.location"] = c.path(f"{cert}.pem")
        conf["ssl.key.location"] = c.path(f"{cert}.key")
    if mech:
        conf.update({"sasl.mechanisms": mech, "sasl.username": user, "sasl.password": password})
    return conf


def end_offset(s: Secured, topic: str) -> int:
    """The topic's end offset as the PLAINTEXT listener sees it; 0 when it does not exist."""
    c = Consumer({"bootstrap.servers": s.addr("PLAINTEXT"), "group.id": uniq("probe")})
    try:
        md = c.list_topics(timeout=10)
        if topic not in md.topics or md.topics[topic].error is not None:
            return 0
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        c.close()


def produce_consume(conf: dict, topic: str, n: int = 20):
    p = Producer({**conf, "acks": "all"})
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert p.flush(30) == 0
    c = Consumer({**conf, "group.id": uniq("g"), "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got == [b"v%d" % i for i in range(n)]


# --------------------------------------------------------------------- real clients, each protocol

@pytest.mark.parametrize("how,user,password,cert", [
    ("SSL", None, None, None),
    ("MTLS", None, None, "alice"),
    ("SASL_SSL/SCRAM-SHA-512", "bob", "bob-secret", None),
    ("SASL_SSL/PLAIN", "alice", "alice-secret", None),
    ("SASL_PLAINTEXT/SCRAM-SHA-256", "carol", "carol-secret", None),
    ("SASL_PLAINTEXT/PLAIN", "admin", "admin-secret", None),
])
def test_confluent_produces_and_consumes(secured, how, user, password, cert):
    topic = uniq("sec")
    produce_consume(client_conf(secured, how, user, password, cert), topic)
    assert end_offset(secured, topic) == 20


def kcat(args, timeout=30, input_=None):
    return subprocess.run(["kcat", *args], capture_output=True, timeout=timeout, input=input_)


def kcat_opts(s: Secured, how, user=None, password=None, cert=None):
    out = []
    for k, v in client_conf(s, how, user, password, cert).items():
        out += ["-b", v] if k == "bootstrap.servers" else ["-X", f"{k}={v}"]
    return out


@pytest.mark.parametrize("how,user,password", [
    ("SSL", None, None),
    ("SASL_SSL/SCRAM-SHA-512", "bob", "bob-secret"),
    ("SASL_SSL/PLAIN", "alice", "alice-secret"),
    ("SASL_PLAINTEXT/SCRAM-SHA-512", "bob", "bob-secret"),
])
def test_kcat_round_trip_and_metadata_names_the_listener_used(secured, how, user, password):
    topic = uniq("kc")
    opts = kcat_opts(secured, how, user, password)
    p = kcat([*opts, "-P", "-t", topic], input_=b"one\ntwo\n")
    assert p.returncode == 0, p.stderr
    c = kcat([*opts, "-C", "-t", topic, "-c", "2", "-e", "-o", "beginning"])
    assert c.returncode == 0 and c.stdout.split() == [b"one", b"two"], c.stderr
    md = kcat([*opts, "-L", "-J"])
    assert md.returncode == 0, md.stderr
    brokers = json.loads(md.stdout)["brokers"]
    listener = how.split("/")[0]
    assert [b["name"] for b in brokers] == [f"127.0.0.1:{secured.ports[listener]}"]


def test_mutual_tls_principal_comes_from_the_mapped_subject(secured):
    produce_consume(client_conf(secured, "MTLS", cert="alice"), uniq("mtls"), n=1)
    produce_consume(client_conf(secured, "SSL", cert="alice"), uniq("mtls"), n=1)
    log = secured.log()
    # MTLS maps CN=alice,... to "alice"; SSL keeps the RFC 2253 subject (DEFAULT).
    assert "listener=MTLS}: gregor::network: authenticated by client certificate principal=User:alice" in log
    assert "authenticated by client certificate principal=User:CN=alice,OU=eng,O=Example,C=US" in log


def test_java_client_over_sasl_ssl(secured, tmp_path):
    if os.environ.get("GREGOR_SKIP_JAVA") == "1":
        pytest.skip("GREGOR_SKIP_JAVA=1")
    import java_client
    cp, out = java_client.compile_client()
    props = tmp_path / "client.properties"
    props.write_text("\n".join([
        "security.protocol=SASL_SSL",
        "sasl.mechanism=SCRAM-SHA-512",
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="bob" password="bob-secret";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={secured.certs.path('ca.pem')}",
    ]) + "\n")
    java_client.run(cp, secured.addr("SASL_SSL"), tmp_path / "java", "produce-consume", client_config=props)
    assert "principal=User:bob mechanism=SCRAM-SHA-512" in secured.log()


# --------------------------------------------------------------------- negative matrix

def refused_produce(conf: dict, topic: str) -> KafkaError:
    """Produces one record that must not be written; returns the error the client reports."""
    errors = []
    p = Producer({**conf, "message.timeout.ms": 5000, "error_cb": errors.append, "retries": 0})
    delivered = []
    p.produce(topic, b"must-not-be-written", callback=lambda err, msg: delivered.append(err))
    p.flush(15)
    assert delivered and delivered[0] is not None, "a refused client's record was delivered"
    return errors


AUTH_FAILED = "Authentication failed during authentication due to invalid credentials with SASL mechanism"


@pytest.mark.parametrize("how,user,password", [
    ("SASL_SSL/PLAIN", "alice", "wrong"),                 # wrong password, PLAIN
    ("SASL_SSL/PLAIN", "mallory", "alice-secret"),        # unknown user, PLAIN
    ("SASL_SSL/SCRAM-SHA-512", "bob", "wrong"),           # wrong password, SCRAM
    ("SASL_SSL/SCRAM-SHA-512", "mallory", "bob-secret"),  # unknown user, SCRAM
    ("SASL_PLAINTEXT/SCRAM-SHA-256", "bob", "bob-secret"),  # wrong mechanism: bob has SCRAM-SHA-512 only
])
def test_bad_credentials_are_refused_alike_and_nothing_is_written(secured, how, user, password):
    topic = uniq("neg")
    errors = refused_produce(client_conf(secured, how, user, password), topic)
    texts = [e.str() for e in errors]
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), texts
    mech = how.split("/")[1]
    # The same words whatever was wrong: nothing tells a wrong password from an unknown user.
    assert any(f"{AUTH_FAILED} {mech}" in t for t in texts), texts
    assert end_offset(secured, topic) == 0
    assert "authentication failed" in secured.log()


@pytest.mark.parametrize("cert", ["stranger", "expired", None])
def test_untrusted_expired_or_missing_client_certificates_are_refused(secured, cert):
    topic = uniq("neg")
    errors = refused_produce(client_conf(secured, "MTLS", cert=cert), topic)
    assert any(e.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
               for e in errors), [e.str() for e in errors]
    assert end_offset(secured, topic) == 0
    assert re.search(r"listener=MTLS}: gregor::network: TLS handshake failed", secured.log())


def test_plaintext_client_on_tls_port_is_closed(secured):
    topic = uniq("neg")
    conf = {"bootstrap.servers": secured.addr("SSL"), "security.protocol": "PLAINTEXT"}
    errors = refused_produce(conf, topic)
    assert errors, "no error reported"
    assert end_offset(secured, topic) == 0
    # On the wire: a Kafka request to the TLS port gets no Kafka answer, only a close.
    with kproto.Conn("127.0.0.1", secured.ports["SSL"]) as c:
        c.sock.sendall(kproto.encode_request(kproto.API_VERSIONS, 0, 1, b""))
        data = b""
        try:
            while True:
                chunk = c.sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        # Whatever came back (a TLS alert at most) is not a Kafka ApiVersions response.
        assert not (len(data) >= 8 and struct.unpack(">i", data[4:8])[0] == 1)


def test_a_renewed_keystore_is_served_without_a_restart(broker_factory, certs, tmp_path):
    """A certificate renewed on disk (written beside and renamed over, as renewal tools do)
    is served to new connections; a store that does not load leaves the last good one."""
    import os
    import ssl
    from security_certs import _leaf
    keystore = tmp_path / "keystore.pem"
    keystore.write_text(certs.text("broker-keystore.pem"))
    s = start_secured(broker_factory, certs, {"ssl.keystore.location": str(keystore),
                                              "gregor.ssl.store.check.interval.ms": "200"})

    def served() -> bytes:
        return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", s.ports["SSL"]), timeout=10))

    def replace(text: str):
        part = tmp_path / "keystore.pem.part"
        part.write_text(text)
        os.replace(part, keystore)

    assert served() == ssl.PEM_cert_to_DER_cert(certs.text("broker.pem"))
    _leaf(certs.dir, "renewed", "/CN=broker-renewed", "ca", san="IP:127.0.0.1,DNS:localhost")
    renewed = ssl.PEM_cert_to_DER_cert(certs.text("renewed.pem"))
    replace(certs.text("renewed.key") + certs.text("renewed.pem"))
    wait_until(lambda: served() == renewed, 30, "the renewed certificate to be served")
    topic = uniq("renewed")
    produce_consume(client_conf(s, "SSL"), topic)

    replace("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    wait_until(lambda: "keeping the previous one" in s.log(), 30, "the broken keystore to be reported")
    assert served() == renewed
    produce_consume(client_conf(s, "SSL"), uniq("renewed"))


def sasl_conn(s, listener="SASL_PLAINTEXT"):
    return kproto.Conn("127.0.0.1", s.ports[listener], timeout=15)


def handshake(c, mechanism, version=1):
    r = c.call(SASL_HANDSHAKE, version, kproto.W().string(mechanism).done())
    code = r.i16()
    mechs = r.array(lambda x: x.string())
    return code, mechs


def authenticate(c, token: bytes, version=1):
    r = c.call(SASL_AUTHENTICATE, version, kproto.W().bytes_(token).done())
    code, msg, auth = r.i16(), r.string(), r.bytes_()
    lifetime = r.i64() if version >= 1 else None
    return code, msg, auth, lifetime


def test_requests_before_authentication_close_the_connection_and_write_nothing(secured):
    topic = uniq("neg")
    with sasl_conn(secured) as c:
        # ApiVersions is served before authentication ...
        assert c.api_versions(0)["error_code"] == 0
        # ... a Produce is not: no answer, a closed connection.
        batch = kproto.build_batch([kproto.Record(key=b"k", value=b"v")])
        c.send(0, 7, kproto.produce_request(7, {topic: {0: batch}}))
        assert kproto.wait_closed(c.sock)
    with sasl_conn(secured) as c:
        c.send(METADATA, 1, kproto.metadata_request(1, None))
        assert kproto.wait_closed(c.sock)
    assert end_offset(secured, topic) == 0
    assert "before SASL authentication completed; closing" in secured.log()


def test_sasl_out_of_order_unknown_mechanism_and_oversized_token(secured):
    # SaslAuthenticate before any handshake: ILLEGAL_SASL_STATE (34), then closed.
    with sasl_conn(secured) as c:
        c.send(SASL_AUTHENTICATE, 1, kproto.W().bytes_(b"\0alice\0alice-secret").done())
        assert kproto.wait_closed(c.sock)
    # An unknown mechanism: UNSUPPORTED_SASL_MECHANISM (33) with the enabled ones, then closed.
    with sasl_conn(secured) as c:
        code, mechs = handshake(c, "OAUTHBEARER")
        assert (code, mechs) == (33, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
        assert kproto.wait_closed(c.sock)
    # A frame over sasl.server.max.receive.size (512 KiB) before authentication: closed unread.
    with sasl_conn(secured) as c:
        assert handshake(c, "PLAIN")[0] == 0
        c.sock.sendall(struct.pack(">i", 1 << 20) + b"\0" * 1024)
        assert kproto.wait_closed(c.sock)
    # SaslHandshake on a listener without SASL: ILLEGAL_SASL_STATE, connection kept.
    with kproto.Conn("127.0.0.1", secured.ports["PLAINTEXT"]) as c:
        assert handshake(c, "PLAIN")[0] == 34
        assert c.api_versions(0)["error_code"] == 0


def test_failed_authentication_is_answered_after_the_delay_then_closed(secured):
    with sasl_conn(secured) as c:
        assert handshake(c, "PLAIN")[0] == 0
        t0 = time.monotonic()
        code, msg, _, _ = authenticate(c, b"\0alice\0nope")
        assert time.monotonic() - t0 >= DELAY_MS / 1000  # a lower bound only
        assert (code, msg) == (58, f"{AUTH_FAILED} PLAIN")
        assert kproto.wait_closed(c.sock)


def test_garbage_tls_handshakes_cost_only_their_connection(secured):
    for junk in [os.urandom(512), b"\x16\x03\x01\x02\x00" + os.urandom(600), b"GET / HTTP/1.0\r\n\r\n"]:
        with kproto.Conn("127.0.0.1", secured.ports["SSL"]) as c:
            c.sock.sendall(junk)
            assert kproto.wait_closed(c.sock)
    # Still serving TLS clients.
    ctx = ssl.create_default_context(cafile=secured.certs.path("ca.pem"))
    with socket.create_connection(("127.0.0.1", secured.ports["SSL"]), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as t:
            t.sendall(kproto.encode_request(kproto.API_VERSIONS, 0, 7, b""))
            (size,) = struct.unpack(">i", kproto.recv_exact(t, 4))
            assert struct.unpack(">i", kproto.recv_exact(t, size)[:4])[0] == 7


# --------------------------------------------------------------------- sessions, re-authentication

def test_session_lifetime_and_reauthentication(broker_factory, certs):
    s = start_secured(broker_factory, certs, {"connections.max.reauth.ms": "3000"})
    with sasl_conn(s) as c:
        assert handshake(c, "PLAIN")[0] == 0
        code, _, _, lifetime = authenticate(c, b"\0alice\0alice-secret")
        assert (code, lifetime) == (0, 3000)
        # Re-authenticating (KIP-368) before expiry starts a new session on the same connection.
        time.sleep(1.5)
        assert handshake(c, "PLAIN")[0] == 0
        assert authenticate(c, b"\0alice\0alice-secret")[0] == 0
        time.sleep(2.0)  # past the first session's end, inside the second's
        r = c.call(METADATA, 1, kproto.metadata_request(1, []))
        assert r.remaining() > 0
        # A re-authentication may not change who the connection is.
        assert handshake(c, "PLAIN")[0] == 0
        assert authenticate(c, b"\0admin\0admin-secret")[0] == 58
        assert kproto.wait_closed(c.sock)
    with sasl_conn(s) as c:
        assert handshake(c, "PLAIN")[0] == 0
        assert authenticate(c, b"\0alice\0alice-secret")[0] == 0
        time.sleep(3.2)  # the session is over: the next request closes the connection
        c.send(METADATA, 1, kproto.metadata_request(1, []))
        assert kproto.wait_closed(c.sock)
    assert "after the SASL session expired" in s.log()


# --------------------------------------------------------------------- SCRAM credentials in ZooKeeper

def test_scram_credentials_in_zookeeper_reach_every_broker(broker_factory, zookeeper):
    from kazoo.client import KazooClient
    chroot = "/" + uniq("scram")
    bs = [broker_factory(overrides={"zookeeper.connect": zookeeper.connect + chroot,
                                    "broker.id": str(i), "offsets.topic.replication.factor": "1"}, broker_id=i)
          for i in (1, 2)]
    a = AdminClient({"bootstrap.servers": bs[0].bootstrap})
    up = UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"pw")
    for f in a.alter_user_scram_credentials([up]).values():
        assert f.result(timeout=30) is None
    zk = KazooClient(hosts=zookeeper.connect + chroot)
    zk.start()
    try:
        data = json.loads(zk.get("/config/users/dave")[0])
        assert data["version"] == 1
        assert re.fullmatch(r"salt=[A-Za-z0-9+/=]+,stored_key=[A-Za-z0-9+/=]+,server_key=[A-Za-z0-9+/=]+,"
                            r"iterations=8192", data["config"]["SCRAM-SHA-512"])
        notices = [json.loads(zk.get(f"/config/changes/{n}")[0]) for n in zk.get_children("/config/changes")]
        assert {"version": 2, "entity_path": "users/dave"} in notices
    finally:
        zk.stop()
    # The other broker learns of the user without a restart.
    other = AdminClient({"bootstrap.servers": bs[1].bootstrap})

    def described():
        d = other.describe_user_scram_credentials(["dave"])["dave"].result(timeout=10)
        return [(i.mechanism, i.iterations) for i in d.scram_credential_infos]
    wait_until(lambda: described() == [(ScramMechanism.SCRAM_SHA_512, 8192)], 30, "broker 2 to see dave")


# --------------------------------------------------------------------- configurations refused at start

def run_expect_refusal(tmp_path, overrides: dict, *expected: str):
    port = free_port()
    cmd = [str(gregor_bin()), "--override", f"log.dirs={tmp_path / 'data'}"]
    o = {"listeners": f"PLAINTEXT://127.0.0.1:{port}", **overrides}
    for k, v in o.items():
        cmd += ["--override", f"{k}={v}"]
    r = subprocess.run(cmd, capture_output=True, timeout=60, stdin=subprocess.DEVNULL,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}, "NO_COLOR": "1"})
    out = (r.stdout + r.stderr).decode(errors="replace")
    assert r.returncode not in (0, -6, -11) and "panicked" not in out, out
    for e in expected:
        assert e in out, out
    return out


@pytest.mark.parametrize("extra,expected", [
    ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "/x.jks"}, ["ssl.keystore.type", "PEM only"]),
    ({"ssl.keystore.location": "/x.jks"}, ["ssl.keystore.location", "PEM"]),
    ({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "/x.p12"}, ["ssl.keystore.type"]),
    ({}, ["listener.name.ssl.ssl.keystore.location", "needs a keystore"]),
])
def test_unusable_tls_settings_are_refused_naming_the_key(tmp_path, extra, expected):
    p2 = free_port()
    run_expect_refusal(tmp_path, {"listeners": f"PLAINTEXT://127.0.0.1:{free_port()},SSL://127.0.0.1:{p2}",
                                  **extra}, *expected)


@pytest.mark.parametrize("mechanisms,expected", [
    (None, "GSSAPI"), ("GSSAPI", "Kerberos"), ("OAUTHBEARER", "OAUTHBEARER is not supported"),
])
def test_unsupported_sasl_mechanisms_are_refused_naming_the_key(tmp_path, mechanisms, expected):
    o = {"listeners": f"PLAINTEXT://127.0.0.1:{free_port()},SASL_PLAINTEXT://127.0.0.1:{free_port()}"}
    if mechanisms:
        o["sasl.enabled.mechanisms"] = mechanisms
    run_expect_refusal(tmp_path, o, "sasl.enabled.mechanisms", expected)


def inter_broker_refusal(tmp_path, zookeeper, protocol: str, extra: dict, *expected: str):
    """A broker of a cluster whose INTERNAL inter-broker listener is `protocol` with `extra`
    settings: refused at start, naming the key."""
    listeners = f"PLAINTEXT://127.0.0.1:{free_port()},INTERNAL://127.0.0.1:{free_port()}"
    run_expect_refusal(tmp_path, {
        "listeners": listeners,
        "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,INTERNAL:{protocol}",
        "inter.broker.listener.name": "INTERNAL",
        "zookeeper.connect": zookeeper.connect + "/" + uniq("refuse"),
        **extra,
    }, *expected)


def test_inter_broker_settings_that_cannot_be_honoured_are_refused(tmp_path, zookeeper, certs):
    c = certs
    tls = {"ssl.keystore.type": "PEM", "ssl.keystore.location": c.path("broker-keystore.pem"),
           "ssl.truststore.type": "PEM", "ssl.truststore.location": c.path("ca.pem")}
    scram = {"listener.name.internal.sasl.enabled.mechanisms": "SCRAM-SHA-512"}
    jaas = {"listener.name.internal.scram-sha-512.sasl.jaas.config":
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="pw";'}
    no_truststore = {k: v for k, v in tls.items() if not k.startswith("ssl.truststore")}
    # SSL between brokers: this broker must be able to verify the others' certificates.
    inter_broker_refusal(tmp_path, zookeeper, "SSL", no_truststore,
                         "listener.name.internal.ssl.truststore.location", "verifies the other brokers' certificates")
    # SASL: Kafka's default mechanism (GSSAPI) is not spoken, so it must be named ...
    inter_broker_refusal(tmp_path, zookeeper, "SASL_SSL", {**tls, **scram, **jaas},
                         "sasl.mechanism.inter.broker.protocol", "GSSAPI")
    # ... and enabled on the listener ...
    inter_broker_refusal(tmp_path, zookeeper, "SASL_SSL",
                         {**tls, **scram, **jaas, "sasl.mechanism.inter.broker.protocol": "PLAIN",
                          "listener.name.internal.plain.sasl.jaas.config":
                              'org.apache.kafka.common.security.plain.PlainLoginModule required '
                              'username="broker" password="pw" user_broker="pw";'},
                         "sasl.mechanism.inter.broker.protocol", "not among the mechanisms")
    # ... and this broker needs credentials for it.
    inter_broker_refusal(tmp_path, zookeeper, "SASL_SSL",
                         {**tls, **scram, "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512"},
                         "listener.name.internal.scram-sha-512.sasl.jaas.config", "username and password")
    inter_broker_refusal(tmp_path, zookeeper, "SASL_PLAINTEXT",
                         {**scram, "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                          "listener.name.internal.scram-sha-512.sasl.jaas.config":
                              'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker";'},
                         "listener.name.internal.scram-sha-512.sasl.jaas.config", "needs username and password")
    # The controller uses the inter-broker listener: a separately secured control plane is not served.
    run_expect_refusal(tmp_path, {
        "listeners": f"PLAINTEXT://127.0.0.1:{free_port()},CONTROL://127.0.0.1:{free_port()}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROL:SSL",
        "control.plane.listener.name": "CONTROL",
        "zookeeper.connect": zookeeper.connect + "/" + uniq("refuse"),
        **tls,
    }, "control.plane.listener.name", "inter-broker listener")


# --------------------------------------------------------------------- secured inter-broker listener

@pytest.fixture
def cluster_factory(request, zookeeper):
    from cluster_harness import Cluster
    from gregor_fixtures import _failed, _register
    clusters = []

    def make(inter, n=3, overrides=None, start=True):
        from inter_broker_security import BROKER_PASSWORD, BROKER_USER, add_scram_user_in_zookeeper
        o = {"replica.lag.time.max.ms": "3000", **(overrides or {})}
        c = Cluster(zookeeper, n, overrides=o, broker_overrides=inter,
                    on_new_broker=lambda b: _register(request, b))
        clusters.append(c)
        add_scram_user_in_zookeeper(c.kz, BROKER_USER, BROKER_PASSWORD)
        if start:
            c.start()
        return c

    yield make
    failed = _failed(request)
    for c in clusters:
        c.cleanup(keep=failed)


def create_topic(c, name, assignment):
    from confluent_kafka.admin import NewTopic
    ctl = c.wait_controller()
    want = c.live_ids()
    wait_until(lambda: sorted(c.metadata(ctl).brokers) == want, 60, f"the controller to list {want}")
    a = c.admin(ctl)  # kept: a collected client cancels its requests
    f = a.create_topics([NewTopic(name, len(assignment), replica_assignment=assignment)], operation_timeout=30)
    f[name].result(timeout=60)
    c.wait_topic_online(name, len(assignment), timeout=60)


def wait_isr(c, topic, p, want, what):
    def ok():
        s = c.partition_state(topic, p)
        return sorted(s["isr"]) == sorted(want)
    wait_until(ok, 90, f"{topic}-{p}: ISR {sorted(want)} ({what})", interval=0.1)


def test_mutual_tls_inter_broker_listener_replicates_as_the_certificate_principal(cluster_factory, certs):
    """SSL between brokers with client certificates required: the broker certificate's
    mapped subject is the principal the authorizer sees, and it needs CLUSTER_ACTION (here as a
    super user) for followers to fetch and for the controller's requests."""
    from inter_broker_security import AUTHORIZER, InterBroker
    inter = InterBroker(certs, "SSL", extra={
        "listener.name.internal.ssl.client.auth": "required",
        "listener.name.internal.ssl.principal.mapping.rules": "RULE:^CN=([^,]*)$/$1/,DEFAULT",
        "authorizer.class.name": AUTHORIZER,
        # The test's clients come in on PLAINTEXT as User:ANONYMOUS.
        "super.users": "User:broker;User:ANONYMOUS",
    })
    c = cluster_factory(inter)
    topic = uniq("mtls-ib")
    create_topic(c, topic, [[1, 2, 3]])
    wait_isr(c, topic, 0, [1, 2, 3], "fresh topic")
    produce_consume({"bootstrap.servers": c.bootstrap()}, topic, n=50)
    wait_isr(c, topic, 0, [1, 2, 3], "after producing")
    for b in c.brokers.values():
        log = b.stderr_tail(1000000)
        assert re.search(r"listener=INTERNAL.*authenticated by client certificate principal=User:broker", log), \
            f"broker {b.broker_id} saw no broker certificate"
        assert "no CLUSTER_ACTION" not in log


def test_wrong_inter_broker_credentials_keep_the_follower_out(cluster_factory, certs):
    """A broker whose SCRAM password is wrong cannot fetch: it never joins the ISR, the
    leader keeps accepting acks=all writes with the others, both sides log the failure, and
    nothing panics (the process guard checks every log)."""
    from inter_broker_security import InterBroker
    inter = InterBroker(certs, "SASL_SSL", password_of=lambda i: "wrong" if i == 3 else "broker-secret")
    c = cluster_factory(inter, n=2)
    # The bad broker joins after brokers 1 and 2 chose a controller among themselves.
    ctl = c.wait_controller()
    c.brokers[3] = c.new_broker(3)
    c.brokers[3].start()
    c.wait_registered([1, 2, 3])
    topic = uniq("badcreds")
    leader = 2 if ctl == 1 else 1
    others = [i for i in (1, 2) if i != leader]
    create_topic(c, topic, [[leader, 3, *others]])
    wait_isr(c, topic, 0, [1, 2], "the broker with wrong credentials dropped")
    p = Producer({"bootstrap.servers": c.bootstrap([1, 2]), "acks": "all"})
    for i in range(20):
        p.produce(topic, value=b"v%d" % i, partition=0)
    assert p.flush(30) == 0
    bad = c.brokers[3]

    def failures():
        return bad.stderr_tail(1000000).count("cannot authenticate to leader")
    seen = failures()
    assert seen > 0, bad.stderr_tail(40)
    # It keeps trying (with backoff) and keeps failing; the data never reaches it.
    wait_until(lambda: failures() >= seen + 2, 60, "broker 3 to retry and fail again")
    assert "SASL authentication as broker with SCRAM-SHA-512 failed" in bad.stderr_tail(1000000)
    assert sorted(c.partition_state(topic, 0)["isr"]) == [1, 2]
    from replication_tools import segment_bytes
    assert not segment_bytes(bad, topic, 0), "records reached the broker that could not authenticate"
    assert "authentication failed" in c.brokers[leader].stderr_tail(1000000)
