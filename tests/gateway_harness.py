"""Run the rendered gateway config in a real HAProxy on 127.0.0.1 (tests and benchmark)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from components.gateway_config import CONFIG_FILE, HAPROXY_IMAGE, LUA_FILE, HaproxyImage, RenderedGateway



def haproxy_binary() -> str | None:
    """The HAProxy the gateway tests run: `dev.py test` builds the image's release line (3.0) from Debian's
    source into .cache/ (Debian bookworm packages only 2.6); else one on PATH."""
    from dev import HAPROXY_BINARY  # the build's one stated place (dev.py imports only the standard library)

    if HAPROXY_BINARY.exists():
        return str(HAPROXY_BINARY)
    found = shutil.which("haproxy")
    # another release line (Debian bookworm's 2.6) is not the gateway's: the tests would check the wrong proxy
    if found and local_haproxy_major_minor(found) != HAPROXY_IMAGE.major_minor:
        return None
    return found


def require_haproxy() -> str:
    """Fail under CI (haproxy must be installed there), skip elsewhere, with the reason."""
    import pytest

    path = haproxy_binary()
    if path is None:
        msg = (f"HAProxy {HAPROXY_IMAGE.major_minor} not found (python3 dev.py test builds it as root; else put "
               f"haproxy {HAPROXY_IMAGE.major_minor} on PATH); the gateway tests run a real HAProxy")
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def local_haproxy_major_minor(binary: str) -> str:
    """major.minor of `haproxy -v` ("HAProxy version 2.6.12-1+deb12u4 ..." -> "2.6")."""
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    if m is None:
        raise RuntimeError(f"cannot read a version from `{binary} -v`: {out[:200]!r}")
    return f"{m.group(1)}.{m.group(2)}"


def pod_ca_dir(dest: Path, image: HaproxyImage = HAPROXY_IMAGE) -> Path:
    """A CA directory holding what the pod's `image.ca_dir` holds, for `ca_path` in tests.

    Empty when the image has no trust store. Otherwise the certificates of the same Debian package
    on this host, laid out as its update-ca-certificates does: one .pem per CA and the
    ca-certificates.crt bundle (haproxy loads the .pem/.crt files of a directory, not hash links). The
    host is bookworm and the image trixie: the package is the same, its CA list a release older.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if image.trust_store_package is None:
        return dest
    listed = subprocess.run(["dpkg", "-L", image.trust_store_package], capture_output=True, text=True, timeout=30)
    crts = sorted(Path(p) for p in listed.stdout.split() if p.endswith(".crt") and p.startswith("/usr/share/"))
    if listed.returncode != 0 or not crts:
        raise RuntimeError(f"Debian package {image.trust_store_package} is not installed here: the tests "
                           f"need the CAs the image {image.tag} has (apt-get install -y {image.trust_store_package})")
    bundle = []
    for crt in crts:
        text = crt.read_text()
        (dest / f"{crt.stem}.pem").write_text(text)
        bundle.append(text if text.endswith("\n") else text + "\n")
    (dest / "ca-certificates.crt").write_text("".join(bundle))
    return dest


_GIVEN_PORTS: set[int] = set()


def free_port() -> int:
    """A free loopback port not handed out before in this process (the kernel may offer a just-closed
    port again: two frontends on one port would then share it through SO_REUSEPORT)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


def no_recorder():
    """Quality recorder servers where nothing listens: a stack that samples quality renders with them, and
    its sampled exchanges are dropped (counted) as when the recorder is down (tests/test_quality_sampling.py)."""
    from components.gateway_config import StaticServers

    return StaticServers((f"127.0.0.1:{free_port()}",))


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

    def __init__(self, rendered: RenderedGateway, workdir: Path, env: dict[str, str], wait_ports: list[int],
                 prefix: tuple[str, ...] = (), binary: str | None = None):
        """prefix: a command to run haproxy under (the benchmark's `taskset -c 0 chrt -f 50`); binary: another
        haproxy than the tests' (the benchmark's `--compare-haproxy`)."""
        self.workdir = workdir
        for name, text in rendered.files.items():
            (workdir / name).write_text(text)
        self.log_path = workdir / "haproxy.log"
        self._log = open(self.log_path, "w")
        binary = binary or haproxy_binary() or "haproxy"
        check = subprocess.run([binary, "-c", "-q", "-f", str(workdir / CONFIG_FILE)],
                               env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected the rendered config:\n{check.stdout}{check.stderr}")
        self.proc = subprocess.Popen([*prefix, binary, "-db", "-f", str(workdir / CONFIG_FILE)],
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


class SilentServer:
    """Accepts connections, reads the request and never answers (until stopped): a stalled rollout candidate,
    a slow S3 endpoint or a stalled quality recorder. `requests` counts PUTs and POSTs (uploads, record posts,
    mirrored requests), not health checks; `address` is host:port, `url` the same over http."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.url = f"http://{self.address}"
        self.conns: list[socket.socket] = []
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            c.settimeout(2)
            try:
                if c.recv(65536).startswith((b"PUT", b"POST")):
                    self.requests += 1
            except OSError:
                pass
            self.conns.append(c)  # held open, never answered

    def open_connections(self) -> int:
        alive = 0
        for c in self.conns:
            try:
                c.setblocking(False)
                alive += c.recv(1, socket.MSG_PEEK) != b""  # b"" = the peer closed
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        return alive

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=2)
        for c in self.conns:
            c.close()
        self.sock.close()


def lua_path(workdir: Path) -> str:
    return str(workdir / LUA_FILE)


FAULT_LUA_FILE = "test_fault.lua"
# Test only, never rendered for a pod: loaded before the gateway's Lua, it wraps llm_gate so that a request carrying
# X-Test-Gate-Fault raises inside the gate where it stores the stamp (after its Idempotency-Key claim and
# txn.stream): the runtime error a defect in the gate would raise, at a point where it has already changed things.
FAULT_LUA = """
local register = core.register_action
core.register_action = function(name, where, fn, ...)
  if name ~= "llm_gate" then return register(name, where, fn, ...) end
  return register(name, where, function(txn, ...)
    if not txn.f:req_fhdr("x-test-gate-fault") then return fn(txn, ...) end
    local proxy = setmetatable({}, { __index = function(_, k)
      local v = txn[k]
      if type(v) ~= "function" then return v end
      return function(_, ...) return v(txn, ...) end
    end })
    proxy.set_var = function(_, var, value)
      if var == "txn.gate_prefix" then error("injected fault") end
      return txn:set_var(var, value)
    end
    return fn(proxy, ...)
  end, ...)
end
"""


def instrumented(rendered: RenderedGateway, workdir: Path, global_lines: tuple[str, ...] = (),
                 gate_fault: bool = False, idem_cap: dict[str, tuple[int, int]] | None = None) -> RenderedGateway:
    """The rendered gateway with test-only changes: `global_lines` added to the global section (e.g.
    tune.lua.forced-yield), the gate fault above loaded when `gate_fault`, and tenants' Idempotency-Key caps and
    claim expiries (the gate's arguments; the filter's renewals keep theirs) lowered, {tenant: (cap, ttl ms)}, so a
    test reaches a cap with HTTP/1 connections under the frontend's maxconn and sees claims expire in a second."""
    cfg = rendered.files[CONFIG_FILE]
    load = f"    lua-load-per-thread {lua_path(workdir)}"
    assert load in cfg, "the rendered config no longer loads its Lua file this way"
    extra = [*global_lines]
    files = dict(rendered.files)
    if gate_fault:
        files[FAULT_LUA_FILE] = FAULT_LUA
        extra.append(f"    lua-load-per-thread {workdir / FAULT_LUA_FILE}")
    cfg = cfg.replace(load, "\n".join([*extra, load]))
    for tenant, (cap, ttl_ms) in (idem_cap or {}).items():
        cfg, n = re.subn(rf"(lua\.llm_gate \S+ \S+ \S+/{re.escape(tenant)} )\d+ \d+ ", rf"\g<1>{cap} {ttl_ms} ", cfg)
        assert n > 0, f"no gate for tenant {tenant}"
    files[CONFIG_FILE] = cfg
    return RenderedGateway(files=files, secret_env=rendered.secret_env, ports=rendered.ports)


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
