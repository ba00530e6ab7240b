"""Quality sampling end to end (issue #16 item 6): the real HAProxy on 127.0.0.1 running the rendered config,
the recorder as its own process, and a real S3 API (moto server) — up, slow or down.

Share: each version's sampled count is binomial(n_version, fraction); the tests allow 4 standard deviations
(a false failure about once in 16,000 runs). Records: what the user received, reassembled here from the
user's own bytes, is what the record says; nothing secret is in any object. A slow or dead sink (or
recorder) costs the user nothing: every stream still arrives whole.
"""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import math

import pytest

from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import SilentServer, free_port, require_haproxy
from tests.moto_support import client  # the fixture moto_endpoint: conftest.py
from tests.quality_support import (
    DelayingProxy, RecorderProcess, SampledGateway, sampled_spec, sink_records, total, wait_until,
)
from tests.test_gateway import KEYS, MODAL, SALTS, _raw_post, body, post

BUCKET = "acme-llm-evals"  # prod's sink_uri: s3://acme-llm-evals/prod/


@pytest.fixture(scope="module")
def upstreams():
    require_haproxy()
    ups = {n: FakeUpstream(n).start() for n in ("floor1", "floor2", "burst", "candidate")}
    yield ups
    for u in ups.values():
        u.stop()


@pytest.fixture
def s3(moto_endpoint):  # noqa: F811
    """The sink bucket, empty (moto runs once per session)."""
    s3 = client("s3", moto_endpoint)
    if any(b["Name"] == BUCKET for b in s3.list_buckets().get("Buckets", [])):
        for obj in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=obj["Key"])
    else:
        s3.create_bucket(Bucket=BUCKET)
    return s3


def _chain(spec, tmp_path, upstreams, sink_url, **limits):
    rec = RecorderProcess(spec, tmp_path, sink_url, **limits)
    try:
        gw = SampledGateway(spec, tmp_path, upstreams, rec.address)
    except Exception:
        rec.stop()
        raise
    return rec, gw


def _streamed_text(content: bytes) -> str:
    """The assistant text a client reads from an SSE body (independent of recorder/records.py)."""
    out = []
    for line in content.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for c in json.loads(line[6:]).get("choices", []):
                out.append(c.get("delta", {}).get("content", ""))
    return "".join(out)


def _versions(spec):
    r = spec.endpoint("assist").rollout
    return r.served_version, r.candidate.version


def test_each_version_gets_its_share_of_exchanges_within_a_binomial_bound(planned_stacks, tmp_path, upstreams, s3,
                                                                          moto_endpoint):  # noqa: F811
    fraction, n = 0.2, 400
    spec = sampled_spec(planned_stacks["prod"][1], fraction, canary_percent=50)
    served, candidate = _versions(spec)
    rec, gw = _chain(spec, tmp_path, upstreams, moto_endpoint)
    try:
        served_by: dict[str, str] = {}
        for i in range(n):  # one request per user: the canary hash splits users about half and half
            status, headers, _, rid = post(gw.port, body(), headers={"X-User-Id": f"user-{i}"})
            assert status == 200
            served_by[rid] = candidate if headers["x-served-by"] == "canary" else served
        counts = {v: sum(1 for x in served_by.values() if x == v) for v in (served, candidate)}
        assert min(counts.values()) > 100  # both versions saw real traffic

        def settled():
            m = rec.metrics()
            got = total(m, "llm_quality_records_received_total")
            return got > 0 and total(m, "llm_quality_records_written_total") == got and rec.queue_empty(m)
        assert wait_until(settled, timeout_s=15)
        records = [r for _, r in sink_records(s3, BUCKET, "prod/assist/")]
        for version, n_v in counts.items():
            k = sum(1 for r in records if r["version"]["name"] == version)
            bound = 4 * math.sqrt(n_v * fraction * (1 - fraction))
            assert abs(k - n_v * fraction) <= bound, (version, k, n_v)
        # every record is filed under the version that actually served it, and under that version's prefix
        for key, r in sink_records(s3, BUCKET, "prod/assist/"):
            assert served_by[r["request_id"]] == r["version"]["name"]
            assert key.startswith(f"prod/assist/{r['version']['name']}/")
        # the gateway's own counters agree with what was written (every post accepted)
        gm = gw.quality_metrics()
        for version in (served, candidate):
            written = sum(1 for r in records if r["version"]["name"] == version)
            assert total(gm, "llm_gateway_quality_sampled_total", version=version) == written
    finally:
        gw.stop()
        rec.stop()


def test_records_are_complete_for_streamed_and_whole_answers_and_hold_no_secret(planned_stacks, tmp_path, upstreams,
                                                                               s3, moto_endpoint):  # noqa: F811
    spec = sampled_spec(planned_stacks["prod"][1], 1.0)
    served, _ = _versions(spec)
    identity = spec.endpoint("assist").rollout.incumbent
    rec, gw = _chain(spec, tmp_path, upstreams, moto_endpoint)
    try:
        prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "naïve \"quotes\"\n\tand ✓"}]
        sent = {}
        st, _, streamed, rid_s = post(gw.port, {"model": "m", "messages": prompt, "stream": True, "temperature": 0.2},
                                      headers={"X-Fake-Chunks": "5", "X-Fake-Interval-Ms": "10"})
        sent[rid_s] = ("acme", True, _streamed_text(streamed))
        st2, _, whole, rid_w = post(gw.port, {"model": "m", "messages": prompt, "max_tokens": 7}, key=KEYS["globex"])
        sent[rid_w] = ("globex", False, json.loads(whole)["choices"][0]["message"]["content"])
        # no id from the client: the record carries the gateway's, which the engine got and the log line shows
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "m", "messages": prompt}).encode(),
                     headers={"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        anonymous, gateway_id = json.loads(resp.read()), resp.getheader("X-Request-Id")
        conn.close()
        assert resp.status == 200 and gateway_id
        assert [r.engine_request_id for u in upstreams.values() for r in u.log.completions()
                if r.engine_request_id == gateway_id] == [gateway_id]
        sent[gateway_id] = ("acme", False, anonymous["choices"][0]["message"]["content"])
        assert st == st2 == 200 and sent[rid_s][2] == "tok0 tok1 tok2 tok3 tok4 "
        assert wait_until(lambda: len(sink_records(s3, BUCKET, "prod/")) == 3, timeout_s=15)
        for key, r in sink_records(s3, BUCKET, "prod/"):
            tenant, is_stream, text = sent[r["request_id"]]
            assert key.startswith(f"prod/assist/{served}/") and key.endswith(".jsonl")
            assert r["schema"] == "llm-serving.quality-sample/1" and r["endpoint"] == "assist"
            assert r["version"] == {"name": served, "identity_sha256": identity.identity_sha256,
                                    "weights_revision": identity.weights_revision, "engine_image": identity.engine_image,
                                    "engine_settings_sha256": identity.engine_settings_sha256}
            assert r["tenant"] == tenant and r["route"] in ("floor", "burst") and r["status"] == 200
            assert r["path"] == "/v1/chat/completions" and r["kind"] == "chat"
            assert r["prompt"] == prompt  # the client's messages, unicode and escapes intact
            assert r["completion"] == text and r["streamed"] is is_stream
            assert r["complete"] is True and r["truncated"] is False and r["error"] is None and r["client_left"] is False
            assert r["started_at"] <= r["ended_at"] and r["duration_ms"] >= 0
        params = {r["request_id"]: (r["parameters"], r["gateway_max_tokens"]) for _, r in sink_records(s3, BUCKET, "prod/")}
        assert gateway_id in params
        # as the client sent them, and the limit the gateway stamped when the client gave none
        assert params[rid_s] == ({"model": "m", "stream": True, "temperature": 0.2},
                                 spec.endpoint("assist").gateway.max_tokens)
        assert params[rid_w] == ({"model": "m", "max_tokens": 7}, None)
        # nothing secret anywhere in the sink: API keys, Authorization, cache salts (stamped into what the
        # engine got), Modal's proxy auth
        raw = b"".join(s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
                       for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]).decode()
        for secret in [*KEYS.values(), *SALTS.values(), *MODAL.values()]:
            assert secret not in raw
        assert "bearer" not in raw.lower() and "authorization" not in raw.lower() and "cache_salt" not in raw
        engine_got = [r for u in upstreams.values() for r in u.log.completions() if r.request_id == rid_s]
        assert engine_got and engine_got[0].body["cache_salt"] == SALTS["acme"]  # the salt was there to leak
    finally:
        gw.stop()
        rec.stop()


def test_a_shadow_mirror_is_sampled_under_the_candidate_version(planned_stacks, tmp_path, upstreams, s3,
                                                                moto_endpoint):  # noqa: F811
    spec = sampled_spec(planned_stacks["prod"][1], 1.0, shadow_percent=100)
    served, candidate = _versions(spec)
    rec, gw = _chain(spec, tmp_path, upstreams, moto_endpoint)
    before = len(upstreams["candidate"].log.completions())
    try:
        rids = [post(gw.port, body(stream=True), headers={"X-Fake-Chunks": "3"})[3] for _ in range(4)]
        assert wait_until(lambda: len(sink_records(s3, BUCKET, "prod/")) == 8, timeout_s=15)
        assert len(upstreams["candidate"].log.completions()) - before == 4  # the mirrors reached the candidate
        by = {(r["version"]["name"], r["request_id"]): (k, r) for k, r in sink_records(s3, BUCKET, "prod/")}
        for rid in rids:
            k, inc = by[(served, rid)]
            assert inc["route"] in ("floor", "burst") and k.startswith(f"prod/assist/{served}/")
            k, cand = by[(candidate, rid)]
            assert cand["route"] == "shadow" and k.startswith(f"prod/assist/{candidate}/")
            assert cand["completion"] == "tok0 tok1 tok2 " and cand["complete"] is True
            assert cand["version"]["identity_sha256"] == spec.endpoint("assist").rollout.candidate.identity_sha256
    finally:
        gw.stop()
        rec.stop()


def _users_get_whole_streams(port: int, n: int) -> None:
    for i in range(n):
        status, _, content, _ = post(port, body(stream=True), headers={"X-Fake-Chunks": "5", "X-Fake-Interval-Ms": "10",
                                                                       "X-Session-Id": f"s-{i}"})
        assert status == 200 and content.endswith(b"data: [DONE]\n\n")
        assert _streamed_text(content) == "tok0 tok1 tok2 tok3 tok4 "


@pytest.mark.parametrize("sink", ["slow", "stalled", "down"])
def test_a_slow_stalled_or_dead_sink_never_reaches_the_user(planned_stacks, tmp_path, upstreams, sink, s3,
                                                            moto_endpoint):  # noqa: F811
    """slow: moto behind a proxy that holds every block a client sends 0.3 s (uploads succeed, slowly); stalled: an endpoint
    that accepts and never answers (uploads time out after 1 s); down: nothing listens."""
    spec = sampled_spec(planned_stacks["prod"][1], 1.0)
    slow = DelayingProxy(moto_endpoint, 0.3) if sink == "slow" else None
    stall = SilentServer() if sink == "stalled" else None
    url = slow.url if slow else stall.url if stall else f"http://127.0.0.1:{free_port()}"
    # a small queue, so the held uploads also fill it: accepted exchanges then drop at once, counted
    # (slow: an upload takes ~0.6 s, well inside its 3 s timeout; stalled: each times out after 1 s)
    rec, gw = _chain(spec, tmp_path, upstreams, url, queue_max_records=3, batch_max_records=2,
                     upload_timeout_s=3.0 if slow else 1.0)
    try:
        _users_get_whole_streams(gw.port, 16)

        def accounted():  # every exchange once: written, or dropped (refused when the queue is full, or its upload failed)
            m = rec.metrics()
            return (total(m, "llm_quality_records_written_total") + total(m, "llm_quality_records_dropped_total") == 16
                    and rec.queue_empty(m))
        assert wait_until(accounted, timeout_s=30)
        m = rec.metrics()
        assert (total(m, "llm_quality_records_received_total")
                + total(m, "llm_quality_records_dropped_total", reason="queue_full")) == 16
        written = total(m, "llm_quality_records_written_total")
        if slow:  # the sink answered: what was written is there, the rest was refused while uploads were held
            assert written >= 1 and len(sink_records(s3, BUCKET, "prod/")) == written
            assert total(m, "llm_quality_records_dropped_total", reason="queue_full") >= 1
        else:
            assert written == 0 and total(m, "llm_quality_records_dropped_total", reason="upload_failed") >= 1
        if stall:
            assert stall.requests >= 1  # the uploads did reach the sink, which never answered
            assert total(m, "llm_quality_records_dropped_total", reason="queue_full") >= 1
        # the recorder still answers: the next exchanges are accepted or refused at once, never held
        _users_get_whole_streams(gw.port, 4)
    finally:
        gw.stop()
        rec.stop()
        for part in (slow, stall):
            if part:
                part.stop()


@pytest.mark.parametrize("recorder", ["stalled", "dead"])
def test_a_stalled_or_dead_recorder_never_reaches_the_user(planned_stacks, tmp_path, upstreams, recorder):
    spec = sampled_spec(planned_stacks["prod"][1], 1.0)
    stall = SilentServer() if recorder == "stalled" else None  # accepts the post, never answers
    address = stall.url.removeprefix("http://") if stall else f"127.0.0.1:{free_port()}"
    gw = SampledGateway(spec, tmp_path, upstreams, address)
    try:
        _users_get_whole_streams(gw.port, 24)
        gm = gw.quality_metrics()
        assert total(gm, "llm_gateway_quality_sampled_total") == 0
        if stall:  # 16 posts held by the stalled recorder (the cap), the rest dropped at once
            assert wait_until(lambda: stall.requests == 16, timeout_s=5)
            assert total(gm, "llm_gateway_quality_dropped_total", reason="posts_full") == 24 - 16
        else:  # refused at once: each post fails (or, were 16 still in flight, is skipped), counted
            assert wait_until(lambda: total(gw.quality_metrics(), "llm_gateway_quality_dropped_total") == 24,
                              timeout_s=10)
            assert total(gw.quality_metrics(), "llm_gateway_quality_dropped_total", reason="post_failed") >= 1
    finally:
        gw.stop()
        if stall:
            stall.stop()


def test_a_stream_ended_by_the_gateway_or_cut_by_the_capture_limit_is_recorded_as_such(
        planned_stacks, tmp_path, upstreams, s3, moto_endpoint):  # noqa: F811
    spec = sampled_spec(planned_stacks["prod"][1], 1.0)
    # max_tokens 16: the capture keeps 16 × 512 bytes of response, less than 100 streamed chunks
    eps = tuple(e.model_copy(update={"gateway": e.gateway.model_copy(update={"max_tokens": 16})})
                if e.name == "assist" else e for e in spec.endpoints)
    spec = spec.model_copy(update={"endpoints": eps})
    rec, gw = _chain(spec, tmp_path, upstreams, moto_endpoint)
    try:
        # the upstream stalls after its second chunk: the gateway's 1 s gap limit ends the stream with an error event
        _, _, stalled, rid_gap = post(gw.port, body(stream=True), headers={
            "X-Fake-Chunks": "5", "X-Fake-Gap-After": "1", "X-Fake-Gap-Ms": "1600"})
        assert b"event: error" in stalled and b"gateway_timeout" in stalled
        _, _, long, rid_long = post(gw.port, body(stream=True), headers={"X-Fake-Chunks": "100"})
        assert long.endswith(b"data: [DONE]\n\n") and _streamed_text(long).count("tok") == 100  # the user got it all
        assert wait_until(lambda: len(sink_records(s3, BUCKET, "prod/")) == 2, timeout_s=15)
        by = {r["request_id"]: r for _, r in sink_records(s3, BUCKET, "prod/")}
        gap = by[rid_gap]
        assert gap["completion"] == "tok0 tok1 " and gap["complete"] is False
        assert gap["error"]["type"] == "gateway_timeout"
        cut = by[rid_long]
        assert cut["truncated"] is True and cut["complete"] is False
        assert _streamed_text(long).startswith(cut["completion"]) and 0 < len(cut["completion"]) < len(_streamed_text(long))
    finally:
        gw.stop()
        rec.stop()


def test_a_user_who_leaves_a_stream_is_recorded_as_gone_not_as_a_failing_version(planned_stacks, tmp_path, upstreams,
                                                                                  s3, moto_endpoint):  # noqa: F811
    """A client that closed a sampled stream after its first token: HAProxy then closes the upstream side too, and
    the gateway took that for an upstream cut — its 502 "upstream closed the stream" event went into the record, so
    the version whose users leave more often read as failing more. The record now holds what the user was sent,
    no error, and client_left; a stream the upstream really cuts still records the upstream_error."""
    import socket

    spec = sampled_spec(planned_stacks["prod"][1], 1.0)
    rec, gw = _chain(spec, tmp_path, upstreams, moto_endpoint)
    try:
        payload = json.dumps(body(stream=True)).encode()
        rid = "leaves-after-the-first-token"
        sock = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        sock.sendall(_raw_post("/v1/chat/completions", payload, [
            ("Content-Type", "application/json"), ("X-Request-Id", rid), ("X-Fake-Chunks", "20"),
            ("X-Fake-Interval-Ms", "100"), ("Content-Length", str(len(payload)))]))
        got = b""
        while b"data:" not in got:
            chunk = sock.recv(65536)
            if not chunk:  # closed before any event: the assertions below say so
                break
            got += chunk
        sock.close()
        # a stream the upstream cuts after its first chunk: still the upstream's failure
        _, _, _, rid_cut = post(gw.port, body(stream=True), headers={"X-Fake-Chunks": "5",
                                                                     "X-Fake-Fail": "close-after-first-chunk"})
        assert wait_until(lambda: len(sink_records(s3, BUCKET, "prod/")) == 2, timeout_s=15)
        by = {r["request_id"]: r for _, r in sink_records(s3, BUCKET, "prod/")}
        left = by[rid]
        assert left["client_left"] is True and left["error"] is None and left["complete"] is False
        assert left["completion"] and _streamed_text(got).startswith(left["completion"])  # (data: lines only)
        failed = by[rid_cut]
        assert failed["client_left"] is False and failed["error"]["type"] == "upstream_error"
    finally:
        gw.stop()
        rec.stop()


def test_the_record_states_the_limit_the_gateway_set_when_it_capped_a_request_for_burst(
        planned_stacks, tmp_path, upstreams, s3, moto_endpoint):  # noqa: F811
    spec = sampled_spec(planned_stacks["prod"][1], 1.0, overflow=1)  # one request in flight per floor replica
    # the cap rule at the tokens prod's plan found fit under Modal's 150 s web cap (the plan itself keeps assist's
    # non-streamed requests on the floor: that fit, 1,445, is below the p99 output)
    ep = spec.endpoint("assist")
    cap = int(next(d.value for d in ep.derivations if d.figure == "non_streamed_burst_max_tokens"))
    ep = ep.model_copy(update={"burst": ep.burst.model_copy(update={"non_streamed_rule": "cap_max_tokens",
                                                                    "non_streamed_max_tokens": cap})})
    spec = spec.model_copy(update={"endpoints": tuple(ep if e.name == "assist" else e for e in spec.endpoints)})
    rec, gw = _chain(spec, tmp_path, upstreams, moto_endpoint)
    try:
        def on_floor() -> int:
            return sum(len(upstreams[f].log.completions()) for f in ("floor1", "floor2"))

        before = on_floor()
        with cf.ThreadPoolExecutor(max_workers=2) as pool:
            held = [pool.submit(post, gw.port, body(stream=True), headers={"X-Fake-Hold": "1"}) for _ in range(2)]
            assert wait_until(lambda: on_floor() == before + 2)
            status, headers, _, rid = post(gw.port, body(max_tokens=2000))  # non-streamed, floor full: burst
            for u in upstreams.values():
                u.release()
            [f.result(timeout=10) for f in held]
        for u in upstreams.values():
            u.release_event.clear()  # the module's upstreams hold again for whoever asks next
        assert status == 200 and headers["x-served-by"] == "burst"
        (engine_got,) = [r for r in upstreams["burst"].log.completions() if r.request_id == rid]
        assert engine_got.body["max_tokens"] == cap
        assert wait_until(lambda: rid in {r["request_id"] for _, r in sink_records(s3, BUCKET, "prod/")}, timeout_s=15)
        (r,) = [r for _, r in sink_records(s3, BUCKET, "prod/") if r["request_id"] == rid]
        assert r["route"] == "burst" and r["gateway_max_tokens"] == cap and r["parameters"]["max_tokens"] == 2000
    finally:
        for u in upstreams.values():
            u.release()
        gw.stop()
        rec.stop()
