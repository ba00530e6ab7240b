"""Rollout at the gateway, on a real HAProxy on 127.0.0.1 (issue #16 items 3 and 4).

Shadow: a share of requests is mirrored to the candidate by a Lua task; the user's request is served by
the incumbent as if there were no shadow, whether the candidate is fast, stalled or dead, and mirrors
above the cap are skipped, never queued. Canary: a canary user's request goes to the incumbent when
every candidate replica is full or none is up, never to an error.
"""

from __future__ import annotations

import concurrent.futures as cf
import statistics
import time

import pytest

from components.gateway_config import StaticServers, render_gateway_config
from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import (HaproxyProcess, SilentServer, free_port, lua_path, no_recorder, pod_ca_dir,
                                  require_haproxy)
from tests.test_gateway import SALTS, body, post, secret_env, wait_until
from topology.spec import CanarySpec, ShadowSpec


def rollout_spec(spec, *, shadow=None, canary=None):
    eps = []
    for e in spec.endpoints:
        update = {"first_byte_timeout_s": 2, "inter_chunk_timeout_s": 1, "sse_heartbeat_s": 0.5}
        if e.name == "assist":
            update |= {"overflow_inflight_per_replica": 4, "shadow": shadow, "canary": canary}
        eps.append(e.model_copy(update={"gateway": e.gateway.model_copy(update=update)}))
    return spec.model_copy(update={"endpoints": tuple(eps)})


class Gateway:
    def __init__(self, spec, workdir, floors, burst, candidate: str | None, check_ms: int = 60000):
        self.port = free_port()
        ports = {"assist": self.port, "autocomplete": free_port(), "guard": free_port()}
        dead = f"127.0.0.1:{free_port()}"
        rendered = render_gateway_config(
            spec, quality_servers=no_recorder(),
            burst_urls={"assist": f"http://{burst}", "autocomplete": f"http://{dead}"},
            floor_servers={"assist": StaticServers(tuple(floors)), "autocomplete": StaticServers((dead,)),
                           "guard": StaticServers((dead,))},
            canary_servers={"assist": StaticServers((candidate,))} if candidate else {},
            binds={k: f"127.0.0.1:{p}" for k, p in ports.items()},
            shadow_binds={"assist": f"127.0.0.1:{free_port()}"},
            stats_bind=f"127.0.0.1:{free_port()}",
            lua_path=lua_path(workdir), ca_path=str(pod_ca_dir(workdir / "ca")),
            health_check_interval_ms=check_ms, max_connections=2000,
        )
        env = secret_env()
        self.cfg = rendered.files["haproxy.cfg"]
        self.proc = HaproxyProcess(rendered, workdir, env, list(ports.values()))

    def stop(self):
        self.proc.stop()


@pytest.fixture(scope="module")
def upstreams():
    require_haproxy()
    ups = {n: FakeUpstream(n).start() for n in ("floor1", "floor2", "burst", "candidate")}
    yield ups
    for u in ups.values():
        u.stop()


def _gateway(planned_stacks, tmp_path_factory, upstreams, candidate, **spec_kw):
    spec = rollout_spec(planned_stacks["prod"][1], **spec_kw)
    return Gateway(spec, tmp_path_factory.mktemp("gw"), [upstreams["floor1"].address, upstreams["floor2"].address],
                   upstreams["burst"].address, candidate)


def _user_streams(port: int, n: int) -> list[tuple[int, float, bytes, dict]]:
    """n streamed requests one after another: (status, seconds to the end, body, headers)."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        status, headers, content, _ = post(port, body(stream=True),
                                           headers={"X-Fake-Chunks": "5", "X-Fake-Interval-Ms": "20",
                                                    "X-Session-Id": f"s-{i}"})
        out.append((status, time.perf_counter() - t0, content, headers))
    return out


SHADOW_ALL = ShadowSpec(percent=100.0, version="assist-next", max_inflight=2, replicas=1)


def test_a_stalled_candidate_never_delays_the_users_stream_and_mirrors_stay_capped(
        planned_stacks, tmp_path_factory, upstreams):
    stalled = SilentServer()
    off = _gateway(planned_stacks, tmp_path_factory, upstreams, None)
    on = _gateway(planned_stacks, tmp_path_factory, upstreams, stalled.address, shadow=SHADOW_ALL)
    try:
        base, shadowed = [], []
        for _ in range(3):  # interleaved rounds, so both see the same machine
            base += _user_streams(off.port, 8)
            shadowed += _user_streams(on.port, 8)
        # every user got the whole answer from the incumbent, while the candidate still sits on its mirrors
        assert all(s == 200 and b"[DONE]" in c for s, _, c, _ in shadowed)
        assert {h["x-served-by"] for *_, h in shadowed} <= {"floor", "burst"}
        # the cap: all 24 chosen, never more than 2 mirrors held at once, the rest skipped (a held mirror is
        # freed by the candidate backend's first-byte backstop, 3 s here, so a few more got through)
        assert 1 <= stalled.open_connections() <= 2 and 2 <= stalled.requests <= 8
        # latency distribution unchanged (generous: a stall would add the 2 s first-byte limit, or hang)
        assert statistics.median(t for _, t, _, _ in shadowed) < 2 * statistics.median(t for _, t, _, _ in base) + 0.1
        assert max(t for _, t, _, _ in shadowed) < 1.5
    finally:
        on.stop()
        off.stop()
        stalled.stop()


def test_a_dead_candidate_costs_the_user_nothing(planned_stacks, tmp_path_factory, upstreams):
    dead = f"127.0.0.1:{free_port()}"
    on = _gateway(planned_stacks, tmp_path_factory, upstreams, dead, shadow=SHADOW_ALL)
    try:
        results = _user_streams(on.port, 12)
        assert all(s == 200 and b"[DONE]" in c for s, _, c, _ in results)
        assert {h["x-served-by"] for *_, h in results} <= {"floor", "burst"}
        # the mirrors were sent and failed at the candidate (connection refused), on the shadow frontend only
        assert wait_until(lambda: any("fe_assist-shadow" in ln for ln in on.proc.log_lines()))
        mirror_lines = [ln for ln in on.proc.log_lines() if "fe_assist-shadow" in ln]
        assert 1 <= len(mirror_lines) <= 12 and all(" 503 " in ln for ln in mirror_lines)
    finally:
        on.stop()


def test_shadow_mirrors_a_per_request_share_of_the_stamped_request_and_discards_the_answer(
        planned_stacks, tmp_path_factory, upstreams):
    cand = upstreams["candidate"]
    share = ShadowSpec(percent=30.0, version="assist-next", max_inflight=50, replicas=1)
    on = _gateway(planned_stacks, tmp_path_factory, upstreams, cand.address, shadow=share)
    before = len(cand.log.completions())
    try:
        rids = []
        for i in range(100):
            status, headers, content, rid = post(on.port, body(), headers={"X-User-Id": "one-user"})
            assert status == 200 and headers["x-served-by"] in ("floor", "burst")
            assert b'"upstream": "candidate"' not in content  # the user never sees the candidate's answer
            rids.append(rid)
        time.sleep(0.3)  # the last mirrors are in flight on their own task
        mirrors = cand.log.completions()[before:]
        # per request, not per user: one user, 30% of the requests (binomial n=100, p=0.3: 14..46 at 99.9%)
        assert 14 <= len(mirrors) <= 46
        incumbent = {r.request_id: r for u in ("floor1", "floor2", "burst") for r in upstreams[u].log.completions()}
        for m in mirrors:
            assert m.request_id in rids
            served = incumbent[m.request_id]
            assert m.body == served.body  # same stamped body: the tenant's cache_salt and max_tokens
            assert m.body["cache_salt"] == SALTS["acme"] and m.headers["x-gateway-tenant"] == "acme"
            assert m.headers["x-gateway-shadow"] == "1" and "authorization" not in m.headers
    finally:
        on.stop()


# ── canary: a full or absent candidate sends canary users to the incumbent ──────────────────────


def canary_all(full_at: int) -> CanarySpec:
    return CanarySpec(percent=50.0, revision="assist-rev-b", hash_key="user", weights_uri_suffix="m/", replicas=1,
                      full_at_inflight_per_replica=full_at)


def test_a_full_candidate_sends_canary_users_to_the_incumbent(planned_stacks, tmp_path_factory, upstreams):
    cand = upstreams["candidate"]
    gw = _gateway(planned_stacks, tmp_path_factory, upstreams, cand.address, canary=canary_all(2))
    try:
        # users the hash puts in the canary: asked of the proxy itself while the candidate is idle
        users = []
        for u in range(60):
            status, headers, _, _ = post(gw.port, body(), headers={"X-User-Id": f"u{u}"})
            assert status == 200
            if headers["x-served-by"] == "canary":
                users.append(f"u{u}")
        assert len(users) >= 4
        for u in upstreams.values():
            u.release_event.clear()
        held_before = len(cand.log.completions())
        with cf.ThreadPoolExecutor(max_workers=6) as pool:
            held = [pool.submit(post, gw.port, body(stream=True),
                                headers={"X-User-Id": users[i], "X-Fake-Hold": "1", "X-Fake-Chunks": "2"})
                    for i in range(2)]
            assert wait_until(lambda: len(cand.log.completions()) - held_before == 2)
            # the candidate's one replica is at its full mark: canary users now get the incumbent, at once
            over = [post(gw.port, body(stream=True), headers={"X-User-Id": u}) for u in users[2:4]]
            for u in upstreams.values():
                u.release()
            held_results = [f.result(timeout=10) for f in held]
        assert [r[1]["x-served-by"] for r in held_results] == ["canary", "canary"]
        assert all(r[0] == 200 and b"[DONE]" in r[2] for r in over + held_results)
        assert {r[1]["x-served-by"] for r in over} <= {"floor", "burst"}
        # room again: the same users are back on the candidate
        status, headers, _, _ = post(gw.port, body(), headers={"X-User-Id": users[2]})
        assert status == 200 and headers["x-served-by"] == "canary"
    finally:
        for u in upstreams.values():
            u.release()
        gw.stop()


def test_a_candidate_with_no_ready_replica_sends_canary_users_to_the_incumbent(
        planned_stacks, tmp_path_factory, upstreams):
    spec = rollout_spec(planned_stacks["prod"][1], canary=canary_all(2))
    dead = f"127.0.0.1:{free_port()}"
    gw = Gateway(spec, tmp_path_factory.mktemp("gw"), [upstreams["floor1"].address, upstreams["floor2"].address],
                 upstreams["burst"].address, dead, check_ms=100)
    try:
        # once the health check has marked the candidate down, every user, canary or not, is answered
        assert wait_until(lambda: all(post(gw.port, body(), headers={"X-User-Id": f"u{u}"})[0] == 200
                                      for u in range(20)), timeout_s=5)
        results = [post(gw.port, body(stream=True), headers={"X-User-Id": f"u{u}"}) for u in range(40)]
        assert all(r[0] == 200 and b"[DONE]" in r[2] for r in results)
        assert {r[1]["x-served-by"] for r in results} <= {"floor", "burst"}
    finally:
        gw.stop()


def test_a_floor_replica_marked_down_leaves_its_share_to_burst(planned_stacks, tmp_path_factory, upstreams):
    """The floor pick skips a replica its health check marked down (2.6 hands srv_is_up to Lua as 0/1, and 0
    is true in Lua). Before the fix the down replica counted as having room: with the live one full, requests
    were sent to the floor and queued there (then 503) instead of overflowing to burst."""
    spec = rollout_spec(planned_stacks["prod"][1])
    dead = f"127.0.0.1:{free_port()}"
    floor = upstreams["floor1"]
    gw = Gateway(spec, tmp_path_factory.mktemp("gw"), [dead, floor.address], upstreams["burst"].address, None,
                 check_ms=100)
    try:
        assert wait_until(lambda: any("be_assist_floor/floor1 is DOWN" in ln for ln in gw.proc.log_lines()))
        for u in upstreams.values():
            u.release_event.clear()
        before = len(floor.log.completions())
        with cf.ThreadPoolExecutor(max_workers=8) as pool:
            held = [pool.submit(post, gw.port, body(stream=True), headers={"X-Fake-Hold": "1", "X-Fake-Chunks": "2"})
                    for _ in range(4)]  # the live replica's threshold (4 in this test spec)
            assert wait_until(lambda: len(floor.log.completions()) - before == 4)
            extra = [post(gw.port, body(stream=True), headers={"X-Session-Id": f"s{i}"}) for i in range(4)]
            for u in upstreams.values():
                u.release()
            held_results = [f.result(timeout=10) for f in held]
        assert all(r[0] == 200 and b"[DONE]" in r[2] for r in extra + held_results)
        assert {r[1]["x-served-by"] for r in extra} == {"burst"}
    finally:
        for u in upstreams.values():
            u.release()
        gw.stop()


def test_each_candidate_on_the_same_weights_canaries_its_own_users(planned_stacks, tmp_path_factory, upstreams):
    """Two engine-only candidates (same weights revision, new version names) at 20%: each picks its own users —
    the hash is seeded by the candidate's version — instead of the same cohort carrying every candidate built on
    those weights (it was seeded by the revision). Asked of the real proxy, 100 users each."""
    cand = upstreams["candidate"].address
    cohorts = []
    for version in ("assist-2026-12-kvfp8", "assist-2026-12-img2"):
        canary = CanarySpec(percent=20.0, revision="rev-shared", version=version, weights_uri_suffix="w/", replicas=1,
                            full_at_inflight_per_replica=0)
        gw = _gateway(planned_stacks, tmp_path_factory, upstreams, cand, canary=canary)
        try:
            on = set()
            for u in range(100):
                status, headers, _, _ = post(gw.port, body(), headers={"X-User-Id": f"u{u}"})
                assert status == 200
                if headers["x-served-by"] == "canary":
                    on.add(u)
            cohorts.append(on)
        finally:
            gw.stop()
    a, b = cohorts
    assert 8 <= len(a) <= 35 and 8 <= len(b) <= 35  # about a fifth each
    assert len(a & b) < min(len(a), len(b))  # not the same users (independent 20% draws share about a fifth)
