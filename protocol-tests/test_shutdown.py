"""SIGTERM is a clean shutdown: what was answered is stored, the exit code is 0, and the next
start skips recovery (the log manager reports clean_shutdown=true); after kill -9 it does not."""
import re
import threading

import kproto as kp
from test_apis import new_topic

LOADED = re.compile(r"loaded log dir .*clean_shutdown=(true|false)")


def clean_flag(broker):
    text = broker.log_path.read_text(errors="replace")
    flags = LOADED.findall(text)
    assert len(flags) == 1, f"expected one 'loaded log dir ... clean_shutdown=' line in {broker.log_path}: {flags}"
    return flags[0] == "true"


def test_sigterm_with_requests_in_flight(broker):
    n = 200
    with kp.Conn(broker.host, broker.port) as c:
        topic = new_topic(c)
        assert clean_flag(broker) is False  # a fresh dir: nothing to call clean
        wire = b"".join(kp.encode_request(kp.PRODUCE, 8, 9000 + i, kp.produce_request(
            8, {topic: {0: kp.build_batch([kp.Record(b"inflight-%03d" % i)])}})) for i in range(n))
        c.sock.sendall(wire)
        rc = {}
        stopper = threading.Thread(target=lambda: rc.setdefault("rc", broker.stop(timeout=60)))
        stopper.start()
        answered = []
        try:
            for i in range(n):
                p = kp.decode_produce(c.recv(kp.PRODUCE, 8, 9000 + i), 8)["responses"][0]["partitions"][0]
                answered.append((i, p["error_code"], p["base_offset"]))
        except (ConnectionError, OSError):
            pass  # the broker closed the connection; what it answered is checked below
        stopper.join(90)
    assert rc.get("rc") == 0, f"exit code after SIGTERM: {rc}"
    ok = [(i, off) for i, e, off in answered if e == 0]
    assert ok == [(i, i) for i in range(len(ok))], f"answers out of order or failed: {answered[:5]}..."
    broker.start()
    assert clean_flag(broker) is True, "the start after a SIGTERM shutdown ran recovery"
    with kp.Conn(broker.host, broker.port) as c:
        stored = [r.value for r in kp.fetch_all(c, topic, 0)]
    # every answered produce is there at its offset; anything else stored is the next ones in order
    assert stored[:len(ok)] == [b"inflight-%03d" % i for i, _ in ok], stored[:5]
    assert stored == [b"inflight-%03d" % i for i in range(len(stored))], stored[:5]
    assert broker.restart("kill") == -9
    assert clean_flag(broker) is False, "the start after kill -9 claimed a clean shutdown"
