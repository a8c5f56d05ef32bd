"""The official Java client (kafka-clients 3.9.1) via compat/java/GregorCompat.java.

Jars: GREGOR_JAVA_LIB (default <repo>/.cache/java-lib, filled by scripts/test from
the PyPI wheel shigawire-apache-flink-libraries==2.0.0.post1).  Missing jars or
javac FAIL the suite unless GREGOR_SKIP_JAVA=1.
"""
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from common import kill9_during_produce, uniq

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIB = Path(os.environ.get("GREGOR_JAVA_LIB", REPO / ".cache" / "java-lib"))
JARS = ["kafka-clients.jar", "slf4j-api.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar"]
SRC = HERE / "java" / "GregorCompat.java"

if os.environ.get("GREGOR_SKIP_JAVA") == "1":
    pytest.skip("GREGOR_SKIP_JAVA=1", allow_module_level=True)


@pytest.fixture(scope="session")
def java_classpath():
    missing = [j for j in JARS if not (LIB / j).exists()]
    assert not missing, (f"Java client jars missing from {LIB}: {missing}. scripts/test downloads them "
                         f"(pip download shigawire-apache-flink-libraries==2.0.0.post1); set GREGOR_SKIP_JAVA=1 to skip")
    javac = shutil.which("javac")
    assert javac, "javac not found (install a JDK, or GREGOR_SKIP_JAVA=1)"
    out = Path(tempfile.mkdtemp(prefix="gregor-java-"))
    cp = ":".join(str(LIB / j) for j in JARS)
    p = subprocess.run([javac, "-d", str(out), "-cp", cp, str(SRC)], capture_output=True, timeout=300)
    assert p.returncode == 0, f"javac failed:\n{p.stderr.decode(errors='replace')}"
    yield f"{out}:{cp}"
    shutil.rmtree(out, ignore_errors=True)


def run_java(cp, broker, *args, timeout=300):
    tmp = broker.base_dir / "java-tmp"
    tmp.mkdir(exist_ok=True)
    cmd = ["java", "-Xmx512m", f"-Djava.io.tmpdir={tmp}", "-cp", cp, "GregorCompat", broker.bootstrap, *args]
    p = subprocess.run(cmd, capture_output=True, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0, (f"GregorCompat {' '.join(args)} exited {p.returncode}\n"
                               f"stdout:\n{out[-3000:]}\nstderr:\n{err[-6000:]}")
    assert f"OK {args[0]}" in out
    return out


@pytest.mark.parametrize("scenario", ["metadata", "create-topic", "produce-consume", "codecs", "acks",
                                      "idempotent", "list-offsets", "delete-topic", "auto-create",
                                      "configs"])
def test_scenario(java_classpath, broker, scenario):
    run_java(java_classpath, broker, scenario)


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
