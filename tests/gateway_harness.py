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
        # haproxy writes the file through its own descriptor; nothing of ours to flush
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


async def stream_once(port: int, payload: bytes, headers: dict[str, str], timeout_s: float = 30.0):
    """One streamed POST over a raw asyncio connection.

    Returns (status, seconds to the first SSE event, seconds to the end, body bytes); status 0 when the
    connection failed or broke before a complete response.
    """
    import asyncio

    t0 = time.perf_counter()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(payload)}\r\nConnection: close\r\n{head}\r\n").encode() + payload
    first = None
    data = b""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(req)
                await writer.drain()
                while True:
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    data += chunk
                    if first is None and b"data: " in data:
                        first = time.perf_counter() - t0
                    if data.endswith(b"0\r\n\r\n"):
                        break
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return 0, None, time.perf_counter() - t0, data
    total = time.perf_counter() - t0
    status = int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else 0
    if not data.endswith(b"0\r\n\r\n"):
        status = 0
    return status, first, total, data
