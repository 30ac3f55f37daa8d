"""TLS fixture: local certificates (``openssl``) and raw ``redis-server`` processes with
``--port 0 --tls-port P`` (the launcher pings a plaintext port), one of them a sentinel of the
first, stopped by PID."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redlock.testing import find_redis_server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(name: str, cwd: Path) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=cwd)  # fmt: skip


def _leaf(name: str, ca: str, san: str, cwd: Path) -> None:
    (cwd / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=cwd)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
             "-out", f"{name}.crt", cwd=cwd)  # fmt: skip


def _start(
    cwd: Path, cert: str, sentinel_of: int | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """A TLS-only redis-server; ``sentinel_of``: a TLS-only sentinel monitoring the master
    on that TLS port as service ``tls-service`` (reaching it over TLS too)."""
    port = _free_port()
    tls = ["--tls-port", str(port), "--tls-cert-file", f"{cert}.crt",
           "--tls-key-file", f"{cert}.key", "--tls-ca-cert-file", "ca.crt",
           "--tls-auth-clients", "no"]  # fmt: skip
    if sentinel_of is None:
        args = [find_redis_server(), "--port", "0", "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(cwd), *tls]  # fmt: skip
    else:
        config = cwd / f"sentinel-{port}.conf"
        config.write_text(
            f"port 0\nbind 127.0.0.1\ndir {cwd}\ntls-replication yes\n"
            f"sentinel monitor tls-service 127.0.0.1 {sentinel_of} 1\n"
        )
        args = [find_redis_server(), str(config), "--sentinel", *tls]
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    context = ssl.create_default_context(cafile=str(cwd / "ca.crt"))
    context.check_hostname = False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            output = proc.stdout.read().decode() if proc.stdout else ""
            if proc.stdout is not None:
                proc.stdout.close()
            pytest.skip(f"redis-server has no TLS support here: {output[-300:]}")
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=1) as raw,
                context.wrap_socket(raw) as tls,
            ):
                tls.sendall(b"PING\r\n")
                if tls.recv(64).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError("TLS redis-server did not answer")


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A TLS node whose certificate is for 127.0.0.1, and one whose certificate names
    another host, both signed by ``ca``; ``other_ca`` signed neither. A TLS sentinel
    (``sentinel_port``) names the first as the master of ``tls-service``."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found")
    _ca("ca", tmp_path)
    _ca("other_ca", tmp_path)
    _leaf("server", "ca", "IP:127.0.0.1", tmp_path)
    _leaf("elsewhere", "ca", "DNS:wrong.example", tmp_path)
    procs = []
    try:
        proc, port = _start(tmp_path, "server")
        procs.append(proc)
        proc2, port2 = _start(tmp_path, "elsewhere")
        procs.append(proc2)
        proc3, port3 = _start(tmp_path, "server", sentinel_of=port)
        procs.append(proc3)
        yield {
            "port": port,
            "wrong_host_port": port2,
            "sentinel_port": port3,
            "certs": {"ca": str(tmp_path / "ca.crt"), "other_ca": str(tmp_path / "other_ca.crt")},
        }
    finally:
        for proc in procs:  # stopped by their own PIDs
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
