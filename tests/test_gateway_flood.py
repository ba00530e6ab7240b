"""A slow-connection flood against the gateway, on a real HAProxy on 127.0.0.1 (issue #18 item 4).

The flood comes from another loopback source address (127.0.0.2; all of 127/8 is loopback on Linux), the
well-behaved client from 127.0.0.1: per-source limits are what the test exercises.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import time

import pytest

from components.gateway_config import ClientLimits, StaticServers, env_name, render_gateway_config
from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import HaproxyProcess, free_port, haproxy_binary, lua_path, pod_ca_dir, require_haproxy, no_recorder
from tests.test_gateway import KEYS, body

LIMITS = ClientLimits(max_conn_per_source=10, max_requests_per_source_10s=30, header_timeout_s=3)
FLOOD = 80  # trickling connections: more than the gateway's 60


@pytest.fixture(scope="module")
def gw(planned_stacks, tmp_path_factory):
    require_haproxy()
    spec = planned_stacks["prod"][1]
    ups = {n: FakeUpstream(n).start() for n in ("floor", "burst")}
    workdir = tmp_path_factory.mktemp("gw")
    ports = {e.name: free_port() for e in spec.endpoints if e.gated}
    rendered = render_gateway_config(
        spec, quality_servers=no_recorder(), burst_urls={n: f"http://{ups['burst'].address}" for n in ("assist", "autocomplete")},
        floor_servers={e.name: StaticServers((ups["floor"].address,)) for e in spec.endpoints},
        canary_servers={e.name: StaticServers((f"127.0.0.1:{free_port()}",)) for e in spec.endpoints},
        binds={k: f"127.0.0.1:{p}" for k, p in ports.items()},
        shadow_binds={k: f"127.0.0.1:{free_port()}" for k in ports},
        stats_bind=f"127.0.0.1:{free_port()}", lua_path=lua_path(workdir), ca_path=str(pod_ca_dir(workdir / "ca")),
        max_connections=60, client_limits=LIMITS,
    )
    env = {var: f"v-{key}" for var, key in rendered.secret_env.items()}
    env[env_name("assist", "acme-api-key")] = KEYS["acme"]
    proc = HaproxyProcess(rendered, workdir, env, list(ports.values()))
    yield ports["assist"], proc
    proc.stop()
    for u in ups.values():
        u.stop()


def ask(port: int, source: str = "127.0.0.1", timeout_s: float = 3.0, request_id: str | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s, source_address=(source, 0))
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body()).encode(),
                     headers={"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": "application/json",
                              **({"X-Request-Id": request_id} if request_id else {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def open_flood(port: int, n: int, source: str) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.bind((source, 0))
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    select.select([], socks, [], 2.0)
    for s in socks:
        try:
            s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n")
        except OSError:
            pass
    return socks


def closed(s: socket.socket) -> bool:
    """The gateway closed this connection (after its 408 for a timed-out head, if it sent one)."""
    try:
        while True:
            data = s.recv(65536)
            if data == b"":
                return True
            if not data.startswith(b"HTTP/1.1 408"):
                raise AssertionError(f"a trickler got an answer: {data[:80]!r}")
    except BlockingIOError:
        return False
    except OSError:
        return True


def trickle(socks: list[socket.socket]) -> None:
    for s in socks:
        try:
            s.send(b"X-T: 1\r\n")
        except OSError:
            pass


def test_a_trickling_flood_from_one_client_leaves_room_for_everyone_else(gw):
    port, proc = gw
    flood = open_flood(port, FLOOD, "127.0.0.2")
    try:
        trickle(flood)
        # the flooding client holds at most its 10; the rest of its connections are refused as they are accepted
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline and sum(closed(s) for s in flood) < FLOOD - LIMITS.max_conn_per_source:
            time.sleep(0.05)
        assert sum(closed(s) for s in flood) >= FLOOD - LIMITS.max_conn_per_source
        # a well-behaved client is answered at once, not after the tricklers' header timeout (3 s; before the
        # fix every slot was taken and it waited for the old 10 s timeout): its socket timeout is 2 s
        status, headers, _ = ask(port, timeout_s=2.0)
        assert status == 200 and headers["x-served-by"] in ("floor", "burst")
        trickle(flood)
        # the tricklers it kept are dropped once their header time is up, though they keep sending
        deadline = time.monotonic() + LIMITS.header_timeout_s + 3
        while time.monotonic() < deadline and not all(closed(s) for s in flood):
            time.sleep(0.25)
            trickle(flood)
        assert all(closed(s) for s in flood)
    finally:
        for s in flood:
            s.close()


def test_request_starts_per_client_are_rate_limited_with_retry_after(gw):
    port, _ = gw
    statuses = []
    for _ in range(LIMITS.max_requests_per_source_10s + 8):
        status, headers, content = ask(port, source="127.0.0.3", request_id=f"flood-{len(statuses)}")
        statuses.append(status)
        assert headers["x-request-id"] == f"flood-{len(statuses) - 1}"  # the client's id back, refused or not
        if status == 429:
            assert headers["retry-after"] == "10" and json.loads(content)["error"]["type"] == "rate_limit_error"
    assert statuses.count(200) == LIMITS.max_requests_per_source_10s and statuses.count(429) == 8
    assert ask(port, source="127.0.0.4")[0] == 200  # another client is not affected


@pytest.mark.parametrize("source, expect", [
    ("proxy_protocol", ["accept-proxy", "tcp-request connection track-sc0 src"]),
    ("xff", ["http-request track-sc0 req.hdr_ip(x-forwarded-for,-1)", "sc0_conn_cur gt 400"]),
])
def test_client_source_behind_a_load_balancer_is_configurable_and_haproxy_accepts_it(
        planned_stacks, tmp_path, source, expect):
    require_haproxy()
    spec = planned_stacks["prod"][1]
    r = render_gateway_config(
        spec, quality_servers=no_recorder(), burst_urls={"assist": "https://a.modal.run", "autocomplete": "https://b.modal.run"},
        floor_servers={e.name: StaticServers(("127.0.0.1:1",)) for e in spec.endpoints},
        canary_servers={"assist": StaticServers(("127.0.0.1:2",))},
        lua_path=lua_path(tmp_path), ca_path=str(pod_ca_dir(tmp_path / "ca")), client_limits=ClientLimits(source=source))
    cfg = r.files["haproxy.cfg"]
    for line in expect:
        assert line in cfg
    for name, text in r.files.items():
        (tmp_path / name).write_text(text)
    env = {var: f"t-{key}" for var, key in r.secret_env.items()}
    check = subprocess.run([haproxy_binary(), "-c", "-f", str(tmp_path / "haproxy.cfg")], env=env,
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    with pytest.raises(ValueError, match="ClientLimits.source='forwarded'"):
        render_gateway_config(spec, quality_servers=no_recorder(), burst_urls={"assist": "https://a", "autocomplete": "https://b"},
                              floor_servers={e.name: StaticServers(("127.0.0.1:1",)) for e in spec.endpoints},
                              client_limits=ClientLimits(source="forwarded"))


def test_busy_endpoints_together_cannot_take_the_probes_room(planned_stacks, tmp_path):
    """HAProxy's global maxconn is one pool with no per-listener reserve: when every endpoint frontend had
    max_connections of its own, three endpoints each under their limit filled it, the stats listener stopped
    accepting, and the kubelet's probes would have restarted every pod with its streams. The endpoints' frontends
    now split max_connections (connection_shares) and the global pool holds them, the loopback frontends and the
    probes' room: with every endpoint frontend full, from many sources each under its per-source limit,
    /healthz still answers."""
    import re

    from components.gateway_config import STATS_CONNECTIONS, connection_shares, gated_endpoints

    require_haproxy()
    spec = planned_stacks["prod"][1]
    eps = gated_endpoints(spec)
    ports = {e.name: free_port() for e in eps}
    stats = free_port()
    total = 40
    rendered = render_gateway_config(
        spec, quality_servers=no_recorder(), burst_urls={e.name: None for e in eps},
        floor_servers={e.name: StaticServers(("127.0.0.1:1",)) for e in eps},
        canary_servers={e.name: StaticServers(("127.0.0.1:1",)) for e in eps},
        binds={k: f"127.0.0.1:{p}" for k, p in ports.items()}, shadow_binds={k: f"127.0.0.1:{free_port()}" for k in ports},
        stats_bind=f"127.0.0.1:{stats}", lua_path=lua_path(tmp_path), ca_path=str(pod_ca_dir(tmp_path / "ca")),
        max_connections=total, client_limits=ClientLimits(max_conn_per_source=4),
    )
    cfg = rendered.files["haproxy.cfg"]
    shares = connection_shares(eps, total)
    assert sum(shares.values()) == total and all(v >= 1 for v in shares.values())
    # every listener's maxconn fits in the global one with the probes' room left
    glob = int(re.search(r"^global\n(?:    .*\n)*?    maxconn (\d+)", cfg, re.M).group(1))
    listeners = [int(m) for m in re.findall(r"^frontend [^\n]+\n(?:    [^\n]*\n)*?    maxconn (\d+)", cfg, re.M)]
    assert sum(listeners) == glob and glob - sum(listeners[1:]) == STATS_CONNECTIONS  # the stats frontend first
    env = {var: f"v-{key}" for var, key in rendered.secret_env.items()}
    proc = HaproxyProcess(rendered, tmp_path, env, list(ports.values()) + [stats])
    socks = []
    try:
        src = 2
        # each endpoint frontend filled to the maxconn it was rendered with, four connections per source
        blocks = re.findall(r"^frontend [^\n]+\n((?:    [^\n]*\n)*)", cfg, re.M)
        rendered_max = {int(re.search(r"bind 127\.0\.0\.1:(\d+)", b).group(1)): int(re.search(r"maxconn (\d+)", b).group(1))
                        for b in blocks if re.search(r"bind 127\.0\.0\.1:(\d+)", b)}
        for name, port in ports.items():
            assert rendered_max[port] == shares[name]
            for i in range(rendered_max[port]):
                if i % 4 == 0:
                    src += 1
                s = socket.socket()
                s.bind((f"127.0.0.{src}", 0))
                s.connect(("127.0.0.1", port))
                socks.append(s)
        time.sleep(0.5)
        conn = http.client.HTTPConnection("127.0.0.1", stats, timeout=3)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        for s in socks:
            s.close()
        proc.stop()
