"""scripts/check-module-cycles, the CI check that no new import cycle appears between the crate's
top-level modules: run on small crates written here, and on this repository with its allow
list as CI runs it. No broker needed."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check-module-cycles"


def crate(tmp_path: Path, files: dict) -> Path:
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


def check(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


LIB = "pub mod log;\npub mod api;\npub mod txn;\n"


def test_a_crate_without_cycles_passes(tmp_path):
    src = crate(tmp_path, {
        "lib.rs": LIB,
        "api/mod.rs": "use crate::{log::Log, txn};\nmod produce;\n",
        "api/produce.rs": "fn f() { crate::txn::begin(); }\n",
        "txn.rs": "use crate::log::Log;\n",
        "log/mod.rs": "// crate::api is only named in this comment\n"
                      "const S: &str = \"crate::txn in a string\";\n"
                      "#[cfg(test)]\nmod tests {\n    use crate::api;\n}\n"
                      "#[cfg(test)]\nmod more_tests;\n",
        "log/more_tests.rs": "use crate::txn;\n",
    })
    out = check("--src", src)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no cycle" in out.stdout
    edges = check("--src", src, "--edges").stdout
    assert "api -> log" in edges and "api -> txn" in edges and "txn -> log" in edges, edges
    assert "log ->" not in edges, edges


def test_a_cycle_is_printed_and_fails_unless_allowed(tmp_path):
    src = crate(tmp_path, {
        "lib.rs": LIB,
        "api/mod.rs": "use crate::txn;\n",
        "txn.rs": "use crate::log::Log;\n",
        # The new edge: log reaches up into txn, closing log -> txn -> log.
        "log/mod.rs": "use crate::{\n    txn::producer_state::AbortedTxn,\n};\n",
    })
    out = check("--src", src)
    assert out.returncode == 1, out.stdout
    assert "log, txn" in out.stdout and "log -> txn" in out.stdout and "txn -> log" in out.stdout, out.stdout

    allow = tmp_path / "allow"
    allow.write_text("# known\ntxn -> log\n")
    out = check("--src", src, "--allow", allow)
    assert out.returncode == 1, out.stdout
    assert "FAIL: 1 import edges" in out.stdout and "log -> txn" in out.stdout, out.stdout

    allow.write_text("txn -> log\nlog -> txn\napi -> txn\n")
    out = check("--src", src, "--allow", allow)
    assert out.returncode == 0, out.stdout
    # api -> txn is on no cycle: --shrink drops it and keeps the rest.
    assert "no longer on a cycle" in out.stdout and "api -> txn" in out.stdout, out.stdout
    assert check("--src", src, "--shrink", allow).returncode == 0
    assert allow.read_text().split() == "txn -> log log -> txn".split()


def test_this_repository_has_no_import_cycle():
    out = check()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no cycle" in out.stdout, out.stdout


def test_report_prints_the_structure_table():
    out = check("--report")
    assert out.returncode == 0, out.stderr
    for row in ("`Broker` fields", "`impl Broker`", "files importing `crate::broker`", "import cycles",
                "files over 800 lines"):
        assert row in out.stdout, out.stdout
