"""Retry budget: once retries exceed the spec's share of requests, failures are no longer retried."""

from __future__ import annotations

import time

import pytest

from components.gateway_config import StaticServers, env_name, render_gateway_config
from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import HaproxyProcess, free_port, lua_path, pod_ca_dir, require_haproxy
from tests.test_gateway import KEYS, body, post


@pytest.fixture
def guard_gateway(planned_stacks, tmp_path):
    require_haproxy()
    spec = planned_stacks["prod"][1]
    ups = [FakeUpstream(f"guard{i}").start() for i in range(2)]
    ports = {e.name: free_port() for e in spec.endpoints if e.tier != "managed_api"}
    rendered = render_gateway_config(
        spec,
        burst_urls={"assist": f"http://{ups[0].address}", "autocomplete": f"http://{ups[0].address}"},
        floor_servers={e.name: StaticServers(tuple(u.address for u in ups)) for e in spec.endpoints},
        binds={k: f"127.0.0.1:{p}" for k, p in ports.items()},
        stats_bind=f"127.0.0.1:{free_port()}",
        lua_path=lua_path(tmp_path),
        ca_path=str(pod_ca_dir(tmp_path / "ca")),
        health_check_interval_ms=60000,
        max_connections=2000,
    )
    env = {"GW_MODAL_KEY": "k", "GW_MODAL_SECRET": "s"}
    env |= {var: f"value-of-{key}" for var, key in rendered.secret_env.items()}
    env[env_name("guard", "default-api-key")] = KEYS["default"]
    proc = HaproxyProcess(rendered, tmp_path, env, list(ports.values()))
    yield spec, ports["guard"], ups, proc
    proc.stop()
    for u in ups:
        u.stop()


def test_retries_stop_when_the_budget_is_spent(guard_gateway):
    spec, port, ups, proc = guard_gateway
    fraction = spec.endpoint("guard").gateway.retry_budget_fraction
    n = 40
    started = time.monotonic()
    for i in range(n):  # every first attempt fails before any byte: each would be retried once
        status, _, _, _ = post(port, body(), key=KEYS["default"],
                               headers={"X-Fake-Fail": "close-before-response", "X-Session-Id": f"s{i}"})
        assert status == 502
        time.sleep(0.02)
    elapsed_s = time.monotonic() - started
    attempts = sum(len(u.log.completions()) for u in ups)
    retries = attempts - n
    assert retries >= 1  # the budget allowed the first retries
    # Without a budget there would be n retries. With it: the allowance, plus what arrives during
    # one 250 ms sampling period before the budget notices (the request rate here is known).
    lag_allowance = int(n / elapsed_s * 0.25) + 1
    assert retries <= fraction * n + 1 + lag_allowance, f"{retries} retries for {n} requests in {elapsed_s:.2f}s"
    assert retries < n / 2
