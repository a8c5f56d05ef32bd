"""TLS vs PLAINTEXT on one broker in one run: produce and consume throughput (confluent-kafka),
broker CPU seconds per million records (from /proc/<pid>/stat), and TLS handshakes per second
(Python ssl clients, sequential). Usage: .venv/bin/python scripts/bench_lib/tls_bench.py [records]

Certificates come from compat/security_certs.py (openssl). Loopback only; bounded counts."""
import os
import socket
import ssl
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "compat"))
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from gregor_harness import Broker, free_port  # noqa: E402
from security_certs import Certs  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK


def run(conf: dict, topic: str, n: int, size: int, pid: int) -> dict:
    value = b"x" * size
    p = Producer({**conf, "linger.ms": 5, "batch.size": 262144, "acks": 1, "queue.buffering.max.messages": 1000000})
    c0, t0 = cpu_s(pid), time.monotonic()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0
    t1, c1 = time.monotonic(), cpu_s(pid)
    c = Consumer({**conf, "group.id": f"bench-{topic}", "fetch.max.bytes": 52428800})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    deadline = time.monotonic() + 300
    while got < n and time.monotonic() < deadline:
        for m in c.consume(10000, 1.0):
            if m.error() is None:
                got += 1
    t2, c2 = time.monotonic(), cpu_s(pid)
    c.close()
    mb = n * size / 1e6
    return {"produce_rec_s": n / (t1 - t0), "produce_MB_s": mb / (t1 - t0), "produce_cpu_s_per_M": (c1 - c0) * 1e6 / n,
            "consume_rec_s": got / (t2 - t1), "consume_MB_s": mb / (t2 - t1), "consume_cpu_s_per_M": (c2 - c1) * 1e6 / n}


def handshakes(port: int, ca: str, seconds: float = 5.0) -> float:
    ctx = ssl.create_default_context(cafile=ca)
    done, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        with socket.create_connection(("127.0.0.1", port)) as s:
            with ctx.wrap_socket(s, server_hostname="127.0.0.1"):
                done += 1
    return done / (time.monotonic() - t0)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    size = 100
    certs = Certs(Path(tempfile.mkdtemp(prefix="gregor-tls-bench-")))
    plain, tls = free_port(), free_port()
    b = Broker(port=plain, overrides={
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": certs.path("broker-keystore.pem"),
        "offsets.topic.replication.factor": "1", "num.partitions": "1"})
    b.start()
    try:
        pid = b.proc.pid
        results = {
            "PLAINTEXT": run({"bootstrap.servers": f"127.0.0.1:{plain}"}, "bench-plain", n, size, pid),
            "SSL": run({"bootstrap.servers": f"127.0.0.1:{tls}", "security.protocol": "SSL",
                        "ssl.ca.location": certs.path("ca.pem")}, "bench-ssl", n, size, pid),
        }
        print(f"{n} records of {size} bytes, one partition, acks=1, one broker (2-core machine)")
        for name, r in results.items():
            print(f"{name:9} produce {r['produce_rec_s']:10.0f} rec/s {r['produce_MB_s']:6.1f} MB/s "
                  f"broker CPU {r['produce_cpu_s_per_M']:5.2f} s/M | consume {r['consume_rec_s']:10.0f} rec/s "
                  f"{r['consume_MB_s']:6.1f} MB/s broker CPU {r['consume_cpu_s_per_M']:5.2f} s/M")
        print(f"TLS handshakes (sequential, full handshake each): {handshakes(tls, certs.path('ca.pem')):.0f}/s")
    finally:
        b.stop()
        b.cleanup()


if __name__ == "__main__":
    main()
