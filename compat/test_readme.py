"""The README's first commands, run exactly as written: `cargo run --release` from the
repository root (standalone, 127.0.0.1:9092, data in ./data), then the "Try it with kcat"
block line by line, so the first thing a new user types can never break unnoticed.

It needs 127.0.0.1:9092 and the repository's ./data: an existing ./data is moved aside for the
run and put back after it."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def shell_block(after_heading: str) -> list:
    """The lines of the first ```sh block after the heading `after_heading`."""
    text = README.read_text()
    start = text.index(after_heading)
    m = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert m, f"no sh block after {after_heading!r} in README.md"
    return [line for line in m.group(1).splitlines() if line.strip()]


def without_comment(line: str) -> str:
    return line.split("#", 1)[0].strip()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_readme_set_up_and_kcat_example_run_as_written():
    setup = shell_block("## Set up")
    run = [without_comment(line) for line in setup if line.startswith("cargo run")]
    assert run == ["cargo run --release"], f"README's set-up no longer starts with cargo run --release: {setup}"
    kcat = shell_block("## Try it with kcat")
    assert any("kcat -C" in line for line in kcat), kcat
    if port_open(9092):
        pytest.fail("127.0.0.1:9092 is taken by another process: the README's broker cannot start there")

    data = ROOT / "data"
    aside = ROOT / f"data.readme-test-{os.getpid()}"
    if data.exists():
        data.rename(aside)
    log = open(ROOT / "target" / "readme-broker.log", "wb")
    broker = subprocess.Popen(run[0].split(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 600  # cargo may have to build what the suite built already
        while not port_open(9092):
            assert broker.poll() is None, f"`cargo run --release` exited with {broker.returncode}"
            assert time.monotonic() < deadline, "the broker never listened on 127.0.0.1:9092"
            time.sleep(0.2)
        for line in kcat:
            cmd = without_comment(line)
            out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=ROOT, capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 0, f"README command failed: {cmd}\n{out.stderr[-2000:]}"
            want = line.split("#", 1)[1].strip() if "#" in line else None
            if want is not None and want.isdigit():
                assert out.stdout.strip() == want, f"{cmd}: printed {out.stdout.strip()!r}, README says {want}"
        assert (data / "t-0").is_dir(), "the README's topic is not stored under ./data"
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        try:
            broker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(broker.pid, signal.SIGKILL)
            broker.wait()
        log.close()
        shutil.rmtree(data, ignore_errors=True)
        if aside.exists():
            aside.rename(data)
