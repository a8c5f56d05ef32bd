"""Compiles and runs compat/java/GregorCompat.java against the Java client jars.

Jars: GREGOR_JAVA_LIB (default <repo>/.cache/java-lib, filled by scripts/test from the PyPI
wheel shigawire-apache-flink-libraries==2.0.0.post1).
"""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIB = Path(os.environ.get("GREGOR_JAVA_LIB", REPO / ".cache" / "java-lib"))
JARS = ["kafka-clients.jar", "slf4j-api.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar"]
SRC = HERE / "java"


def compile_client() -> tuple:
    """(classpath, output dir): the compiled compat/java classes and the client jars."""
    missing = [j for j in JARS if not (LIB / j).exists()]
    assert not missing, (f"Java client jars missing from {LIB}: {missing}. scripts/test downloads them "
                         f"(pip download shigawire-apache-flink-libraries==2.0.0.post1); set GREGOR_SKIP_JAVA=1 to skip")
    javac = shutil.which("javac")
    assert javac, "javac not found (install a JDK, or GREGOR_SKIP_JAVA=1)"
    out = Path(tempfile.mkdtemp(prefix="gregor-java-"))
    cp = ":".join(str(LIB / j) for j in JARS)
    sources = sorted(str(f) for f in SRC.glob("*.java"))
    p = subprocess.run([javac, "-d", str(out), "-cp", cp, *sources], capture_output=True, timeout=300)
    assert p.returncode == 0, f"javac failed:\n{p.stderr.decode(errors='replace')}"
    return f"{out}:{cp}", out


def run(cp: str, bootstrap: str, tmp: Path, *args: str, timeout: float = 300, replication_factor: int = 1,
        client_config: Path = None, main_class: str = "GregorCompat") -> str:
    """Runs one scenario of `main_class`; asserts it exits 0 and prints "OK <scenario>".
    client_config: a properties file of client settings (security.protocol, sasl.*, ssl.*)."""
    tmp.mkdir(parents=True, exist_ok=True)
    extra = [f"-Dgregor.client.config={client_config}"] if client_config else []
    cmd = ["java", "-Xmx512m", f"-Djava.io.tmpdir={tmp}", f"-Dgregor.replication.factor={replication_factor}",
           *extra, "-cp", cp, main_class, bootstrap, *args]
    p = subprocess.run(cmd, capture_output=True, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0, (f"{main_class} {' '.join(args)} exited {p.returncode}\n"
                               f"stdout:\n{out[-3000:]}\nstderr:\n{err[-6000:]}")
    assert f"OK {args[0]}" in out
    return out
