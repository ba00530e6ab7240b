"""Run the rendered gateway config in a real HAProxy on 127.0.0.1 (tests and benchmark)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from components.gateway_config import CONFIG_FILE, LUA_FILE, RenderedGateway


def haproxy_binary() -> str | None:
    return shutil.which("haproxy")


def require_haproxy() -> str:
    """Fail under CI (haproxy must be installed there), skip elsewhere, with the reason."""
    import pytest

    path = haproxy_binary()
    if path is None:
        msg = "haproxy not installed (apt-get install -y haproxy); the gateway tests run a real HAProxy"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout_s}s")


class HaproxyProcess:
    """One haproxy process running a rendered config from `workdir`; `stop()` always reaps it."""

    def __init__(self, rendered: RenderedGateway, workdir: Path, env: dict[str, str], wait_ports: list[int]):
        self.workdir = workdir
        for name, text in rendered.files.items():
            (workdir / name).write_text(text)
        self.log_path = workdir / "haproxy.log"
        self._log = open(self.log_path, "w")
        binary = haproxy_binary() or "haproxy"
        check = subprocess.run([binary, "-c", "-q", "-f", str(workdir / CONFIG_FILE)],
                               env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected the rendered config:\n{check.stdout}{check.stderr}")
        self.proc = subprocess.Popen([binary, "-db", "-f", str(workdir / CONFIG_FILE)],
                                     env={**os.environ, **env}, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            for p in wait_ports:
                wait_for_port(p)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"haproxy did not start:\n{self.log_path.read_text()}")

    def log_lines(self) -> list[str]:
        self._log.flush()
        return self.log_path.read_text().splitlines()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()


def lua_path(workdir: Path) -> str:
    return str(workdir / LUA_FILE)
