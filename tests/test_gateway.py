"""The gateway as a real HAProxy on 127.0.0.1, running exactly the config the renderer produces.

The prod spec is used with its gateway timeouts and overflow threshold scaled down (model_copy on
GatewaySpec), so streams and timeouts take a second, not a minute. Upstreams are tests/fake_upstream.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import uuid

import pytest

from components.gateway_config import (DnsServers, StaticServers, env_name, floor_capacity,
                                       render_gateway_config)
from tests import vllm_max_tokens
from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import (HaproxyProcess, free_port, instrumented, lua_path, no_recorder, pod_ca_dir,
                                   require_haproxy)
from topology.spec import CanarySpec

SALTS = {"acme": "salt-acme-7f3a", "globex": "salt-globex-19c2", "initech": "salt-initech-d00d"}
KEYS = {"acme": "key-acme-1", "globex": "key-globex-2", "initech": "key-initech-3", "default": "key-default-4"}
MODAL = {"GW_MODAL_KEY": "wk-test-modal", "GW_MODAL_SECRET": "ws-test-modal"}


def secret_env() -> dict[str, str]:
    """The gateway's environment from the pod's Secrets: every tenant's key on each prod endpoint, the
    tenants' cache salts on assist, and the Modal proxy token."""
    env = dict(MODAL)
    for t, k in KEYS.items():
        for ep in ("assist", "autocomplete", "guard"):
            env[env_name(ep, f"{t}-api-key")] = k
    for t, s in SALTS.items():
        env[env_name("assist", f"{t}-cache-salt")] = s
    return env


def scaled_spec(spec):
    """Prod spec with test-sized gateway figures (same renderer, smaller numbers)."""
    eps = []
    for e in spec.endpoints:
        update = {"first_byte_timeout_s": 2, "inter_chunk_timeout_s": 1, "sse_heartbeat_s": 0.5}
        if e.name == "assist":
            update |= {"overflow_inflight_per_replica": 4, "shadow": None,  # shadow: tests/test_gateway_rollout.py
                       "canary": CanarySpec(percent=30.0, revision="assist-rev-b", hash_key="user",
                                                     weights_uri_suffix="models/assist/assist-rev-b/", replicas=1)}
        eps.append(e.model_copy(update={"gateway": e.gateway.model_copy(update=update)}))
    return spec.model_copy(update={"endpoints": tuple(eps)})


@pytest.fixture(scope="module")
def gw(planned_stacks, tmp_path_factory):
    yield from _gateway(scaled_spec(planned_stacks["prod"][1]), tmp_path_factory)


def _gateway(spec, tmp_path_factory, instrument=None):
    """instrument(rendered, workdir) -> rendered: test-only changes to the config (tests/gateway_harness.instrumented)."""
    require_haproxy()
    ups = {n: FakeUpstream(n).start() for n in ("floor1", "floor2", "burst", "canary", "guard")}
    dead = [free_port(), free_port(), free_port()]  # nothing listens: connections are refused
    ports = {"assist": free_port(), "autocomplete": free_port(), "guard": free_port()}
    workdir = tmp_path_factory.mktemp("gw")
    rendered = render_gateway_config(
        spec, quality_servers=no_recorder(),
        burst_urls={"assist": f"http://{ups['burst'].address}", "autocomplete": f"http://127.0.0.1:{dead[0]}"},
        floor_servers={"assist": StaticServers((ups["floor1"].address, ups["floor2"].address)),
                       "autocomplete": StaticServers((f"127.0.0.1:{dead[1]}",)),
                       "guard": StaticServers((f"127.0.0.1:{dead[2]}", ups["guard"].address))},
        canary_servers={"assist": StaticServers((ups["canary"].address,))},
        binds={k: f"127.0.0.1:{p}" for k, p in ports.items()},
        stats_bind=f"127.0.0.1:{free_port()}",
        lua_path=lua_path(workdir),
        ca_path=str(pod_ca_dir(workdir / "ca")),
        # checks stay out of the way: the refusal tests need the dead server still marked up
        health_check_interval_ms=60000,
        max_connections=2000,
    )
    if instrument is not None:
        rendered = instrument(rendered, workdir)
    env = secret_env()
    proc = HaproxyProcess(rendered, workdir, env, list(ports.values()))
    yield {"ports": ports, "ups": ups, "proc": proc, "spec": spec}
    proc.stop()
    for u in ups.values():
        u.stop()


def body(**extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], **extra}


def post(port: int, payload: dict | bytes, key: str | None = KEYS["acme"], headers: dict | None = None,
         timeout: float = 10.0, path: str = "/v1/chat/completions"):
    """POST and read the whole response: (status, headers, body bytes, request id)."""
    rid = str(uuid.uuid4())
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    h = {"Content-Type": "application/json", "X-Request-Id": rid, **(headers or {})}
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=data, headers=h)
        resp = conn.getresponse()
        try:
            content = resp.read()
        except http.client.IncompleteRead as exc:
            content = exc.partial
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, content, rid
    finally:
        conn.close()


def records(gw, rid: str):
    return [(name, r) for name, u in gw["ups"].items() for r in u.log.completions() if r.request_id == rid]


def wait_until(pred, timeout_s: float = 5.0, step_s: float = 0.01):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step_s)
    return pred()


def log_for(gw, rid_marker: str) -> list[str]:
    return [ln for ln in gw["proc"].log_lines() if rid_marker in ln]


# 1. streaming is incremental --------------------------------------------------------------

def test_first_chunk_reaches_client_before_upstream_finishes(gw):
    port = gw["ports"]["assist"]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    rid = str(uuid.uuid4())
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body(stream=True)).encode(),
                 headers={"Authorization": f"Bearer {KEYS['acme']}", "X-Request-Id": rid,
                          "Content-Type": "application/json", "X-Fake-Chunks": "5", "X-Fake-Interval-Ms": "300"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("X-Accel-Buffering") == "no"
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    arrivals = []
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            arrivals.append((time.time(), line))
    conn.close()
    events = [json.loads(l[6:]) for _, l in arrivals if l.strip() != b"data: [DONE]"]
    assert [e["index"] for e in events] == [0, 1, 2, 3, 4]
    # the first chunk was in the client's hands long before the upstream sent its last one
    first_arrival = arrivals[0][0]
    assert first_arrival < events[-1]["sent_at"] - 0.9
    # and each chunk arrived promptly after the upstream sent it (no batching on the way)
    assert all(t - e["sent_at"] < 0.25 for (t, _), e in zip(arrivals, events))


# 2. overflow to burst ----------------------------------------------------------------------

def test_saturated_floor_overflows_to_burst_without_loss_or_duplicates(gw):
    ups, port = gw["ups"], gw["ports"]["assist"]
    import concurrent.futures as cf

    for u in ups.values():
        u.release_event.clear()
    floor_before = len(ups["floor1"].log.completions()) + len(ups["floor2"].log.completions())
    burst_before = len(ups["burst"].log.completions())
    held_headers = {"X-Fake-Hold": "1", "X-Fake-Chunks": "2"}
    capacity = floor_capacity(gw["spec"].endpoint("assist").gateway.overflow_inflight_per_replica, 2)
    with cf.ThreadPoolExecutor(max_workers=capacity + 6) as pool:
        # held streams fill the floor up to its capacity (threshold x replicas, bounded-load share)
        held = [pool.submit(post, port, body(stream=True), headers=held_headers) for _ in range(capacity)]
        assert wait_until(lambda: len(ups["floor1"].log.completions()) + len(ups["floor2"].log.completions())
                          - floor_before == capacity)
        extra = [pool.submit(post, port, body(stream=True)) for _ in range(6)]
        extra_results = [f.result(timeout=10) for f in extra]
        for u in ups.values():
            u.release()
        held_results = [f.result(timeout=10) for f in held]
    # nothing waited in HAProxy's queue: the hashed replica always had a slot (%Tw is 0)
    queued = [ln for ln in gw["proc"].log_lines()
              if "fe_assist" in ln and ln.split()[4].split("/")[1] not in ("0", "-1")]
    assert queued == []
    assert all(r[0] == 200 for r in extra_results + held_results)
    assert all(b"[DONE]" in r[2] for r in extra_results + held_results)
    assert {r[1]["x-served-by"] for r in held_results} == {"floor"}
    assert {r[1]["x-served-by"] for r in extra_results} == {"burst"}
    assert len(ups["burst"].log.completions()) - burst_before == 6
    for r in extra_results + held_results:  # each request reached exactly one upstream, once
        assert len(records(gw, r[3])) == 1
    # Modal's proxy-auth came from the environment (the Secret), and only on the burst path
    burst_rec = records(gw, extra_results[0][3])[0][1]
    assert burst_rec.headers["modal-key"] == MODAL["GW_MODAL_KEY"]
    assert burst_rec.headers["modal-secret"] == MODAL["GW_MODAL_SECRET"]
    floor_rec = records(gw, held_results[0][3])[0][1]
    assert "modal-key" not in floor_rec.headers


def test_same_session_lands_on_same_floor_replica(gw):
    port = gw["ports"]["assist"]
    for session in ("s-alpha", "s-beta", "s-gamma", "s-delta"):
        sides = set()
        for _ in range(3):
            status, _, _, rid = post(port, body(), headers={"X-Session-Id": session})
            assert status == 200
            sides |= {name for name, _ in records(gw, rid)}
        assert len(sides) == 1 and sides <= {"floor1", "floor2"}


# 3. disconnects ----------------------------------------------------------------------------

def test_client_disconnect_reaches_upstream_within_one_second(gw):
    port = gw["ports"]["assist"]
    rid = str(uuid.uuid4())
    payload = json.dumps(body(stream=True)).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS['acme']}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nX-Request-Id: {rid}\r\n"
           "X-Fake-Chunks: 200\r\nX-Fake-Interval-Ms: 50\r\n\r\n").encode() + payload
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(req)
    got = b""
    while b"data: " not in got:
        chunk = sock.recv(4096)
        assert chunk, "gateway closed before the first chunk"
        got += chunk
    sock.close()
    closed_at = time.monotonic()
    assert wait_until(lambda: any(r.aborted_at for _, r in records(gw, rid)), timeout_s=3)
    (_, rec), = records(gw, rid)
    assert rec.aborted_at - closed_at < 1.0
    assert not rec.completed


# 4. per-gap timeouts -----------------------------------------------------------------------

def test_idle_gap_longer_than_inter_chunk_limit_ends_stream_with_error(gw):
    status, headers, content, rid = post(gw["ports"]["assist"], body(stream=True),
                                         headers={"X-Fake-Chunks": "3", "X-Fake-Gap-After": "0",
                                                  "X-Fake-Gap-Ms": "1600"})
    assert status == 200
    text = content.decode()
    assert '"index": 0' in text and '"index": 1' not in text
    assert "event: error" in text and "gateway_timeout" in text and "between streamed chunks" in text
    # the gateway dropped the upstream connection, so the engine would abort the generation
    assert wait_until(lambda: any(r.aborted_at for _, r in records(gw, rid)), timeout_s=3)


def test_long_stream_with_regular_chunks_is_never_cut(gw):
    # 9 chunks x 300 ms: longer than both the first-byte (2 s) and inter-chunk (1 s) limits in total
    status, _, content, _ = post(gw["ports"]["assist"], body(stream=True),
                                 headers={"X-Fake-Chunks": "9", "X-Fake-Interval-Ms": "300"})
    assert status == 200
    assert content.decode().count('"index"') == 9 and "[DONE]" in content.decode()
    assert "event: error" not in content.decode()


def test_headers_then_no_first_token_within_limit_ends_stream_with_error(gw):
    # like vLLM: headers at once, then nothing for longer than the first-byte limit (2 s here)
    status, _, content, rid = post(gw["ports"]["assist"], body(stream=True),
                                   headers={"X-Fake-First-Chunk-Ms": "2600"})
    assert status == 200
    text = content.decode()
    assert '"index"' not in text and "event: error" in text and "before the first streamed chunk" in text
    assert wait_until(lambda: any(r.aborted_at for _, r in records(gw, rid)), timeout_s=3)


def test_no_response_headers_within_limit_is_a_json_504(gw):
    # no headers at all: HAProxy's own idle timeout (first-byte limit + 1 s backstop) answers
    status, _, content, _ = post(gw["ports"]["assist"], body(stream=True), headers={"X-Fake-Ttfb-Ms": "3400"})
    assert status == 504
    assert json.loads(content)["error"]["code"] == 504


def test_heartbeats_keep_a_long_prefill_alive(gw):
    # 1.7 s before the first token (under the 2 s limit), heartbeat every 0.5 s of silence
    status, _, content, _ = post(gw["ports"]["assist"], body(stream=True),
                                 headers={"X-Fake-First-Chunk-Ms": "1700", "X-Fake-Chunks": "2"})
    assert status == 200
    text = content.decode()
    before_first = text[:text.index("data: ")]
    assert before_first.count(": keep-alive\n\n") == 3  # at 0.5, 1.0 and 1.5 s
    assert "[DONE]" in text and "event: error" not in text


def test_heartbeat_in_a_gap_between_chunks_and_none_on_a_busy_stream(gw):
    status, _, content, _ = post(gw["ports"]["assist"], body(stream=True),
                                 headers={"X-Fake-Chunks": "2", "X-Fake-Gap-After": "0", "X-Fake-Gap-Ms": "800"})
    text = content.decode()
    assert status == 200 and "[DONE]" in text and "event: error" not in text
    between = text[text.index('"index": 0'):text.index('"index": 1')]
    assert between.count(": keep-alive") == 1  # 0.5 s into the 0.8 s gap
    status, _, content, _ = post(gw["ports"]["assist"], body(stream=True),
                                 headers={"X-Fake-Chunks": "8", "X-Fake-Interval-Ms": "150"})
    assert status == 200 and ": keep-alive" not in content.decode()


# 5. retries only before generation ---------------------------------------------------------

def test_refused_connection_is_retried_once_on_another_replica(gw):
    # guard's floor: one dead replica, one live; every request must succeed, each seen once
    rids = []
    for i in range(8):
        status, _, _, rid = post(gw["ports"]["guard"], body(), key=KEYS["default"],
                                 headers={"X-Session-Id": f"guard-session-{i}"})
        assert status == 200
        rids.append(rid)
    assert all(len(records(gw, rid)) == 1 for rid in rids)
    # HAProxy logs a stream after its response has gone out: wait for all 8 lines
    assert wait_until(lambda: len([ln for ln in gw["proc"].log_lines() if "fe_guard" in ln]) >= 8)
    lines = [ln for ln in gw["proc"].log_lines() if "fe_guard" in ln]
    retries = [ln.split()[8].split("/")[-1] for ln in lines]  # %ac/%fc/%bc/%sc/%rc
    assert "+1" in retries or "1" in retries  # some request hit the dead replica and was redispatched
    assert all(r.lstrip("+") in ("0", "1") for r in retries)


def test_refused_everywhere_is_one_retry_then_json_503(gw):
    status, _, content, _ = post(gw["ports"]["autocomplete"], body(), key=KEYS["default"])
    assert status == 503
    err = json.loads(content)["error"]  # admission control (spec'd for autocomplete) answers its own overloaded body
    assert err.get("code", 503) == 503 and err["message"]
    assert wait_until(lambda: any("fe_autocomplete" in ln for ln in gw["proc"].log_lines()))
    line = [ln for ln in gw["proc"].log_lines() if "fe_autocomplete" in ln][-1]
    assert line.split()[8].split("/")[-1].lstrip("+") == "1"  # exactly one retry


def test_request_that_kills_a_replica_before_it_answers_is_not_retried(gw):
    # the upstream read the request, then closed without a byte (a replica crashing on it): retrying
    # would send the same poisoned request to the next replica
    status, _, content, rid = post(gw["ports"]["assist"], body(), headers={"X-Fake-Fail": "close-before-response"})
    assert status == 502 and json.loads(content)["error"]["code"] == 502
    time.sleep(0.3)  # a retry, if any, would have reached an upstream by now
    assert len(records(gw, rid)) == 1


def test_a_client_that_stops_reading_a_long_stream_leaves_the_gateway_up(gw):
    # a client stops reading for longer than the gap limit (1 s here) while the upstream keeps writing:
    # the gateway's buffer fills and its gap watch expires with the message unfinished. Before, the
    # event was appended to a full buffer and the end of message forced, the watch's wake-up stayed
    # pending, and the stream spun until HAProxy's watchdog aborted the process (every stream on the
    # pod lost; 2.6 and 3.0 alike). Now the stream ends cleanly with the gap event once it fits, and the
    # gateway keeps serving.
    chunks = 40000  # ≈ 6 MB: beyond the loopback socket buffers and the gateway's own buffer
    conn = http.client.HTTPConnection("127.0.0.1", gw["ports"]["assist"], timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body(stream=True)).encode(),
                     headers={"Content-Type": "application/json", "X-Request-Id": str(uuid.uuid4()),
                              "X-Fake-Chunks": str(chunks), "Authorization": f"Bearer {KEYS['acme']}"})
        resp = conn.getresponse()
        assert resp.status == 200
        time.sleep(3.0)  # the socket buffers, then the gateway's buffer fill; the gap limit passes
        text = resp.read().decode()  # the whole chunked body, its last chunk included (no IncompleteRead)
    finally:
        conn.close()
    assert text.rstrip().endswith("data: [DONE]") or text.rstrip().endswith('"code":504}}')
    assert gw["proc"].proc.poll() is None
    status, _, content, _ = post(gw["ports"]["assist"], body(stream=True))
    assert status == 200 and "[DONE]" in content.decode()


@pytest.mark.parametrize("crash", ["close-after-first-chunk", "reset-after-first-chunk"])
def test_failure_after_first_byte_is_never_retried_and_ends_with_an_error_event(gw, crash):
    # issue #18 item 6: a stream cut by an upstream crash ends with an SSE error event (and a complete
    # chunked body), so a client can tell it from a finished answer
    rid = str(uuid.uuid4())
    conn = http.client.HTTPConnection("127.0.0.1", gw["ports"]["assist"], timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body(stream=True)).encode(),
                     headers={"Content-Type": "application/json", "X-Request-Id": rid, "X-Fake-Fail": crash,
                              "Authorization": f"Bearer {KEYS['acme']}"})
        resp = conn.getresponse()
        assert resp.status == 200
        text = resp.read().decode()  # the whole chunked body, its last chunk included (no IncompleteRead)
    finally:
        conn.close()
    assert '"index": 0' in text and "[DONE]" not in text
    events = [e for e in text.split("\n\n") if e.strip()]
    assert events[-1].startswith("event: error\n")
    err = json.loads(events[-1].split("data: ", 1)[1])["error"]
    assert err["code"] == 502 and err["type"] == "upstream_error"
    time.sleep(0.3)  # a retry, if any, would have reached an upstream by now
    assert len(records(gw, rid)) == 1


# 6. input caps and authentication ----------------------------------------------------------

def test_oversized_body_gets_413_and_reaches_no_upstream(gw):
    limit = gw["spec"].endpoint("assist").gateway.max_request_body_bytes
    big = json.dumps(body(messages=[{"role": "user", "content": "x" * (limit + 10)}])).encode()
    status, _, content, rid = post(gw["ports"]["assist"], big)
    assert status == 413
    assert json.loads(content)["error"]["code"] == 413
    assert records(gw, rid) == []


def _raw_exchange(port: int, parts: list, timeout: float = 15.0) -> tuple[int, dict, bytes]:
    """Send raw request bytes (a float in `parts` pauses that many seconds) and read one response to the end:
    (status, lower-cased headers, body)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        for p in parts:
            if isinstance(p, float):
                time.sleep(p)
            else:
                sock.sendall(p)
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        try:
            content = resp.read()
        except http.client.IncompleteRead as exc:
            content = exc.partial
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, content
    finally:
        sock.close()


def _raw_post(path: str, payload: bytes, headers: list[tuple[str, str]]) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: gw", f"Authorization: Bearer {KEYS['acme']}",
            *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


def test_errors_haproxy_answers_itself_are_json(gw):
    """A body shorter than its Content-Length got HAProxy's stock HTML 408 when the body wait ran out (only its
    502-504 were JSON); every error it answers at the stream's level now reads as the API's errors. (What the HTTP/1
    parser refuses before a stream exists — a doubled Content-Length, bad chunking — is written by mux_h1's
    h1_send_error from HAProxy's fixed pages, which http-error does not reach: still HTML, tested as such so a
    release that changes it is noticed.)"""
    port = gw["ports"]["assist"]
    short = _raw_post("/v1/chat/completions", b"{}", [("Content-Type", "application/json"), ("Content-Length", "3")])
    status, headers, content = _raw_exchange(port, [short], timeout=30.0)
    assert status == 408 and headers["content-type"] == "application/json", content
    assert json.loads(content)["error"]["code"] == 408
    assert headers["connection"] == "close"  # its body was not read to the end: the connection carries no more
    doubled = ("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
               ).encode()
    status, headers, _ = _raw_exchange(port, [doubled])
    assert status == 400 and headers["content-type"] == "text/html"


def _near_cap_body(limit: int) -> bytes:
    """A chat body just under the endpoint's body cap."""
    return json.dumps(body(messages=[{"role": "user", "content": "x" * (limit - 200)}])).encode()


def test_a_model_list_request_with_a_body_is_refused_not_forwarded(gw):
    """GET /v1/models with a body was handed to the engine, body and all, on the endpoints whose list the engine
    answers; now a JSON 400, nothing upstream; without a body the list still comes from the engine."""
    port = gw["ports"]["guard"]
    key = KEYS["default"]
    listed = lambda: sum(r.path == "/v1/models" for r in gw["ups"]["guard"].log.completions())  # noqa: E731
    before = listed()
    raw = (f"GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nContent-Length: 2\r\n\r\n{{}}"
           ).encode()
    status, headers, content = _raw_exchange(port, [raw])
    assert status == 400 and headers["content-type"] == "application/json"
    assert "carries no body" in json.loads(content)["error"]["message"]
    assert listed() == before
    raw = f"GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
    status, _, _ = _raw_exchange(port, [raw])
    assert status == 200 and listed() == before + 1


def test_a_client_request_id_past_the_limit_is_refused_not_a_500(gw):
    """A 12,000-character X-Request-Id with a body near the cap was copied into the request (X-Client-Request-Id)
    and overflowed HAProxy's buffer: its own HTML 500. An id over 255 bytes is now a JSON 400 naming the
    limit, not echoed, and nothing reaches an engine; 255 bytes still pass and come back."""
    port = gw["ports"]["assist"]
    limit = gw["spec"].endpoint("assist").gateway.max_request_body_bytes
    big = _near_cap_body(limit)
    n_before = sum(len(u.log.completions()) for u in gw["ups"].values())
    status, headers, content = _raw_exchange(port, [_raw_post("/v1/chat/completions", big, [
        ("X-Request-Id", "r" * 12000), ("Content-Type", "application/json"), ("Content-Length", str(len(big)))])])
    assert status == 400 and headers["content-type"] == "application/json"
    assert "X-Request-Id is longer than 255 bytes" in json.loads(content)["error"]["message"]
    assert len(headers["x-request-id"]) < 255  # the gateway's own id, not the client's
    assert sum(len(u.log.completions()) for u in gw["ups"].values()) == n_before
    rid = "r" * 255
    status, headers, _, _ = post(port, body(), headers={"X-Request-Id": rid})
    assert status == 200 and headers["x-request-id"] == rid


def test_headers_too_large_for_a_full_body_get_431_not_a_timeout(gw):
    """The buffer holds the largest body plus 16 KB: a body near the cap under 16 KB of headers never fits, and was
    answered at once with 408 "request body not received in time", which invites the same request again. It is
    now a 431 that says how much header room a full body leaves; the same body under small headers passes."""
    port = gw["ports"]["assist"]
    limit = gw["spec"].endpoint("assist").gateway.max_request_body_bytes
    big = _near_cap_body(limit)
    hdrs = [("Content-Type", "application/json"), ("Content-Length", str(len(big)))]
    status, headers, content = _raw_exchange(port, [_raw_post("/v1/chat/completions", big,
                                                              [*hdrs, ("X-Pad", "p" * 16000)])])
    assert status == 431 and headers["content-type"] == "application/json", content
    assert "headers must stay under" in json.loads(content)["error"]["message"]
    assert headers["connection"] == "close"
    # the room the message states is what a body at the cap leaves: headers just under it pass, just over it get 431
    room = int(re.search(r"stay under (\d+) bytes", json.loads(content)["error"]["message"]).group(1))
    at_cap = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (limit - 70)}]}).encode()
    assert limit - 20 < len(at_cap) <= limit
    hdrs_at_cap = [("Content-Type", "application/json"), ("Content-Length", str(len(at_cap)))]
    base = len(_raw_post("/v1/chat/completions", b"", hdrs_at_cap)) - 4  # request line and headers, CRLFs
    for pad, want in ((room - base - 600, 200), (room - base + 800, 431)):
        status, _, content = _raw_exchange(port, [_raw_post("/v1/chat/completions", at_cap,
                                                            [*hdrs_at_cap, ("X-Pad", "p" * pad)])])
        assert status == want, (pad, content[:200])
    # a long query string counts as the request line it is (the path rule reads the path alone)
    status, _, content = _raw_exchange(port, [_raw_post("/v1/chat/completions?" + "q" * (room - base + 800), at_cap,
                                                        hdrs_at_cap)])
    assert status == 431, content[:200]
    status, _, content = _raw_exchange(port, [_raw_post("/v1/chat/completions", big, hdrs)])
    assert status == 200, content


def test_a_slow_upload_does_not_count_against_the_first_token(gw):
    """The first-byte limit ran from the request's arrival: a streamed request whose body took longer to upload
    than the limit (2 s here) was ended with an error event and its generation aborted, though the engine
    answered at once. The clock now starts once the body is in."""
    port = gw["ports"]["assist"]
    first_s = gw["spec"].endpoint("assist").gateway.first_byte_timeout_s
    payload = json.dumps(body(stream=True)).encode()
    rid = str(uuid.uuid4())
    raw = _raw_post("/v1/chat/completions", payload, [
        ("Content-Type", "application/json"), ("Content-Length", str(len(payload))), ("X-Request-Id", rid),
        ("X-Fake-Chunks", "3"), ("X-Fake-First-Chunk-Ms", "300")])  # as vLLM: headers at once, then prefill
    cut = len(raw) - len(payload) + 10
    status, _, content = _raw_exchange(port, [raw[:cut], first_s + 0.3, raw[cut:]])
    assert status == 200 and b"event: error" not in content and content.rstrip().endswith(b"data: [DONE]"), content
    (_, rec), = records(gw, rid)
    assert rec.completed and rec.aborted_at is None


def test_wrong_or_missing_api_key_gets_401(gw):
    for key in ("not-a-key", None, KEYS["default"]):  # default is autocomplete's key, not assist's
        status, _, content, rid = post(gw["ports"]["assist"], body(), key=key)
        assert status == 401
        assert json.loads(content)["error"]["type"] == "authentication_error"
        assert records(gw, rid) == []


def test_max_tokens_cap_enforced_and_left_to_the_engine_when_absent(gw):
    cap = gw["spec"].endpoint("assist").gateway.max_tokens
    status, _, content, rid = post(gw["ports"]["assist"], body(max_tokens=cap + 1))
    assert status == 400 and "max_tokens" in json.loads(content)["error"]["message"]
    assert records(gw, rid) == []
    # an escaped key name is the same key to the engine's JSON parser, so it is to the gateway
    sneaky = b'{"model":"m","max\\u005ftokens":999999,"messages":[]}'
    status, _, _, rid = post(gw["ports"]["assist"], sneaky)
    assert status == 400 and records(gw, rid) == []
    # an escaped backslash before "u005f" is a backslash in the name, not an escape: to the engine's parser this
    # body has no max_tokens at all, so the engine's own cap applies (and the gateway passes the name through)
    lookalike = b'{"model":"m","max\\\\u005ftokens":5,"messages":[]}'
    assert "max_tokens" not in json.loads(lookalike)
    status, _, _, rid = post(gw["ports"]["assist"], lookalike)
    assert status == 200 and "max_tokens" not in records(gw, rid)[0][1].body
    status, _, _, rid = post(gw["ports"]["assist"], body(max_tokens=7))
    assert status == 200 and records(gw, rid)[0][1].body["max_tokens"] == 7
    status, _, _, rid = post(gw["ports"]["assist"], body())
    assert status == 200 and "max_tokens" not in records(gw, rid)[0][1].body
    status, _, _, _ = post(gw["ports"]["assist"], b"[1, 2]")
    assert status == 400


def test_a_long_prompt_without_max_tokens_passes_vllms_length_check(gw):
    """A prompt near the product limit, no max_tokens, through the real proxy; what it forwards is judged by vLLM
    0.11.0's own request defaults, length check and output limit (tests/vllm_max_tokens.py, copied from its
    source). Chat: nothing stamped, so the prompt passes and generates at most what still fits, never more than the
    engine's cap (the stamped cap it used to forward was refused: prompt + cap > max_model_len). Completions: vLLM's
    request model defaults max_tokens to 16 and asserts it is not null, so the cap is stamped there, and a prompt
    past max_model_len − cap gets vLLM's 400 as it would with the client's own max_tokens."""
    e = gw["spec"].endpoint("assist")
    cap, limit = e.gateway.max_tokens, e.engine.max_model_len
    prompt = limit - cap // 2  # 15,360 tokens of prod assist's 16,384: within the product limit
    text = "word " * prompt  # ~1 token a word: 75 KB, inside the body cap
    args = e.engine.vllm_args("/m")  # the engine's default limit is the gateway's cap
    assert json.loads(args[args.index("--override-generation-config") + 1]) == {"max_new_tokens": cap}
    assert args[args.index("--generation-config") + 1] == "vllm" and e.engine.max_tokens == cap

    status, _, _, rid = post(gw["ports"]["assist"], body(messages=[{"role": "user", "content": text}]))
    assert status == 200
    forwarded = records(gw, rid)[0][1].body
    assert forwarded["messages"][0]["content"] == text
    asked = vllm_max_tokens.requested_max_tokens(forwarded, chat=True)
    vllm_max_tokens.validate_input(prompt, asked, limit)  # no 400
    assert vllm_max_tokens.get_max_tokens(limit, asked, prompt, cap) == cap // 2
    assert vllm_max_tokens.get_max_tokens(limit, asked, 100, cap) == cap  # a short prompt: the cap
    with pytest.raises(ValueError, match="'max_tokens' or 'max_completion_tokens' is too large"):
        vllm_max_tokens.validate_input(prompt, cap, limit)  # what the gateway used to forward

    status, _, _, rid = post(gw["ports"]["assist"], {"model": "m", "prompt": text}, path="/v1/completions")
    assert status == 200
    forwarded = records(gw, rid)[0][1].body
    asked = vllm_max_tokens.requested_max_tokens(forwarded, chat=False)
    assert asked == cap  # not vLLM's 16
    assert vllm_max_tokens.get_max_tokens(limit, asked, 100, cap) == cap
    with pytest.raises(ValueError, match="too large"):
        vllm_max_tokens.validate_input(prompt, asked, limit)
    # unstamped, the completion would have generated vLLM's default 16 tokens
    assert vllm_max_tokens.requested_max_tokens({"model": "m", "prompt": "x"}, chat=False) == 16


def test_a_completion_always_reaches_the_engine_with_a_number_in_max_tokens(gw):
    """vLLM's CompletionRequest reads max_tokens alone (no max_completion_tokens), defaults it to 16 and asserts it
    is not null while generating: a completion sent with null, with max_completion_tokens only, or with none gets
    the cap as the engine reads the forwarded body (Python's parser: the last of two equal keys wins)."""
    port, cap = gw["ports"]["assist"], gw["spec"].endpoint("assist").gateway.max_tokens
    cases = [
        (b'{"model":"m","prompt":"hi","max_tokens":null}', cap),
        (b'{"model":"m","max_tokens":null,"prompt":"hi","stream":false}', cap),
        (b'{"model":"m","prompt":"hi","max_completion_tokens":50}', cap),
        (b'{"model":"m","prompt":"hi"}', cap),
        (b'{"model":"m","prompt":"hi","max_tokens":7}', 7),
    ]
    for raw, want in cases:
        status, _, _, rid = post(port, raw, path="/v1/completions")
        assert status == 200, raw
        fwd = records(gw, rid)[0][1].body
        assert vllm_max_tokens.requested_max_tokens(fwd, chat=False) == want, (raw, fwd)
        assert fwd["prompt"] == "hi"
    status, _, _, rid = post(port, b'{"model":"m","prompt":"hi","max_tokens":null,"max_tokens":null}',
                             path="/v1/completions")
    assert status == 400 and records(gw, rid) == []
    # chat keeps the client's null (the engine's own cap applies)
    status, _, _, rid = post(port, b'{"model":"m","messages":[],"max_tokens":null}')
    assert status == 200 and records(gw, rid)[0][1].body["max_tokens"] is None


def test_body_checks_read_top_level_keys_only(gw):
    port = gw["ports"]["assist"]
    # the same words inside strings or nested objects are prompt content, not parameters
    tricky = body(messages=[{"role": "user", "content": '{"max_tokens": 999999, "cache_salt": "x"} \\" }'}],
                  metadata={"cache_salt": "nested is fine", "max_tokens": 10 ** 9, "list": [1, {"a": "}"}]},
                  stream=False)
    status, _, _, rid = post(port, tricky)
    assert status == 200
    (_, rec), = records(gw, rid)
    assert rec.body["messages"] == tricky["messages"] and rec.body["metadata"] == tricky["metadata"]
    assert "max_tokens" not in rec.body and rec.body["cache_salt"] == SALTS["acme"]
    unicode_body = json.dumps(body(messages=[{"role": "user", "content": "héllo \u2603 ☃"}]), ensure_ascii=True)
    status, _, _, rid = post(port, unicode_body.encode())
    assert status == 200 and records(gw, rid)[0][1].body["messages"][0]["content"] == "héllo \u2603 ☃"
    for broken in (b'{"model": "m", "messages": [', b'{"a" 1}', b"", b"null"):
        status, _, _, rid = post(port, broken)
        assert status == 400 and records(gw, rid) == [], broken


@pytest.mark.parametrize("broken", [
    b'{"model":"m","messages":[]} xyz',           # trailing garbage after the object
    b'{"model":"m","stream":tru}',                 # a misspelt literal
    b'{"model":"m","messages":[]}{"model":"n"}',   # two objects
    b'{"model":"m","temperature":01}',             # leading zero
    b'{"model":"m","temperature":1.}',             # a fraction without digits
    b'{"model":"m","messages":[1,]}',              # trailing comma
    b'{"model":"m","messages":[{"content":"a\x01b"}]}',  # raw control character in a string
    b'{"model":"m","messages":[{"content":"a\nb"}]}',  # raw newline in a string (whitespace only between tokens)
    b'{"model":"m",\n"stop":"x\\"\ty"}',         # raw tab after an escaped quote, newline between tokens
    b'{"model":"m","stop":"\\\\","user":"a\rb"}',   # raw carriage return in a later string
    b'{"model":"m","stop":"\\q"}',               # unknown escape
    b'{"model":"m","stop":"\\u12"}',             # short unicode escape
    b'{"model":"m","user":"\xff\xfe"}',          # not UTF-8
])
def test_malformed_json_never_reaches_the_engine(gw, broken):
    with pytest.raises(ValueError):  # the reference: Python's own parser (the engine's) refuses it too
        json.loads(broken.decode("utf-8"))
    status, _, content, rid = post(gw["ports"]["assist"], broken)
    assert status == 400, content
    assert json.loads(content)["error"]["type"] == "invalid_request_error"
    assert records(gw, rid) == []


def test_a_stream_flag_that_is_not_a_json_boolean_is_refused(gw):
    """The engine's request model (vLLM's ChatCompletionRequest: `stream: Optional[bool] = False` on a pydantic model
    that is not strict) takes 1, "true" or "on" for true and streams; the gateway would treat such a request as not
    streamed (no gap limits, no heartbeats, its Idempotency-Key claim never renewed), so it refuses it before claiming
    the key. Reference: pydantic itself, with the same field."""
    from pydantic import BaseModel, ConfigDict

    class EngineRequest(BaseModel):
        model_config = ConfigDict(extra="allow")
        stream: bool | None = False

    port = gw["ports"]["assist"]
    key = {"Idempotency-Key": f"stream-flag-{uuid.uuid4()}"}
    for value in (1, "true", "on", 0, "false", 1.0):
        EngineRequest.model_validate_json(json.dumps(body(stream=value)))  # the engine would take it
        status, _, content, rid = post(port, body(stream=value), headers=key)
        assert status == 400 and "stream must be true or false" in json.loads(content)["error"]["message"], value
        assert records(gw, rid) == []
    for value in (True, False, None):  # the key was never claimed by the refusals
        status, _, content, _ = post(port, body(stream=value), headers=key)
        assert status == 200 and (b"[DONE]" in content) == (value is True), value


def test_nesting_deeper_than_the_gateway_parses_is_refused_not_forwarded(gw):
    deep = b'{"model":"m","x":' + b"[" * 600 + b"]" * 600 + b"}"
    status, _, _, rid = post(gw["ports"]["assist"], deep)
    assert status == 400 and records(gw, rid) == []


def test_valid_json_of_every_shape_is_forwarded_intact(gw):
    nested = {"a": [1, -0.5, 2e-3, 1E+2, True, False, None, "\u00e9\"\\/\b\f\n\r\t", {"b": []}, {}]}
    payload = body(metadata=nested, stop=["\u0000", "}"], deep=[[[[[{"x": [[[]]]}]]]]])
    raw = json.dumps(payload, indent=2).encode()  # whitespace everywhere the grammar allows it
    status, _, _, rid = post(gw["ports"]["assist"], b"\r\n " + raw + b" \n")
    assert status == 200
    (_, rec), = records(gw, rid)
    assert {k: v for k, v in rec.body.items() if k not in ("max_tokens", "cache_salt")} == payload


# idempotency keys ---------------------------------------------------------------------------

def test_idempotency_key_in_flight_is_refused_and_released_when_the_stream_ends(gw):
    import concurrent.futures as cf

    ups, port = gw["ups"], gw["ports"]["assist"]
    for u in ups.values():
        u.release_event.clear()
    key = {"Idempotency-Key": f"idem-{uuid.uuid4()}"}
    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(post, port, body(stream=True), headers={**key, "X-Fake-Hold": "1", "X-Fake-Chunks": "2"})
        assert wait_until(lambda: any(r.headers.get("idempotency-key") == key["Idempotency-Key"]
                                      for u in ups.values() for r in u.log.completions()))
        status, _, content, rid = post(port, body(stream=True), headers=key)  # the client's own retry
        assert status == 409 and json.loads(content)["error"]["type"] == "conflict_error"
        assert records(gw, rid) == []  # no second generation started
        # another tenant's identical key is its own
        status, _, _, _ = post(port, body(), key=KEYS["globex"], headers=key)
        assert status == 200
        for u in ups.values():
            u.release()
        assert first.result(timeout=10)[0] == 200
    status, _, _, _ = post(port, body(), headers=key)  # finished: the key is free again
    assert status == 200


def test_one_tenants_key_on_two_endpoints_is_two_requests(gw):
    """Prod's tenant `default` calls autocomplete and guard with one API key: the same Idempotency-Key on both is two
    different requests (one Lua state holds every endpoint's claims, which were keyed by tenant name alone: the
    second got 409 and the two endpoints shared one cap). Here guard holds a stream with the key; autocomplete's
    replicas are all refused in this gateway, so its request with the key passes the gate and gets that 503."""
    import concurrent.futures as cf

    ups = gw["ups"]
    for u in ups.values():
        u.release_event.clear()
    key = {"Idempotency-Key": f"idem-{uuid.uuid4()}"}
    with cf.ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(post, gw["ports"]["guard"], body(stream=True), key=KEYS["default"],
                            headers={**key, "X-Fake-Hold": "1", "X-Fake-Chunks": "2"})
        assert wait_until(lambda: any(r.headers.get("idempotency-key") == key["Idempotency-Key"]
                                      for u in ups.values() for r in u.log.completions()))
        status, _, _, _ = post(gw["ports"]["guard"], body(), key=KEYS["default"], headers=key)
        assert status == 409  # on its own endpoint the key is in flight (the gate answers at once)
        status, _, content, _ = post(gw["ports"]["autocomplete"], body(), key=KEYS["default"], headers=key)
        assert status == 503 and json.loads(content)["error"].get("type") != "conflict_error"
        for u in ups.values():
            u.release()
        first.result(timeout=10)  # (guard's gap limit may end the held stream first: only its key matters here)


def test_idempotency_key_is_released_when_the_client_leaves(gw):
    port = gw["ports"]["assist"]
    idem = f"idem-{uuid.uuid4()}"
    payload = json.dumps(body(stream=True)).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS['acme']}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nIdempotency-Key: {idem}\r\n"
           "X-Fake-Chunks: 100\r\nX-Fake-Interval-Ms: 50\r\n\r\n").encode() + payload
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(req)
    got = b""
    while b"data: " not in got:
        chunk = sock.recv(4096)
        assert chunk
        got += chunk
    status, _, _, _ = post(port, body(), headers={"Idempotency-Key": idem})
    assert status == 409  # still streaming
    sock.close()
    assert wait_until(lambda: post(port, body(), headers={"Idempotency-Key": idem})[0] == 200, timeout_s=3)


def test_gateway_retry_keeps_the_key_and_frees_it_after(gw):
    # guard: one dead replica; requests hashed onto it are retried on the live one with their key
    before = len([ln for ln in gw["proc"].log_lines() if "fe_guard" in ln])
    for i in range(8):
        h = {"X-Session-Id": f"guard-idem-{i}", "Idempotency-Key": f"guard-key-{i}"}
        assert post(gw["ports"]["guard"], body(), key=KEYS["default"], headers=h)[0] == 200
        assert post(gw["ports"]["guard"], body(), key=KEYS["default"], headers=h)[0] == 200
    assert wait_until(lambda: len([ln for ln in gw["proc"].log_lines() if "fe_guard" in ln]) >= before + 16)
    lines = [ln for ln in gw["proc"].log_lines() if "fe_guard" in ln][before:]
    assert any(ln.split()[8].split("/")[-1].lstrip("+") == "1" for ln in lines)  # some were retried


def short_claims_spec(spec):
    """assist with Idempotency-Key claims whose first expiry is 6 s after the claim, worked by hand from HAProxy's
    waits after the gate: one connection attempt (max_retries 0) that may wait 1 s in the queue (the admission
    timeout, and the 1 s first-byte limit that is the canary's queue timeout) and 3 s to connect (`timeout
    connect`), then 2 s for the response headers (a stream's 1 s first-byte limit plus the 1 s native backstop;
    a non-streamed request's server timeout is its 2 s limit). Streams' gaps: 1 s."""
    spec = scaled_spec(spec)
    short = {"first_byte_timeout_s": 1, "inter_chunk_timeout_s": 1, "max_request_s": 2, "max_retries": 0,
             "admission_queue_timeout_s": 1.0}
    return spec.model_copy(update={"endpoints": tuple(
        e.model_copy(update={"gateway": e.gateway.model_copy(update=short)}) if e.name == "assist" else e
        for e in spec.endpoints)})


SHORT_CLAIM_MS = 1000 + 3000 + 2000  # short_claims_spec's docstring


@pytest.fixture(scope="module")
def short_claims(planned_stacks, tmp_path_factory):
    yield from _gateway(short_claims_spec(planned_stacks["prod"][1]), tmp_path_factory)


def test_idempotency_claims_last_as_long_as_their_requests(short_claims):
    """A stream is bounded per gap, not in total: one that runs past its claim's first expiry keeps its key (the
    client's retry gets 409, no second generation), and the key is free once it ends. A non-streamed answer whose
    body trickles in (the server timeout is idle time; only a stream renews its claim) does outlive its claim: the
    client's retry may then claim the key, and when the first request ends its release must free its own claim
    only, or a third copy starts beside the retry. Both run side by side (one wait for both expiries)."""
    import concurrent.futures as cf

    g = short_claims
    port = g["ports"]["assist"]
    cfg = (g["proc"].workdir / "haproxy.cfg").read_text()
    assert re.search(rf"lua\.llm_gate \S+ \S+ assist/acme \d+ {SHORT_CLAIM_MS} ", cfg)  # the expiry the waits below pass
    streamed = {"Idempotency-Key": f"long-stream-{uuid.uuid4()}"}
    trickled = {"Idempotency-Key": f"trickled-{uuid.uuid4()}"}

    def upstream_copies(key):
        return sum(r.headers.get("idempotency-key") == key["Idempotency-Key"]
                   for u in g["ups"].values() for r in u.log.completions())

    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        t0 = time.monotonic()
        # 16 chunks 0.5 s apart (8 s; every gap within the 1 s limit); 10 pieces 0.8 s apart (7.2 s; each gap within
        # the 2 s server timeout)
        first = pool.submit(post, port, body(stream=True), headers={
            **streamed, "X-Fake-Chunks": "16", "X-Fake-Interval-Ms": "500"}, timeout=30)
        slow = pool.submit(post, port, body(), headers={
            **trickled, "X-Fake-Body-Pieces": "10", "X-Fake-Interval-Ms": "800"}, timeout=30)
        assert wait_until(lambda: upstream_copies(streamed) == 1 and upstream_copies(trickled) == 1)
        time.sleep(max(0.0, t0 + SHORT_CLAIM_MS / 1000 + 0.4 - time.monotonic()))  # both claims' first expiry passed
        assert not first.done() and not slow.done()
        status, _, content, rid = post(port, body(stream=True), headers=streamed)  # the client's retry
        assert status == 409 and json.loads(content)["error"]["type"] == "conflict_error"
        assert records(g, rid) == [] and upstream_copies(streamed) == 1  # no second generation
        # the trickled answer's claim expired: its retry is served (and streams on past the first's end)
        retry = pool.submit(post, port, body(stream=True), headers={
            **trickled, "X-Fake-Chunks": "6", "X-Fake-Interval-Ms": "400"}, timeout=30)
        assert wait_until(lambda: upstream_copies(trickled) == 2, timeout_s=3)
        assert slow.result(timeout=10)[0] == 200 and not retry.done()  # the first ended; the retry streams
        status, _, _, rid = post(port, body(stream=True), headers=trickled)
        assert status == 409 and records(g, rid) == []  # the retry's claim still holds
        done = first.result(timeout=10)
        assert done[0] == 200 and b"[DONE]" in done[2] and b"event: error" not in done[2]
        assert retry.result(timeout=10)[0] == 200
    assert post(port, body(), headers=streamed)[0] == 200  # the stream ended: its key is free again
    assert post(port, body(), headers=trickled)[0] == 200


IDEM_CAP = 6
IDEM_TTL_MS = 1000  # acme's claims on the yielding gateway expire this long after the gate (unless a stream renews)


@pytest.fixture(scope="module")
def yielding(planned_stacks, tmp_path_factory):
    """The gateway with HAProxy pausing a Lua action every 5 instructions (tune.lua.forced-yield; 10000 by default,
    which a gate parsing a long body also reaches, somewhere), so gates running side by side interleave at every
    step; acme's Idempotency-Key cap and claim expiry lowered to IDEM_CAP and IDEM_TTL_MS; and the test's gate
    fault loaded."""
    def instrument(rendered, workdir):
        return instrumented(rendered, workdir, ("    tune.lua.forced-yield 5",), gate_fault=True,
                            idem_cap={"acme": (IDEM_CAP, IDEM_TTL_MS)})
    yield from _gateway(scaled_spec(planned_stacks["prod"][1]), tmp_path_factory, instrument)


def upstream_copies(g, key: str) -> int:
    return sum(r.headers.get("idempotency-key") == key for u in g["ups"].values() for r in u.log.completions())


def posts_at_once(port: int, requests: list[tuple[dict, dict]], timeout: float = 15.0) -> list[int]:
    """Each (body, headers) POSTed on its own connection, all but their last bytes sent first and the last bytes
    then back to back, so HAProxy starts their gates together; the statuses, in order, once every response is read."""
    conns = []
    for payload, headers in requests:
        data = json.dumps(payload).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in {"Authorization": f"Bearer {KEYS['acme']}", **headers}.items())
        raw = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\n{head}\r\n").encode() + data
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.connect()
        c.sock.sendall(raw[:-1])
        conns.append((c, raw[-1:]))
    try:
        for c, last in conns:
            c.sock.sendall(last)
        statuses = []
        for c, _ in conns:
            resp = http.client.HTTPResponse(c.sock, method="POST")
            resp.begin()
            resp.read()
            statuses.append(resp.status)
        return statuses
    finally:
        for c, _ in conns:
            c.close()


def test_one_key_claimed_by_gates_paused_side_by_side_starts_one_generation(yielding):
    """HAProxy pauses a Lua action wherever its instruction count runs out, and runs other requests' actions
    meanwhile. Two requests with one Idempotency-Key whose gates run side by side must still start one
    generation (the other gets 409), and the tenant's count of keys must stay exact: after such bursts it can
    still hold IDEM_CAP streams at once, and the one past them gets 429. (Before the claim ran unpaused, both
    copies went upstream and each double claim kept a slot of the cap for good.)"""
    g = yielding
    port = g["ports"]["assist"]
    stream = {"X-Fake-Chunks": "4", "X-Fake-Interval-Ms": "250"}
    keys = [f"pair-{uuid.uuid4()}" for _ in range(3)]
    statuses = posts_at_once(port, [(body(stream=True), {**stream, "Idempotency-Key": k}) for k in keys for _ in (0, 1)])
    assert [sorted(statuses[2 * i:2 * i + 2]) for i in range(len(keys))] == [[200, 409]] * len(keys)
    assert [upstream_copies(g, k) for k in keys] == [1] * len(keys)

    import concurrent.futures as cf
    held = [f"held-{uuid.uuid4()}" for _ in range(IDEM_CAP)]
    long_stream = {"X-Fake-Chunks": "8", "X-Fake-Interval-Ms": "250"}
    with cf.ThreadPoolExecutor(max_workers=IDEM_CAP) as pool:
        futs = [pool.submit(post, port, body(stream=True), headers={**long_stream, "Idempotency-Key": k}, timeout=15)
                for k in held]
        assert wait_until(lambda: all(upstream_copies(g, k) == 1 for k in held) or any(f.done() for f in futs))
        status, _, content, rid = post(port, body(), headers={"Idempotency-Key": f"extra-{uuid.uuid4()}"})
        assert status == 429 and json.loads(content)["error"]["type"] == "rate_limit_error"
        assert records(g, rid) == []
        assert [f.result(timeout=15)[0] for f in futs] == [200] * IDEM_CAP
    assert post(port, body(), headers={"Idempotency-Key": f"after-{uuid.uuid4()}"})[0] == 200  # all slots freed


def test_expired_claims_at_the_cap_are_swept_by_gates_paused_side_by_side(yielding):
    """A tenant at its cap whose claims have expired (non-streamed answers trickling in past their claims' expiry
    keep their keys until swept): a burst of new keys whose gates run side by side sweeps them, and exactly the
    cap's worth are served, each gated (the tenant's salt stamped); the rest get 429. The count stays exact: another
    burst once all is done again gets exactly IDEM_CAP through. (Before the sweep ran unpaused, a sweep paused in
    its pairs walk while other gates added and dropped keys could raise, and the request then went upstream
    ungated, or the count drifted.)"""
    import concurrent.futures as cf

    g = yielding
    port = g["ports"]["assist"]
    trickled = [f"trickled-{uuid.uuid4()}" for _ in range(IDEM_CAP)]
    stream = {"X-Fake-Chunks": "4", "X-Fake-Interval-Ms": "250"}

    def burst(tag):
        keys = [f"{tag}-{uuid.uuid4()}" for _ in range(IDEM_CAP + 2)]
        statuses = posts_at_once(port, [(body(stream=True), {**stream, "Idempotency-Key": k}) for k in keys])
        served = [k for k, st in zip(keys, statuses) if st == 200]
        assert sorted(statuses) == [200] * IDEM_CAP + [429] * 2
        assert sum(upstream_copies(g, k) for k in keys) == IDEM_CAP  # the refused ones reached nothing
        bodies = [r.body for u in g["ups"].values() for r in u.log.completions()
                  if r.headers.get("idempotency-key") in served]
        # each one gated: the tenant's salt stamped
        assert len(bodies) == IDEM_CAP and all(b.get("cache_salt") == SALTS["acme"] for b in bodies)

    with cf.ThreadPoolExecutor(max_workers=IDEM_CAP) as pool:
        slow = [pool.submit(post, port, body(), headers={"Idempotency-Key": k, "X-Fake-Body-Pieces": "10",
                                                         "X-Fake-Interval-Ms": "250"}, timeout=15) for k in trickled]
        assert wait_until(lambda: all(upstream_copies(g, k) == 1 for k in trickled))
        time.sleep(IDEM_TTL_MS / 1000 + 0.2)  # every trickled claim expired; their answers go on past it
        assert not any(f.done() for f in slow)
        burst("sweep")
        assert [f.result(timeout=15)[0] for f in slow] == [200] * IDEM_CAP
    burst("again")


def test_a_gate_that_fails_gets_a_json_500_and_nothing_reaches_the_upstream(yielding):
    """After a Lua action's runtime error HAProxy goes on with the next rules; a request whose gate failed (here
    the test's injected fault, raised after the gate claimed the request's Idempotency-Key) must not reach the
    engine unchecked and unstamped. It gets a 500 and its claim is freed (the client's retry is served)."""
    g = yielding
    port = g["ports"]["assist"]
    key = {"Idempotency-Key": f"fault-{uuid.uuid4()}"}
    status, _, content, rid = post(port, body(), headers={**key, "X-Test-Gate-Fault": "1"})
    assert status == 500 and json.loads(content)["error"]["code"] == 500
    assert records(g, rid) == [] and upstream_copies(g, key["Idempotency-Key"]) == 0
    assert wait_until(lambda: any("injected fault" in ln for ln in g["proc"].log_lines()))  # the gate did raise
    status, _, _, rid = post(port, body(), headers=key)
    assert status == 200 and len(records(g, rid)) == 1


def test_overlong_idempotency_key_is_refused(gw):
    status, _, _, rid = post(gw["ports"]["assist"], body(), headers={"Idempotency-Key": "k" * 256})
    assert status == 400 and records(gw, rid) == []


# 7. tenancy and canary ---------------------------------------------------------------------

def test_two_tenants_with_one_request_id_do_not_fail_each_other_on_a_shared_engine(gw):
    """vLLM takes X-Request-Id as the request's id and refuses a second while the first runs (0.11.0; the fake
    engine does as it does): two tenants' clients numbering their requests from 1 would fail each other on
    assist's shared floor. The engine gets the gateway's own ids (distinct), the client's id as
    X-Client-Request-Id; each client gets its own id back."""
    port = gw["ports"]["assist"]
    out = {}

    def go(tenant):
        out[tenant] = post(port, body(stream=True), key=KEYS[tenant],
                           headers={"X-Request-Id": "1", "X-Session-Id": "one-replica", "X-Fake-Chunks": "4",
                                    "X-Fake-Interval-Ms": "250"})

    threads = [threading.Thread(target=go, args=(t,)) for t in ("acme", "globex")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for tenant, (status, headers, content, _) in out.items():
        assert status == 200 and content.count(b"tok") == 4, (tenant, content[:300])
        assert headers["x-request-id"] == "1"  # the client's own id back
    recs = [(n, r) for n, u in gw["ups"].items() for r in u.log.completions() if r.request_id == "1"]
    assert len(recs) == 2 and len({n for n, _ in recs}) == 1  # both on one engine, at once
    engine_ids = {r.engine_request_id for _, r in recs}
    assert len(engine_ids) == 2 and "1" not in engine_ids
    assert all(r.headers["x-client-request-id"] == "1" for _, r in recs)
    assert not any(u.log.refused_ids for u in gw["ups"].values())
    # no id from the client: the response names the one the engine got (the gateway logs it as %ID)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body()).encode(),
                 headers={"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": "application/json",
                          "X-Client-Request-Id": "forged"})
    resp = conn.getresponse()
    resp.read()
    gateway_id = resp.getheader("X-Request-Id")
    conn.close()
    assert resp.status == 200 and re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                                                gateway_id)  # random: nothing of the pod reaches clients
    [(_, rec)] = [(n, r) for n, u in gw["ups"].items() for r in u.log.completions()
                  if r.engine_request_id == gateway_id]
    assert "x-client-request-id" not in rec.headers  # a client cannot set what the engine reads as the client's
    # refused before any upstream: the client's id comes back all the same
    status, headers, _, rid = post(port, body(), key="not-a-key")
    assert status == 401 and headers["x-request-id"] == rid



def test_tenants_with_the_same_prompt_get_their_own_cache_salt(gw):
    seen = {}
    for tenant in ("acme", "globex", "initech"):
        status, _, _, rid = post(gw["ports"]["assist"], body(), key=KEYS[tenant],
                                 headers={"X-Session-Id": "same-session"})
        assert status == 200
        (_, rec), = records(gw, rid)
        seen[tenant] = rec.body["cache_salt"]
        assert rec.body["messages"] == body()["messages"]
        assert "authorization" not in rec.headers  # the tenant's key never goes upstream
        assert rec.headers["x-gateway-tenant"] == tenant
    assert seen == SALTS
    # a client cannot pick a salt (it could then probe another tenant's cache)
    status, _, _, rid = post(gw["ports"]["assist"], body(cache_salt=SALTS["globex"]))
    assert status == 400 and records(gw, rid) == []
    status, _, _, rid = post(gw["ports"]["assist"], b'{"cache\\u005fsalt":"x","messages":[]}')
    assert status == 400 and records(gw, rid) == []


def test_same_user_always_lands_on_the_same_canary_side(gw):
    sides_by_user = {}
    for u in range(30):
        user = f"user-{u}"
        sides = set()
        for _ in range(3):
            status, headers, _, _ = post(gw["ports"]["assist"], body(), headers={"X-User-Id": user})
            assert status == 200
            sides.add(headers["x-served-by"])
        assert len(sides) == 1, f"{user} was split across {sides}"
        sides_by_user[user] = sides.pop()
    on_canary = sum(1 for s in sides_by_user.values() if s == "canary")
    assert 0 < on_canary < 30  # 30% of users, by a stable hash; some on each side
    assert set(sides_by_user.values()) <= {"canary", "floor", "burst"}


def test_rendering_for_the_cluster_uses_dns_slots_and_references_secrets(planned_stacks):
    spec = planned_stacks["prod"][1]
    r = render_gateway_config(
        spec, quality_servers=no_recorder(),
        burst_urls={"assist": "https://ws--assist.modal.run", "autocomplete": "https://ws--ac.modal.run"},
        floor_servers={e.name: DnsServers(f"{e.name}-floor.serving.svc.cluster.local", 8000, 24)
                       for e in spec.endpoints},
        canary_servers={"assist": DnsServers("assist-vllm-canary-pods.serving.svc.cluster.local", 8000, 24)},
    )
    cfg = r.files["haproxy.cfg"]
    assert "server-template floor 24 assist-floor.serving.svc.cluster.local:8000" in cfg
    assert "ssl verify required ca-file /etc/ssl/certs sni str(ws--assist.modal.run)" in cfg
    for var in r.secret_env:
        assert f"${{{var}}}" in cfg  # referenced, expanded by HAProxy from the pod's Secret env
    assert "maxconn 49" in cfg  # assist's overflow threshold per floor replica (one gateway pod)
    two_pods = render_gateway_config(
        spec, quality_servers=no_recorder(), burst_urls={"assist": "https://a.modal.run", "autocomplete": "https://b.modal.run"},
        floor_servers={e.name: DnsServers(f"{e.name}.svc", 8000, 4) for e in spec.endpoints}, gateway_replicas=2,
        canary_servers={"assist": DnsServers("assist-canary.svc", 8000, 4)},
    ).files["haproxy.cfg"]
    assert "maxconn 24 " in two_pods  # two pods: each takes half of the threshold, never more in total


def test_renderer_rejects_missing_inputs(planned_stacks):
    spec = planned_stacks["prod"][1]
    with pytest.raises(ValueError, match="needs a burst URL"):
        render_gateway_config(spec, quality_servers=no_recorder(), burst_urls={}, floor_servers={e.name: StaticServers(("127.0.0.1:1",))
                                                                  for e in spec.endpoints})
    with pytest.raises(ValueError, match="must be http"):
        render_gateway_config(spec, quality_servers=no_recorder(), burst_urls={"assist": "ftp://x", "autocomplete": "https://y"},
                              floor_servers={e.name: StaticServers(("127.0.0.1:1",)) for e in spec.endpoints},
                              canary_servers={"assist": StaticServers(("127.0.0.1:2",))})
    with pytest.raises(ValueError, match="'assist' has a shadow .* no canary servers given"):  # prod's assist is in shadow
        render_gateway_config(spec, quality_servers=no_recorder(), burst_urls={"assist": "https://x", "autocomplete": "https://y"},
                              floor_servers={e.name: StaticServers(("127.0.0.1:1",)) for e in spec.endpoints})


@pytest.mark.parametrize("method,path,status", [
    ("POST", "/sleep?level=1", 404), ("POST", "/wake_up", 404), ("POST", "/collective_rpc", 404),
    ("POST", "/reset_prefix_cache", 404), ("GET", "/server_info", 404), ("POST", "/v1/load_lora_adapter", 404),
    ("POST", "/v1/chat/completions/../../sleep", 404), ("POST", "//v1/chat/completions", 404),
    ("GET", "/metrics", 404), ("GET", "/v1/chat/completions", 405), ("POST", "/v1/models", 405),
])
def test_only_the_serving_api_reaches_an_engine(gw, method, path, status):
    """vLLM serves more than the OpenAI API on its port: with VLLM_SERVER_DEV_MODE (the burst tier's snapshots need
    /sleep and /wake_up) /sleep, /collective_rpc, /reset_prefix_cache and /server_info, with runtime LoRA updates
    /v1/load_lora_adapter. The gateway forwarded any path, and added Modal's proxy credentials on the burst path:
    a tenant's key and `POST /sleep?level=1` put a burst container's engine to sleep. Only the serving API passes."""
    rid = str(uuid.uuid4())
    conn = http.client.HTTPConnection("127.0.0.1", gw["ports"]["assist"], timeout=10)
    try:
        data = json.dumps({}).encode() if method == "POST" else None
        conn.request(method, path, body=data, headers={"Authorization": f"Bearer {KEYS['acme']}", "X-Request-Id": rid,
                                                       "Content-Type": "application/json"})
        resp = conn.getresponse()
        content = resp.read()
    finally:
        conn.close()
    assert resp.status == status, content
    assert json.loads(content)["error"]["code"] == status
    time.sleep(0.1)
    assert not [r for u in gw["ups"].values() for r in u.log.requests if r.request_id == rid]


def _models(gw, endpoint: str, key: str) -> tuple[int, dict, str]:
    rid = str(uuid.uuid4())
    conn = http.client.HTTPConnection("127.0.0.1", gw["ports"][endpoint], timeout=10)
    try:
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}", "X-Request-Id": rid})
        resp = conn.getresponse()
        content = resp.read()
    finally:
        conn.close()
    return resp.status, json.loads(content), rid


def test_the_model_list_is_served(gw, planned_stacks):
    """Single-tenant endpoints list what the engine serves; an engine shared by tenants with LoRA (prod assist)
    would list every tenant's loaded adapters (vLLM 0.11.0 serving_models.py show_available_models), so there the
    gateway answers with the base model alone, without a call upstream."""
    status, listing, rid = _models(gw, "guard", KEYS["default"])
    assert status == 200 and listing["data"][0]["id"] == "m"  # the engine's answer
    assert [r.path for u in gw["ups"].values() for r in u.log.requests if r.request_id == rid] == ["/v1/models"]
    status, listing, rid = _models(gw, "assist", KEYS["acme"])
    served = planned_stacks["prod"][1].endpoint("assist").engine.served_model_name
    assert status == 200 and [m["id"] for m in listing["data"]] == [served]
    assert not [r for u in gw["ups"].values() for r in u.log.requests if r.request_id == rid]


def test_a_tenant_cannot_use_another_tenants_adapter(gw):
    """prod assist serves per-customer LoRA adapters to three tenants on one engine, and vLLM's filesystem resolver
    loads any adapter a request names; the cache_salt keeps prefix caches apart, not adapters. An adapter named
    `<tenant>-…` is that tenant's: acme naming globex's or initech's is refused before the engine (400, nothing
    upstream), its own and any other name go through unchanged, and an escaped spelling does not get around it."""
    port = gw["ports"]["assist"]
    for model in ("globex-support", "initech-legal-v2", "glob\\u0065x-support"):
        payload = (b'{"model":"' + model.encode() + b'","messages":[{"role":"user","content":"hi"}]}')
        status, _, content, rid = post(port, payload)
        assert status == 400 and b"model is not one this API key may use" in content, (model, content)
        assert records(gw, rid) == []
    status, _, content, rid = post(port, b'{"model":"a","model":"globex-x","messages":[]}')
    assert status == 400 and b"model must appear once" in content
    for model in ("acme-support", "m", "shared-summariser"):
        status, _, _, rid = post(port, body(model=model))
        assert status == 200, model
        (_, rec), = records(gw, rid)
        assert rec.body["model"] == model
    # the same name is globex's own
    status, _, _, rid = post(port, body(model="globex-support"), key=KEYS["globex"])
    assert status == 200 and records(gw, rid)[0][1].body["model"] == "globex-support"


def test_an_adapter_named_by_a_path_is_refused(gw):
    """vLLM's filesystem resolver takes a requested name as a path under its folder (os.path.join(lora_cache_dir,
    lora_name), unchecked): "./globex-x", "acme-x/../globex-x" or an absolute path reach another tenant's adapter
    past the prefix rule, and any adapter of the base on the engine's disk. A name other than the served model's
    with a slash or backslash, or "." or "..", is refused before the engine, in any spelling; the served model's
    own name and plain adapter names go through."""
    port = gw["ports"]["assist"]
    for model in ("./globex-support", "acme-x/../globex-support", "/abs/lora/globex-support", "..", ".",
                  "acme-x\\\\..\\\\globex-support", "acme-x\\u002f..\\u002fglobex-support", "acme\\/x"):
        payload = b'{"model":"' + model.encode() + b'","messages":[{"role":"user","content":"hi"}]}'
        status, _, content, rid = post(port, payload)
        assert status == 400 and b"model names an adapter by a path" in content, (model, content)
        assert records(gw, rid) == []
    served = gw["spec"].endpoint("assist").engine.served_model_name
    for model in (served, "acme-support", "shared.summariser-v2"):
        status, _, _, rid = post(port, body(model=model))
        assert status == 200, model
        assert records(gw, rid)[0][1].body["model"] == model


def test_a_refused_completion_does_not_keep_its_idempotency_key(gw):
    """A completion refused for a duplicated max_tokens held its Idempotency-Key claim (taken before that check,
    freed by nothing): the client's corrected retry got 409 until the claim expired, minutes later."""
    port = gw["ports"]["assist"]
    key = {"Idempotency-Key": f"idem-{uuid.uuid4()}"}
    status, _, content, _ = post(port, b'{"model":"m","prompt":"x","max_tokens":5,"max_tokens":null}', headers=key,
                                 path="/v1/completions")
    assert status == 400 and b"max_tokens must be a single number" in content
    status, _, content, rid = post(port, {"model": "m", "prompt": "x", "max_tokens": 5}, headers=key,
                                   path="/v1/completions")
    assert status == 200, content
    assert len(records(gw, rid)) == 1


def test_tenant_names_that_would_blur_adapter_ownership_are_refused(planned_stacks):
    """`acme` and `acme-eu` on one engine with LoRA: acme's adapters (acme-…) would include acme-eu's."""
    from components.gateway_config import adapter_rule

    spec = planned_stacks["prod"][1]
    assist = spec.endpoint("assist")
    assert adapter_rule(assist)
    tenants = (*assist.gateway.tenants, assist.gateway.tenants[0].model_copy(update={"name": "acme-eu"}))
    blurred = assist.model_copy(update={"gateway": assist.gateway.model_copy(update={"tenants": tenants})})
    with pytest.raises(ValueError, match="tenant 'acme-eu' starts with tenant 'acme' and a dash"):
        adapter_rule(blurred)
    assert not adapter_rule(spec.endpoint("guard"))  # one tenant: nothing to keep apart
