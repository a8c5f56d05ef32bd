"""The README's and docs/' examples, run exactly as written, so the first thing a new user types
can never break unnoticed.

Against one broker started as the README says (`cargo run --release` from the repository root:
standalone, 127.0.0.1:9092, data in ./data): the "Try it with kcat" block line by line, the
transaction example of docs/compatibility.md, and the gregor-perf examples of
docs/benchmarks.md. Without a broker: every repository path, script and `gregor.*` config key
the README and docs/ name exists, and every relative link resolves.

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
DOCS = ROOT / "docs"


def doc_files() -> list:
    return [README] + sorted(DOCS.glob("*.md"))


def shell_block(after_heading: str, doc: Path = README, lang: str = "sh") -> list:
    """The lines of the first ```<lang> block after the heading `after_heading` in `doc`."""
    text = doc.read_text()
    assert after_heading in text, f"no {after_heading!r} in {doc.relative_to(ROOT)}"
    start = text.index(after_heading)
    m = re.search(r"```" + lang + r"\n(.*?)```", text[start:], re.S)
    assert m, f"no {lang or 'plain'} block after {after_heading!r} in {doc.relative_to(ROOT)}"
    return [line for line in m.group(1).splitlines() if line.strip()]


def without_comment(line: str) -> str:
    return line.split("#", 1)[0].strip()


def commands(lines: list) -> list:
    """Shell commands of a block: comment lines dropped, `\\` continuations joined."""
    out, current = [], ""
    for line in lines:
        if line.lstrip().startswith("#") and not current:
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        out.append(current.strip())
        current = ""
    return out


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def run_shell(cmd: str, timeout: int = 300) -> subprocess.CompletedProcess:
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"documented command failed: {cmd}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out


@pytest.fixture(scope="module")
def readme_broker():
    """The broker as the README's set-up starts it; yields the ./data it writes."""
    setup = shell_block("## Set up")
    run = [without_comment(line) for line in setup if line.startswith("cargo run")]
    assert run == ["cargo run --release"], f"README's set-up no longer starts with cargo run --release: {setup}"
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
        yield data
        assert broker.poll() is None, f"the README's broker exited with {broker.returncode} during the examples"
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


def test_readme_set_up_and_kcat_example_run_as_written(readme_broker):
    kcat = shell_block("## Try it with kcat")
    assert any("kcat -C" in line for line in kcat), kcat
    for line in kcat:
        cmd = without_comment(line)
        out = run_shell(cmd, timeout=120)
        want = line.split("#", 1)[1].strip() if "#" in line else None
        if want is not None and want.isdigit():
            assert out.stdout.strip() == want, f"{cmd}: printed {out.stdout.strip()!r}, README says {want}"
    assert (readme_broker / "t-0").is_dir(), "the README's topic is not stored under ./data"


def test_docs_transaction_example_runs_as_written(readme_broker):
    block = shell_block("## Transactions", DOCS / "compatibility.md", lang="")
    assert block[0].startswith(".venv/bin/python"), block
    out = run_shell("\n".join(block) + "\n", timeout=180)
    # read_committed sees the committed record, exactly once.
    assert out.stdout.splitlines().count("exactly once") == 1, out.stdout[-2000:]


def test_docs_gregor_perf_examples_run_as_written(readme_broker):
    cmds = commands(shell_block("## Load generator", DOCS / "benchmarks.md"))
    assert [c.split()[:2] for c in cmds] == [["target/release/gregor-perf", "produce"],
                                            ["target/release/gregor-perf", "consume"],
                                            ["target/release/gregor-perf", "end-to-end"]], cmds
    results = []
    for cmd in cmds:
        out = run_shell(cmd, timeout=600)
        line = out.stdout.strip().splitlines()[-1]
        results.append(dict(kv.split("=", 1) for kv in line.split() if "=" in kv))
    produced, consumed, e2e = results
    # docs/benchmarks.md: 1M records produced, read back from the beginning, 50,000 end to end.
    assert produced.get("records") == "1000000", produced
    assert consumed.get("records") == "1000000", consumed
    assert e2e.get("records") == "50000", e2e


# Paths the docs name that the scripts create when they run.
CREATED_BY_SCRIPTS = {"fuzz/corpus/", "fuzz/campaign-crashes/", "fuzz/wire-crashes/"}
# Keys the docs name that are client settings, not the broker's.
CLIENT_SETTINGS = {"client.rack", "transaction.timeout.ms", "group.instance.id"}
FILE_SUFFIXES = (".yml", ".yaml", ".toml", ".json", ".md", ".py", ".sh", ".properties", ".rs")


def test_docs_name_only_paths_scripts_and_keys_that_exist():
    src = "\n".join(p.read_text() for p in (ROOT / "src").rglob("*.rs"))
    problems = []
    for doc in doc_files():
        text = doc.read_text()
        name = doc.relative_to(ROOT)
        for m in re.finditer(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            if not (doc.parent / m.group(1)).exists():
                problems.append(f"{name}: link to missing {m.group(1)}")
        for m in re.finditer(r"(?<![\w/.])((?:src|scripts|compat|protocol-tests|config|bench|fuzz|docker|docs|vendor|\.ci)"
                             r"/[\w./-]*)", text):
            path = m.group(1).rstrip(".")
            if "<" in text[m.end():m.end() + 1] or path in CREATED_BY_SCRIPTS or path.startswith("fuzz/target"):
                continue
            if not (ROOT / path).exists():
                problems.append(f"{name}: names missing {path}")
            elif (path.startswith("scripts/") and "." not in Path(path).name and (ROOT / path).is_file()
                  and not os.access(ROOT / path, os.X_OK)):
                problems.append(f"{name}: {path} is not executable")
        for m in re.finditer(r"`([a-z][a-z0-9_-]*(?:\.[a-z0-9_-]+)+)(?:=[^`]*)?`", text):
            key = m.group(1)
            if key.endswith(FILE_SUFFIXES) or key in CLIENT_SETTINGS:
                continue
            if key not in src:
                problems.append(f"{name}: config key `{key}` appears nowhere in src/")
    assert not problems, "\n".join(problems)
