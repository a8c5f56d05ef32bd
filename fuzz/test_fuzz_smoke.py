"""Fuzz smoke (suite `fuzz` of scripts/test): a short run of every libFuzzer target over its
committed seeds, and of the black-box wire fuzzer against a standalone broker and a
three-broker cluster. Long runs: see docs/fuzzing.md.

The targets are built by scripts/fuzz-build (scripts/test does it before this suite);
GREGOR_FUZZ_SECONDS sets each target's run (default 6 s).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ["frame_codec", "request_decode", "record_batch", "log_recovery", "znode_json", "broker_request"]
SECONDS = int(os.environ.get("GREGOR_FUZZ_SECONDS", "6"))


def target_dir() -> Path:
    triple = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    host = re.search(r"^host: (\S+)", triple, re.M).group(1)
    return ROOT / "fuzz" / "target" / host / "release"


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_smoke(target, tmp_path):
    binary = target_dir() / target
    assert binary.exists(), f"{binary} missing: run scripts/fuzz-build"
    # A scratch corpus seeded from the committed one, so the run's finds are not committed.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for seed in (ROOT / "fuzz" / "seeds" / target).iterdir():
        (corpus / seed.name).write_bytes(seed.read_bytes())
    proc = subprocess.run(
        [str(binary), str(corpus), f"-max_total_time={SECONDS}", "-timeout=2", "-rss_limit_mb=2048",
         "-malloc_limit_mb=1024", f"-artifact_prefix={tmp_path}/", "-print_final_stats=1"],
        capture_output=True, text=True, timeout=SECONDS + 120)
    out = proc.stderr
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", out)
    speed = re.search(r"stat::average_exec_per_sec:\s*(\d+)", out)
    print(f"{target}: {runs.group(1) if runs else '?'} executions, {speed.group(1) if speed else '?'}/s")
    artifacts = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-", "leak-"))]
    assert proc.returncode == 0 and not artifacts, (
        f"{target} found a problem (exit {proc.returncode}, artifacts {artifacts}):\n" + out[-4000:])
    assert runs and int(runs.group(1)) > len(list(corpus.iterdir())), f"{target} ran nothing past its seeds:\n{out[-2000:]}"


@pytest.mark.parametrize("mode,frames", [("standalone", 20000), ("cluster", 20000)])
def test_wire_fuzz_smoke(mode, frames):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wire_fuzz.py"), "run", "--mode", mode, "--frames", str(frames)],
        capture_output=True, text=True, timeout=600)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("wire-fuzz")]
    print("\n".join(lines))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
