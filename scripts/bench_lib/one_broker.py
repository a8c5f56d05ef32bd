"""One gregor broker for a benchmark: started on a free port with its data in a temp dir,
stopped (and the dir removed unless GREGOR_BENCH_KEEP_TMP) however the benchmark ends; plus
the small helpers the single-broker benchmarks share."""
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time

from confluent_kafka.admin import AdminClient, NewTopic


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid):
    """utime + stime of process `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(vals, q):
    s = sorted(vals)
    return s[min(len(s) - 1, int(q * len(s)))] if s else None


def wait_ready(bootstrap, proc, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"gregor exited with {proc.returncode}")
        try:
            AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=1)
            return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.05)
    raise TimeoutError("gregor did not start")


def create(bootstrap, topic, partitions=1):
    """Creates `topic` (replication factor 1) and waits until every partition has a leader."""
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        md = a.list_topics(topic, timeout=5).topics[topic]
        if md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{topic} not led")


@contextlib.contextmanager
def one_broker(gregor, name, overrides=None):
    """Yields (bootstrap, process) of a broker started from binary `gregor`, ready to serve."""
    data = tempfile.mkdtemp(prefix=f"gregor-{name}-bench-")
    port = free_port()
    log = open(os.path.join(data, "broker.log"), "wb")
    args = [gregor, "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}", "--override", f"log.dirs={data}/logs"]
    for k, v in (overrides or {}).items():
        args += ["--override", f"{k}={v}"]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    bootstrap = f"127.0.0.1:{port}"
    try:
        wait_ready(bootstrap, proc)
        yield bootstrap, proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        if not os.environ.get("GREGOR_BENCH_KEEP_TMP"):
            shutil.rmtree(data, ignore_errors=True)
