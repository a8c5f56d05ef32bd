"""Certificates for the TLS tests, made with the openssl CLI in a temp dir: a CA, a broker
certificate for 127.0.0.1/localhost, client certificates (trusted, expired, from another CA)
and an encrypted PKCS#8 copy of the broker key."""
import subprocess
from pathlib import Path


def _run(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, timeout=60)
    assert p.returncode == 0, f"openssl {' '.join(args)} failed: {p.stderr.decode(errors='replace')}"


def _ca(d: Path, name: str):
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
         "-days", "30", "-subj", f"/CN={name}", cwd=d)


def _leaf(d: Path, name: str, subj: str, ca: str, days: str = "30", san: str = "", expired: bool = False):
    _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=d)
    ext = d / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE"]
    if san:
        lines.append(f"subjectAltName={san}")
    ext.write_text("\n".join(lines) + "\n")
    if expired:
        # A validity window wholly in the past: `openssl ca` can set both ends (x509 -req can't
        # before OpenSSL 3.4).
        (d / "index.txt").write_text("")
        (d / "serial").write_text("1000\n")
        (d / "ca.cnf").write_text("[ca]\ndefault_ca=c\n[c]\ndatabase=index.txt\nnew_certs_dir=.\nserial=serial\n"
                                  "default_md=sha256\npolicy=p\n[p]\ncommonName=supplied\n")
        _run("ca", "-batch", "-config", "ca.cnf", "-cert", f"{ca}.pem", "-keyfile", f"{ca}.key", "-in", f"{name}.csr",
             "-out", f"{name}.pem", "-startdate", "20200101000000Z", "-enddate", "20200201000000Z", "-notext",
             "-extfile", ext.name, cwd=d)
    else:
        _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", days, "-extfile", ext.name, cwd=d)


class Certs:
    def __init__(self, d: Path):
        d.mkdir(parents=True, exist_ok=True)
        self.dir = d
        _ca(d, "ca")
        _ca(d, "otherca")
        _leaf(d, "broker", "/CN=broker", "ca", san="IP:127.0.0.1,DNS:localhost")
        _leaf(d, "alice", "/C=US/O=Example/OU=eng/CN=alice", "ca")
        _leaf(d, "expired", "/CN=expired", "ca", expired=True)
        _leaf(d, "stranger", "/CN=stranger", "otherca")
        # The broker's keystore in one PEM file (key + chain), and the key encrypted (PKCS#8).
        (d / "broker-keystore.pem").write_text((d / "broker.key").read_text() + (d / "broker.pem").read_text())
        _run("pkcs8", "-topk8", "-in", "broker.key", "-out", "broker-enc.key", "-v2", "aes-256-cbc",
             "-passout", "pass:keypass", cwd=d)

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def text(self, name: str) -> str:
        return (self.dir / name).read_text()
