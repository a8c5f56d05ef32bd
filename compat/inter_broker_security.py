"""Settings for clusters whose inter-broker listener is secured (SSL or SASL_SSL).

Each broker gets two listeners: PLAINTEXT (the harness's port, for the test's clients) and
INTERNAL, the inter-broker listener, on a port of its own. SCRAM credentials are written to
ZooKeeper in Kafka's format before any broker starts, as `kafka-configs --zookeeper ...
--alter --add-config 'SCRAM-SHA-512=[password=...]' --entity-type users` does.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os

from gregor_harness import free_port

BROKER_USER, BROKER_PASSWORD = "broker", "broker-secret"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"


def scram_credential(password: str, iterations: int = 4096) -> str:
    """Kafka's `ScramCredentialUtils.credentialToString` for SCRAM-SHA-512 (RFC 5802)."""
    salt = os.urandom(32)
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha512).digest()
    stored_key = hashlib.sha512(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha512).digest()
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    return f"salt={b64(salt)},stored_key={b64(stored_key)},server_key={b64(server_key)},iterations={iterations}"


def add_scram_user_in_zookeeper(kz, user: str, password: str) -> None:
    """/config/users/<user> as Kafka writes it (brokers read every user when they start)."""
    data = json.dumps({"version": 1, "config": {"SCRAM-SHA-512": scram_credential(password)}}).encode()
    path = f"/config/users/{user}"
    if kz.exists(path):
        kz.set(path, data)
    else:
        kz.create(path, data, makepath=True)


class InterBroker:
    """Per-broker overrides for `Cluster(broker_overrides=...)`; each broker keeps its INTERNAL
    port across restarts."""

    def __init__(self, certs, protocol: str = "SASL_SSL", password_of=None, extra=None):
        self.certs, self.protocol = certs, protocol
        self.password_of = password_of or (lambda broker_id: BROKER_PASSWORD)
        self.extra = dict(extra or {})
        self.internal_ports = {}

    def __call__(self, broker_id: int, port: int) -> dict:
        internal = self.internal_ports.setdefault(broker_id, free_port())
        listeners = f"PLAINTEXT://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}"
        o = {
            "listeners": listeners,
            "advertised.listeners": listeners,
            "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,INTERNAL:{self.protocol}",
            "inter.broker.listener.name": "INTERNAL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": self.certs.path("broker-keystore.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": self.certs.path("ca.pem"),
        }
        if self.protocol.startswith("SASL_"):
            o.update({
                "listener.name.internal.sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                "listener.name.internal.scram-sha-512.sasl.jaas.config":
                    f'{SCRAM_LOGIN} required username="{BROKER_USER}" password="{self.password_of(broker_id)}";',
            })
        o.update(self.extra)
        return o
