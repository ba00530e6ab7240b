"""Dev stack through a real HAProxy: serverless_only endpoints send everything to burst (with
Modal's proxy-auth), and the managed_api endpoint has no frontend at all."""

from __future__ import annotations

import pytest

from components.gateway_config import render_gateway_config
from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import HaproxyProcess, free_port, lua_path, pod_ca_dir, require_haproxy
from tests.test_gateway import body, post


@pytest.fixture
def dev_gateway(planned_stacks, tmp_path):
    require_haproxy()
    spec = planned_stacks["dev"][1]
    burst = FakeUpstream("burst").start()
    gated = [e.name for e in spec.endpoints if e.tier != "managed_api"]
    ports = {name: free_port() for name in gated}
    rendered = render_gateway_config(
        spec, burst_urls={name: f"http://{burst.address}" for name in gated}, floor_servers={},
        binds={k: f"127.0.0.1:{p}" for k, p in ports.items()}, stats_bind=f"127.0.0.1:{free_port()}",
        lua_path=lua_path(tmp_path), max_connections=500,
        ca_path=str(pod_ca_dir(tmp_path / "ca")))
    env = {var: f"dev-{key}" for var, key in rendered.secret_env.items()}
    proc = HaproxyProcess(rendered, tmp_path, env, list(ports.values()))
    yield spec, rendered, ports, burst, env
    proc.stop()
    burst.stop()


def test_serverless_only_goes_to_burst_and_managed_api_is_not_gated(dev_gateway):
    spec, rendered, ports, burst, env = dev_gateway
    assert {e.name for e in spec.endpoints if e.tier == "managed_api"}.isdisjoint(ports)
    assert "fe_autocomplete" not in rendered.files["haproxy.cfg"]
    key = env["GW_ASSIST_ACME_API_KEY"]
    status, headers, _, rid = post(ports["assist"], body(), key=key)
    assert status == 200 and headers["x-served-by"] == "burst"
    (rec,) = [r for r in burst.log.completions() if r.request_id == rid]
    assert rec.headers["modal-key"] == env["GW_MODAL_KEY"]
    assert rec.body["cache_salt"] == env["GW_ASSIST_ACME_CACHE_SALT"]


def test_burst_without_url_answers_json_503(planned_stacks, tmp_path):
    require_haproxy()
    spec = planned_stacks["dev"][1]
    gated = [e.name for e in spec.endpoints if e.tier != "managed_api"]
    ports = {name: free_port() for name in gated}
    rendered = render_gateway_config(
        spec, burst_urls={name: None for name in gated}, floor_servers={},
        binds={k: f"127.0.0.1:{p}" for k, p in ports.items()}, stats_bind=f"127.0.0.1:{free_port()}",
        lua_path=lua_path(tmp_path), max_connections=500,
        ca_path=str(pod_ca_dir(tmp_path / "ca")))
    env = {var: f"dev-{key}" for var, key in rendered.secret_env.items()}
    proc = HaproxyProcess(rendered, tmp_path, env, list(ports.values()))
    try:
        status, _, content, _ = post(ports["assist"], body(), key=env["GW_ASSIST_ACME_API_KEY"])
    finally:
        proc.stop()
    assert status == 503 and b'"code":503' in content
