"""Bounded load on loopback: 200 concurrent streams through the gateway, none lost or duplicated.

Runs the prod spec's real thresholds (assist: 49 in flight per floor replica, two fake replicas), so
the floor fills and the rest overflows to the fake burst upstream. Latency figures: benchmarks/.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from components.gateway_config import StaticServers, env_name, floor_capacity, render_gateway_config
from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import HaproxyProcess, free_port, lua_path, pod_ca_dir, require_haproxy, stream_once, no_recorder

CONCURRENCY = 200


@pytest.fixture
def prod_gateway(planned_stacks, tmp_path):
    require_haproxy()
    spec = planned_stacks["prod"][1]
    ups = {n: FakeUpstream(n).start() for n in ("floor1", "floor2", "burst")}
    floors = StaticServers((ups["floor1"].address, ups["floor2"].address))
    ports = {e.name: free_port() for e in spec.endpoints if e.tier != "managed_api"}
    rendered = render_gateway_config(
        spec, quality_servers=no_recorder(),
        burst_urls={"assist": f"http://{ups['burst'].address}", "autocomplete": f"http://{ups['burst'].address}"},
        floor_servers={e.name: floors for e in spec.endpoints},
        # prod's assist is in shadow: its mirrors (5%) go to a candidate that refuses them, off the users' path
        canary_servers={e.name: StaticServers((f"127.0.0.1:{free_port()}",)) for e in spec.endpoints},
        binds={k: f"127.0.0.1:{p}" for k, p in ports.items()},
        shadow_binds={k: f"127.0.0.1:{free_port()}" for k in ports},
        stats_bind=f"127.0.0.1:{free_port()}",
        lua_path=lua_path(tmp_path),
        ca_path=str(pod_ca_dir(tmp_path / "ca")),
        max_connections=2000,
    )
    env = {var: f"value-of-{key}" for var, key in rendered.secret_env.items()}
    env[env_name("assist", "acme-api-key")] = "load-key"
    proc = HaproxyProcess(rendered, tmp_path, env, list(ports.values()))
    yield spec, ports["assist"], ups
    proc.stop()
    for u in ups.values():
        u.stop()


def test_200_concurrent_streams_complete_with_none_lost(prod_gateway):
    spec, port, ups = prod_gateway
    payload = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    rids = [str(uuid.uuid4()) for _ in range(CONCURRENCY)]

    async def run():
        return await asyncio.gather(*[
            stream_once(port, payload, {"Authorization": "Bearer load-key", "X-Request-Id": rid,
                                        "X-Session-Id": f"session-{i % 50}", "X-Fake-Chunks": "20",
                                        "X-Fake-Interval-Ms": "25"}, timeout_s=30)
            for i, rid in enumerate(rids)])

    results = asyncio.run(run())
    lost = [rid for rid, r in zip(rids, results) if r[0] != 200 or b"data: [DONE]" not in r[3]]
    assert lost == []
    seen = [r.request_id for u in ups.values() for r in u.log.completions()]
    assert sorted(seen) == sorted(rids)  # every request reached exactly one upstream, exactly once
    threshold = spec.endpoint("assist").gateway.overflow_inflight_per_replica
    on_floor = len(ups["floor1"].log.completions()) + len(ups["floor2"].log.completions())
    assert on_floor == floor_capacity(threshold, 2)  # the floor took what it had room for ...
    assert len(ups["burst"].log.completions()) == CONCURRENCY - on_floor  # ... and burst the rest
