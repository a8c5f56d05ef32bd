"""The official Java client (kafka-clients 3.9.1) via compat/java/GregorCompat.java.

Jars: GREGOR_JAVA_LIB (default <repo>/.cache/java-lib, filled by scripts/test from
the PyPI wheel shigawire-apache-flink-libraries==2.0.0.post1).  Missing jars or
javac FAIL the suite unless GREGOR_SKIP_JAVA=1.
"""
import os
import shutil
import subprocess
import threading

import pytest

import java_client
from common import kill9_during_produce, uniq

if os.environ.get("GREGOR_SKIP_JAVA") == "1":
    pytest.skip("GREGOR_SKIP_JAVA=1", allow_module_level=True)


@pytest.fixture(scope="session")
def java_classpath():
    cp, out = java_client.compile_client()
    yield cp
    shutil.rmtree(out, ignore_errors=True)


def run_java(cp, broker, *args, timeout=300):
    return java_client.run(cp, broker.bootstrap, broker.base_dir / "java-tmp", *args, timeout=timeout)


@pytest.mark.parametrize("scenario", ["metadata", "create-topic", "produce-consume", "codecs", "acks",
                                      "idempotent", "list-offsets", "delete-topic", "auto-create",
                                      "configs", "transactions", "txn-fencing"])
def test_scenario(java_classpath, broker, scenario):
    run_java(java_classpath, broker, scenario)


def test_fetch_sessions_over_many_partitions(java_classpath, broker):
    run_java(java_classpath, broker, "fetch-sessions")


def test_restart_sigterm_keeps_data(java_classpath, broker):
    t = uniq("java-restart")
    run_java(java_classpath, broker, "produce", "3000", t)
    rc = broker.restart("term")
    assert rc == 0, f"SIGTERM shutdown exit code {rc}"
    run_java(java_classpath, broker, "verify", "3000", t)


def test_kill9_keeps_acked_data(java_classpath, broker):
    """kill -9 while an idempotent acks=all Java producer is still sending (it runs until its
    stdin closes); every acknowledgement it printed, before or after the kill, names a record
    that is at that partition/offset afterwards."""
    t = uniq("java-kill")
    tmp = broker.base_dir / "java-tmp"
    tmp.mkdir(exist_ok=True)
    proc = subprocess.Popen(["java", "-Xmx512m", f"-Djava.io.tmpdir={tmp}", "-cp", java_classpath, "GregorCompat",
                             broker.bootstrap, "produce-stream", t],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    acks, out = [], []
    errf = []

    def read_out():
        for line in proc.stdout:
            line = line.decode(errors="replace").strip()
            (acks if line.startswith("ACK ") else out).append(line)

    readers = [threading.Thread(target=read_out, daemon=True),
               threading.Thread(target=lambda: errf.extend(proc.stderr), daemon=True)]
    for r in readers:
        r.start()

    def stop():
        proc.stdin.close()  # produce-stream stops sending, flushes and exits
        rc = proc.wait(300)
        for r in readers:
            r.join(30)
        err = b"".join(errf).decode(errors="replace")
        assert rc == 0, f"produce-stream exited {rc}\nstdout: {out[-20:]}\nstderr:\n{err[-6000:]}"

    try:
        at_kill = kill9_during_produce(broker, lambda: len(acks), lambda: proc.poll() is None, stop,
                                       timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ackfile = broker.base_dir / "java-acks.txt"
    ackfile.write_text("\n".join(acks) + "\n")
    res = run_java(java_classpath, broker, "verify-acked", t, str(ackfile))
    print(f"kill -9 with {at_kill} acknowledged; {len(acks)} acknowledged in all; "
          + " ".join(ln for ln in res.splitlines() if ln.startswith("VERIFIED")))
