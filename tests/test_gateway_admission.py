"""Admission control and Modal's web-request cap at the gateway, on a real HAProxy on 127.0.0.1
(issue #10 item 5, issue #12 item 5).

Admission: overflow to burst stays immediate; only when the floor (up to its sequence slots) and the burst
tier (up to its in-flight limit) are both full does a request wait, for admission_queue_timeout_s, then it
gets 429 with Retry-After. Non-streamed requests bound for burst: max_tokens capped, kept on the floor, or
refused with 400, as burst.non_streamed_rule says.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import pytest

from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import require_haproxy
from tests.test_gateway import body, post, wait_until
from tests.test_gateway_rollout import Gateway

HOLD = {"X-Fake-Hold": "1", "X-Fake-Chunks": "2"}


def edited_spec(spec, gateway: dict, burst: dict | None = None):
    eps = []
    for e in spec.endpoints:
        # held streams must outlive the waits below: gap limits well above them
        update = {"first_byte_timeout_s": 5, "inter_chunk_timeout_s": 5, "sse_heartbeat_s": 0.5}
        ep_update = {}
        if e.name == "assist":
            update |= {"overflow_inflight_per_replica": 2, "shadow": None, "canary": None, **gateway}
            if burst:
                ep_update["burst"] = e.burst.model_copy(update=burst)
        eps.append(e.model_copy(update={"gateway": e.gateway.model_copy(update=update), **ep_update}))
    return spec.model_copy(update={"endpoints": tuple(eps)})


@pytest.fixture(scope="module")
def ups():
    require_haproxy()
    u = {n: FakeUpstream(n).start() for n in ("floor1", "floor2", "burst")}
    yield u
    for x in u.values():
        x.release()
        x.stop()


def start(planned_stacks, tmp_path_factory, ups, gateway: dict, burst: dict | None = None,
          candidate: str | None = None) -> Gateway:
    spec = edited_spec(planned_stacks["prod"][1], gateway, burst)
    return Gateway(spec, tmp_path_factory.mktemp("gw"), [ups["floor1"].address, ups["floor2"].address],
                   ups["burst"].address, candidate)


def completions(ups, *names) -> int:
    return sum(len(ups[n].log.completions()) for n in names)


ADMISSION = {"admission_queue_timeout_s": 1.0, "admission_inflight_per_floor_replica": 3,
             "admission_burst_inflight": 2, "retry_after_s": 7}


def test_full_floor_and_burst_wait_then_429_with_retry_after(planned_stacks, tmp_path_factory, ups):
    gw = start(planned_stacks, tmp_path_factory, ups, ADMISSION)
    for u in ups.values():
        u.release_event.clear()
    try:
        with cf.ThreadPoolExecutor(max_workers=12) as pool:
            def hold(n, served):
                before = completions(ups, *served)
                fs = [pool.submit(post, gw.port, body(stream=True), headers=HOLD) for _ in range(n)]
                assert wait_until(lambda: completions(ups, *served) - before == n)
                return fs
            on_floor = hold(4, ("floor1", "floor2"))  # the overflow threshold: 2 per replica
            on_burst = hold(2, ("burst",))  # overflow to burst, at once: nothing queued while burst has room
            admitted = hold(2, ("floor1", "floor2"))  # burst full: the floor's spare slots (3 per replica)
            # now every slot is taken: the next request waits, bounded, then is told when to come back
            key = {"Idempotency-Key": "told-to-come-back"}
            status, headers, content, _ = post(gw.port, body(stream=True), headers=key)
            assert status == 429 and headers["retry-after"] == "7"
            assert json.loads(content)["error"]["type"] == "overloaded_error"
            # a request that finds a slot freed while it waits is served (the 429'd request's retry: its
            # Idempotency-Key was freed with the 429, not held as if it were in flight)
            queued = pool.submit(post, gw.port, body(stream=True),
                                 headers={**key, "X-Fake-Chunks": "4", "X-Fake-Interval-Ms": "300"})
            time.sleep(0.4)  # it is in HAProxy's queue (timeout 1 s)
            for u in ups.values():
                u.release()
            # it waited in the queue, then streams: its key is still claimed (no second generation), and free after
            assert wait_until(lambda: sum(r.headers.get("idempotency-key") == key["Idempotency-Key"]
                                          for u in ups.values() for r in u.log.completions()) == 1)
            status, _, _, _ = post(gw.port, body(stream=True), headers=key)
            assert status == 409 and not queued.done()
            late = queued.result(timeout=10)
            results = [f.result(timeout=10) for f in on_floor + on_burst + admitted]
            assert post(gw.port, body(), headers=key)[0] == 200
        assert late[0] == 200 and late[1]["x-served-by"] == "floor" and b"[DONE]" in late[2]
        assert all(r[0] == 200 and b"[DONE]" in r[2] for r in results)
        assert [r[1]["x-served-by"] for r in results] == ["floor"] * 4 + ["burst"] * 2 + ["floor"] * 2
        # the first six went straight to a server (%Tw = 0): queueing only once both tiers were full
        lines = [ln for ln in gw.proc.log_lines() if " fe_assist " in ln and " 200 " in ln]
        assert sum(ln.split()[4].split("/")[1] == "0" for ln in lines) >= 8
    finally:
        for u in ups.values():
            u.release()
        gw.stop()


def test_without_admission_settings_a_full_burst_still_takes_everything(planned_stacks, tmp_path_factory, ups):
    gw = start(planned_stacks, tmp_path_factory, ups, {})
    for u in ups.values():
        u.release_event.clear()
    try:
        with cf.ThreadPoolExecutor(max_workers=12) as pool:
            before = completions(ups, "floor1", "floor2")
            held = [pool.submit(post, gw.port, body(stream=True), headers=HOLD) for _ in range(4)]
            assert wait_until(lambda: completions(ups, "floor1", "floor2") - before == 4)
            extra = [post(gw.port, body(stream=True)) for _ in range(5)]
            for u in ups.values():
                u.release()
            [f.result(timeout=10) for f in held]
        assert all(r[0] == 200 and r[1]["x-served-by"] == "burst" for r in extra)
    finally:
        for u in ups.values():
            u.release()
        gw.stop()


# ── non-streamed requests and Modal's 150 s web-request cap ──────────────────────────────────────


def fill_floor(gw, ups, pool, n: int = 4, names: tuple[str, ...] = ("floor1", "floor2")):
    """n held streams, taken by the upstreams `names` (the floor's threshold by default; 8 on floor and burst: every
    admission slot)."""
    for u in ups.values():
        u.release_event.clear()
    before = completions(ups, *names)
    held = [pool.submit(post, gw.port, body(stream=True), headers=HOLD) for _ in range(n)]
    assert wait_until(lambda: completions(ups, *names) - before == n)
    return held


def received(ups, name, rid):
    return [r for r in ups[name].log.completions() if r.request_id == rid]


def test_cap_max_tokens_lowers_non_streamed_requests_on_burst_only(planned_stacks, tmp_path_factory, ups):
    gw = start(planned_stacks, tmp_path_factory, ups, {}, {"non_streamed_rule": "cap_max_tokens",
                                                           "non_streamed_max_tokens": 100})
    try:
        # the floor has room: nothing changes
        status, headers, _, rid = post(gw.port, body(max_tokens=1000))
        assert status == 200 and headers["x-served-by"] == "floor"
        (rec,) = received(ups, "floor1", rid) + received(ups, "floor2", rid)
        assert rec.body["max_tokens"] == 1000
        with cf.ThreadPoolExecutor(max_workers=8) as pool:
            held = fill_floor(gw, ups, pool)
            cases = [
                (body(max_tokens=1000), {"max_tokens": 100}),
                (body(max_tokens=50, max_completion_tokens=500), {"max_tokens": 50, "max_completion_tokens": 100}),
                (body(), {"max_tokens": 100}),  # none given: the cap is stamped, not the endpoint's 2,048
                (body(max_tokens=None), {"max_tokens": 100}),  # null would mean "no limit" to the engine
                (body(max_tokens=1000, stream=True), {"max_tokens": 1000}),  # streamed: Modal's cap does not apply
            ]
            for sent, expect in cases:
                status, headers, _, rid = post(gw.port, sent)
                assert status == 200 and headers["x-served-by"] == "burst"
                (rec,) = received(ups, "burst", rid)
                for k, v in expect.items():
                    assert rec.body[k] == v, (sent, rec.body)
                assert rec.body["messages"] == sent["messages"] and rec.body["cache_salt"]  # valid JSON, still salted
                assert len([k for k in rec.body if k == "max_tokens"]) == 1
            for u in ups.values():
                u.release()
            [f.result(timeout=10) for f in held]
    finally:
        for u in ups.values():
            u.release()
        gw.stop()


def test_floor_only_keeps_non_streamed_requests_off_burst(planned_stacks, tmp_path_factory, ups):
    gw = start(planned_stacks, tmp_path_factory, ups, {}, {"non_streamed_rule": "floor_only"})
    try:
        with cf.ThreadPoolExecutor(max_workers=8) as pool:
            held = fill_floor(gw, ups, pool)
            streamed = post(gw.port, body(stream=True))
            assert streamed[0] == 200 and streamed[1]["x-served-by"] == "burst"
            # non-streamed, with the floor past its overflow threshold: it stays on the floor (its spare slots up
            # to the planned admission limit, or its queue), never on burst where Modal's 150 s cap would cut it
            waiting = pool.submit(post, gw.port, body())
            for u in ups.values():
                u.release()
            status, headers, _, rid = waiting.result(timeout=10)
            [f.result(timeout=10) for f in held]
        assert status == 200 and headers["x-served-by"] == "floor" and received(ups, "burst", rid) == []
    finally:
        for u in ups.values():
            u.release()
        gw.stop()


def test_require_streaming_answers_400_instead_of_sending_a_non_streamed_request_to_burst(
        planned_stacks, tmp_path_factory, ups):
    gw = start(planned_stacks, tmp_path_factory, ups, {}, {"non_streamed_rule": "require_streaming"})
    try:
        status, headers, _, _ = post(gw.port, body())
        assert status == 200 and headers["x-served-by"] == "floor"  # floor has room: served
        with cf.ThreadPoolExecutor(max_workers=8) as pool:
            held = fill_floor(gw, ups, pool)
            # with an Idempotency-Key: the gate claims it before the route is known; the 400 that the rules
            # answer with must free it, so the client's streamed retry with the same key is served, not a 409
            key = {"Idempotency-Key": "retry-me-streamed"}
            status, _, content, rid = post(gw.port, body(), headers=key)
            assert status == 400 and "stream" in json.loads(content)["error"]["message"]
            assert received(ups, "burst", rid) == []
            streamed = post(gw.port, body(stream=True), headers=key)
            assert streamed[0] == 200 and streamed[1]["x-served-by"] == "burst"
            for u in ups.values():
                u.release()
            [f.result(timeout=10) for f in held]
    finally:
        for u in ups.values():
            u.release()
        gw.stop()


def test_a_request_refused_at_the_gateway_is_never_mirrored_to_the_shadow_candidate(planned_stacks, tmp_path_factory,
                                                                                      ups):
    """The shadow rule ran before the rules that refuse: a request answered 429 after its bounded wait, or 400 for
    being non-streamed while the endpoint overflows to burst (require_streaming), was still mirrored to the
    candidate, which then served a request no user was served (and a sampled mirror left a record with no
    incumbent exchange). A mirror now goes only for a request on its way to a server, and not for one waiting for
    admission: the endpoint is saturated then."""
    from topology.spec import ShadowSpec

    cand = FakeUpstream("candidate").start()
    shadow = ShadowSpec(percent=100.0, version="assist-next", max_inflight=20, replicas=1)
    gw = start(planned_stacks, tmp_path_factory, ups, {**ADMISSION, "shadow": shadow},
               {"non_streamed_rule": "require_streaming"}, candidate=cand.address)

    def mirrored(rid: str) -> int:
        return sum(r.request_id == rid for r in cand.log.completions())

    try:
        _, _, _, rid = post(gw.port, body(stream=True), headers={"X-Fake-Chunks": "2"})
        assert wait_until(lambda: mirrored(rid) == 1)  # served: mirrored
        with cf.ThreadPoolExecutor(max_workers=12) as pool:
            held = fill_floor(gw, ups, pool, 8, ("floor1", "floor2", "burst"))
            status, _, content, rid_ns = post(gw.port, body())  # non-streamed, bound for burst: 400
            assert status == 400 and "stream" in json.loads(content)["error"]["message"]
            status, headers, _, rid_full = post(gw.port, body(stream=True))  # every slot taken: waits, then 429
            assert status == 429 and headers["retry-after"] == "7"
            for u in ups.values():
                u.release()
            assert all(f.result(timeout=10)[0] == 200 for f in held)
        time.sleep(0.5)  # a mirror is posted by a Lua task a moment after its request goes on
        assert mirrored(rid_ns) == 0 and mirrored(rid_full) == 0
    finally:
        for u in ups.values():
            u.release()
        gw.stop()
        cand.stop()


def test_past_what_the_replicas_admit_within_the_wait_a_request_gets_429_at_once(planned_stacks, tmp_path_factory,
                                                                                  ups):
    """The queue had no bound of its own: every request waited the whole bounded wait before its 429, and a flood
    past the frontend's connections waited in the accept backlog first (429s after 1-4 s for a 1 s bound). Now
    only as many wait as the replicas up admit within the wait (admission_queue_per_floor_replica each: 1 here, two
    floor replicas up); the rest get 429 with Retry-After at once."""
    gw = start(planned_stacks, tmp_path_factory, ups, {**ADMISSION, "admission_queue_per_floor_replica": 1})

    def timed():
        t0 = time.monotonic()
        status, headers, _, _ = post(gw.port, body(stream=True))
        return status, headers.get("retry-after"), time.monotonic() - t0

    try:
        with cf.ThreadPoolExecutor(max_workers=16) as pool:
            held = fill_floor(gw, ups, pool, 8, ("floor1", "floor2", "burst"))
            flood = [pool.submit(timed) for _ in range(6)]
            results = [f.result(timeout=10) for f in flood]
            for u in ups.values():
                u.release()
            assert all(f.result(timeout=10)[0] == 200 for f in held)
        assert all(status == 429 and retry == "7" for status, retry, _ in results), results
        waits = sorted(t for _, _, t in results)
        assert all(t < 0.5 for t in waits[:4]), waits  # beyond the queue: at once
        assert all(t >= 0.9 for t in waits[4:]), waits  # in the queue: the bounded wait, then 429
    finally:
        for u in ups.values():
            u.release()
        gw.stop()
