"""The floor's KEDA trigger queries, run verbatim against a real Prometheus (Debian's 2.42, 127.0.0.1, 1 s scrapes,
temp storage) that scrapes a real HAProxy running the rendered gateway config while held streams load it, and
small fake vLLM engines exporting `vllm:num_requests_waiting` through prometheus_client (vLLM's own exporter
library, the gauge declared as vllm/v1/metrics/loggers.py declares it).

In the cluster the PodMonitor's relabelling adds `namespace`, `pod`, the endpoint label and the track label to
every scraped series; here the scrape config's target labels add the same, so the queries are the rendered ones,
character for character.
The servers are started once for the file; each test starts from the same gauges, upstream logs and holds.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from contextlib import ExitStack

import pytest

from components.floor_replicas import TRACK_METRIC_LABEL, scaled_object_spec
from components.names import ENDPOINT_METRIC_LABEL
from components.gateway_config import StaticServers, config_name, env_name, floor_capacity, render_gateway_config
from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import HaproxyProcess, free_port, lua_path, require_haproxy, stream_once, no_recorder
from tests.prometheus_support import PrometheusServer, operator_pod_target_labels, recorded, require_binary
from topology.calibrate import QUERIES

NS = "llm-serving"
PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"  # where KEDA would send the query
BURST_HELD = 23  # streams beyond the floor's capacity, held open at the burst upstream
WAIT_S = 20.0  # longest wait for a scrape to show a change (1 s scrapes)


class FakeEngine:
    """One vLLM pod's /metrics: the waiting-queue gauge with vLLM's label names (model_name, engine), rendered by
    prometheus_client in the Prometheus text format whatever the scraper asks for — as vLLM 0.11-0.13 answer the
    exact `/metrics` (prometheus-fastapi-instrumentator's `generate_latest` handler).

    prometheus_client's negotiating app (vLLM's `/metrics/...`) would answer this Prometheus 2.42 with
    `escaping=underscores` and `vllm_num_requests_waiting` (client_python issue #1177); the floor PodMonitor's
    `metricRelabelings` map that back, proven in test_scrape_escaping_live.py."""

    def __init__(self, model_name: str, waiting: float):
        import prometheus_client
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.registry = prometheus_client.CollectorRegistry()
        self.gauge = prometheus_client.Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                                             labelnames=["model_name", "engine"], registry=self.registry)
        self.set(model_name, waiting)
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                body = prometheus_client.generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def set(self, model_name: str, waiting: float) -> None:
        self.gauge.labels(model_name=model_name, engine="0").set(waiting)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def triggers(spec, endpoint: str) -> dict[str, dict]:
    ep = spec.endpoint(endpoint)
    return {t["name"]: t for t in scaled_object_spec(ep, f"{endpoint}-vllm", NS, PROMETHEUS_URL)["triggers"]
            if t["type"] == "prometheus"}


def wait_for_value(prom: PrometheusServer, query: str, want: float | None) -> float | None:
    deadline = time.monotonic() + WAIT_S
    got = prom.scalar(query)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.25)
        got = prom.scalar(query)
    return got


# What a test changes on the shared servers, put back before the next one: the engines' queue gauges, the
# upstreams' logs and their hold (released at a test's end).
ENGINE_WAITING = {"guard-vllm-0": 0, "assist-vllm-0": 3, "assist-vllm-1": 5, "assist-vllm-canary-0": 40,
                  "autocomplete-vllm-0": 100, "assist-vllm-0-staging": 50}


@pytest.fixture
def live(live_servers):
    """The shared servers as a test starts: every engine's gauge at its first value, the upstreams holding again
    and their logs empty (each test first waits until Prometheus shows the gauges it reads at these values)."""
    spec = live_servers["spec"]
    for pod, (engine, labels) in live_servers["engines"].items():
        model = spec.endpoint(pod.split("-vllm")[0]).engine.served_model_name
        engine.set(model, ENGINE_WAITING[pod])
    for u in live_servers["ups"].values():
        u.release_event.clear()
        with u.log.lock:
            u.log.requests.clear()
    yield live_servers
    for u in live_servers["ups"].values():
        u.release()  # nothing stays held by a failed test


@pytest.fixture(scope="module")
def live_servers(planned_stacks, tmp_path_factory):
    """HAProxy, the fake engines and Prometheus, started once for this file's tests (Prometheus 2.42 applies the
    targets of a new config only after ~5 s)."""
    tmp_path = tmp_path_factory.mktemp("trigger-queries")
    require_haproxy()
    require_binary("prometheus")
    spec = planned_stacks["prod"][1]
    # guard (dedicated, admission control): requests queued at the gateway wait 30 s instead of 0.19 s before
    # their 429, long enough for 1 s scrapes to see them
    spec = spec.model_copy(update={"endpoints": tuple(
        e.model_copy(update={"gateway": e.gateway.model_copy(update={"admission_queue_timeout_s": 30.0})})
        if e.name == "guard" else e for e in spec.endpoints)})
    with ExitStack() as stack:
        ups = {n: FakeUpstream(n).start() for n in ("floor1", "floor2", "burst")}
        for u in ups.values():
            stack.callback(u.stop)
        floors = StaticServers((ups["floor1"].address, ups["floor2"].address))
        ports = {e.name: free_port() for e in spec.endpoints if e.tier != "managed_api"}
        stats_port = free_port()
        rendered = render_gateway_config(
            spec, quality_servers=no_recorder(), burst_urls={"assist": f"http://{ups['burst'].address}", "autocomplete": f"http://{ups['burst'].address}"},
            floor_servers={e.name: floors for e in spec.endpoints}, binds={k: f"127.0.0.1:{p}" for k, p in ports.items()},
            # prod's assist is in shadow: its mirrors go to a candidate that refuses them, off the users' path
            canary_servers={e.name: StaticServers((f"127.0.0.1:{free_port()}",)) for e in spec.endpoints},
            shadow_binds={k: f"127.0.0.1:{free_port()}" for k in ports},
            stats_bind=f"127.0.0.1:{stats_port}", lua_path=lua_path(tmp_path), max_connections=2000)
        env = {var: f"value-of-{key}" for var, key in rendered.secret_env.items()}
        env[env_name("assist", "acme-api-key")] = "load-key"
        gw = HaproxyProcess(rendered, tmp_path, env, [*ports.values(), stats_port])
        stack.callback(gw.stop)

        served = spec.endpoint("assist").engine.served_model_name
        other = spec.endpoint("autocomplete").engine.served_model_name
        guard = spec.endpoint("guard").engine.served_model_name
        w = ENGINE_WAITING
        def labels(endpoint, track, namespace=NS):
            return {"namespace": namespace, ENDPOINT_METRIC_LABEL: endpoint, TRACK_METRIC_LABEL: track}

        engines = {  # pod: (engine, target labels the PodMonitor would add)
            # guard's engines never queue: the gateway holds them at the admission cap (≤ max_num_seqs)
            "guard-vllm-0": (FakeEngine(guard, w["guard-vllm-0"]), labels("guard", "stable")),
            "assist-vllm-0": (FakeEngine(served, w["assist-vllm-0"]), labels("assist", "stable")),
            "assist-vllm-1": (FakeEngine(served, w["assist-vllm-1"]), labels("assist", "stable")),
            # the canary serves the same model name: its queue is not the stable floor's
            "assist-vllm-canary-0": (FakeEngine(served, w["assist-vllm-canary-0"]), labels("assist", "canary")),
            # another endpoint's pods, and the same model in another namespace (a second environment)
            "autocomplete-vllm-0": (FakeEngine(other, w["autocomplete-vllm-0"]), labels("autocomplete", "stable")),
            "assist-vllm-0-staging": (FakeEngine(served, w["assist-vllm-0-staging"]),
                                      labels("assist", "stable", "llm-staging")),
        }
        for engine, _ in engines.values():
            stack.callback(engine.stop)
        (tmp_path / "prom").mkdir()
        prom = PrometheusServer(tmp_path / "prom", [
            ("gateway", f"127.0.0.1:{stats_port}", {"namespace": NS, "pod": "gateway-0"}),
            *[("vllm", f"127.0.0.1:{e.port}", {**labels, "pod": pod}) for pod, (e, labels) in engines.items()],
        ])
        stack.callback(prom.stop)
        yield {"spec": spec, "ups": ups, "port": ports["assist"], "prom": prom, "engines": engines, "ports": ports}


def test_queue_trigger_returns_the_stable_floors_waiting_requests(live):
    prom, spec, engines = live["prom"], live["spec"], live["engines"]
    trigger = triggers(spec, "assist")["requests-waiting"]
    query, threshold = trigger["metadata"]["query"], float(trigger["metadata"]["threshold"])
    assert trigger["metricType"] == "AverageValue"
    # 3 + 5 waiting on the two stable pods; the canary's 40, the other model's 100 and staging's 50 are not ours
    assert wait_for_value(prom, query, 8.0) == 8.0
    # KEDA hands the sum to the HPA, which divides by the threshold (AverageValue): ⌈8 / 1⌉ = 8 replicas (the
    # target under admission control: ⌊μ·w/4⌋ = ⌊1.982 × 2.142 / 4⌋ → 1, tests/test_admission_plan.py)
    assert threshold == 1 and math.ceil(8.0 / threshold) == 8
    # the query follows the gauge as the engine's queue moves
    engine, _ = engines["assist-vllm-0"]
    engine.set(spec.endpoint("assist").engine.served_model_name, 11)
    assert wait_for_value(prom, query, 16.0) == 16.0


def test_burst_backlog_trigger_returns_requests_in_flight_to_burst(live):
    prom, spec, ups, port = live["prom"], live["spec"], live["ups"], live["port"]
    trigger = triggers(spec, "assist")["burst-backlog"]
    query = trigger["metadata"]["query"]
    assert trigger["metricType"] == "Value" and trigger["metadata"]["ignoreNullValues"] == "true"
    # before any traffic HAProxy exports the backend with 0 sessions (a series, not an absent one)
    assert wait_for_value(prom, query, 0.0) == 0.0

    requests = "sum(" + QUERIES["requests_by_hour"].split("(increase(")[1].split("[1h]")[0].format(
        ns=NS, frontend=f"fe_{config_name('assist')}") + ")"
    before = prom.scalar(requests)
    assert before is not None and before <= 1  # nothing but the start-up probe yet
    capacity = floor_capacity(spec.endpoint("assist").gateway.overflow_inflight_per_replica, 2)
    payload = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Authorization": "Bearer load-key", "X-Fake-Hold": "1", "X-Fake-Chunks": "2"}
    results: list = []

    def load():
        async def run():
            return await asyncio.gather(*[stream_once(port, payload, {**headers, "X-Session-Id": f"s-{i}"}, timeout_s=40)
                                          for i in range(capacity + BURST_HELD)])
        results.extend(asyncio.run(run()))

    loader = threading.Thread(target=load)
    loader.start()
    try:
        # the floor fills to its capacity, the rest is held open at the burst tier: the trigger's value
        assert wait_for_value(prom, query, float(BURST_HELD)) == BURST_HELD
        on_floor = len(ups["floor1"].log.completions()) + len(ups["floor2"].log.completions())
        assert on_floor == capacity and len(ups["burst"].log.completions()) == BURST_HELD
        # KEDA compares it (a Value metric) with the burst's planned capacity: 23 of 588, no floor step from it
        assert float(trigger["metadata"]["threshold"]) == spec.endpoint("assist").autoscaling.burst_backlog_threshold
    finally:
        for u in ups.values():
            u.release()
        loader.join(timeout=60)
    assert len(results) == capacity + BURST_HELD and all(r[0] == 200 for r in results)
    assert wait_for_value(prom, query, 0.0) == 0.0  # streams done: the backlog is gone from the next scrape
    # the counter `calibrate` reads the hour-of-week profile from counted every request the endpoint received
    # (its increase: the harness's port probe at start-up counts too)
    assert wait_for_value(prom, requests, before + capacity + BURST_HELD) == before + capacity + BURST_HELD


GATEWAY_QUEUED = 5  # guard requests beyond the floor servers' maxconn: they wait in HAProxy


def test_under_admission_control_the_queue_trigger_counts_the_gateways_queue(live):
    """guard runs admission control: each floor server's maxconn is the admission cap (≤ max_num_seqs), so vLLM's own
    waiting gauge reads 0 while requests queue in the gateway. The trigger must count those, or a dedicated
    endpoint under a spike would never scale (it would shed instead)."""
    prom, spec, ups, engines = live["prom"], live["spec"], live["ups"], live["engines"]
    ep = spec.endpoint("guard")
    trigger = triggers(spec, "guard")["requests-waiting"]
    query = trigger["metadata"]["query"]
    assert trigger["metricType"] == "AverageValue" and trigger["metadata"]["ignoreNullValues"] == "false"
    assert wait_for_value(prom, query, 0.0) == 0.0  # no queue anywhere yet (the gateway's series read 0)
    held = floor_capacity(ep.gateway.admission_inflight_per_floor_replica, 2)  # 2 floor servers, 1 gateway pod
    payload = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Authorization": "Bearer value-of-default-api-key", "X-Fake-Hold": "1", "X-Fake-Chunks": "2"}
    results: list = []

    def load():
        async def run():
            return await asyncio.gather(*[stream_once(live["ports"]["guard"], payload, headers, timeout_s=40)
                                          for _ in range(held + GATEWAY_QUEUED)])
        results.extend(asyncio.run(run()))

    loader = threading.Thread(target=load)
    loader.start()
    try:
        # every floor slot taken, the rest queued in HAProxy: the engines still report 0 waiting
        assert wait_for_value(prom, query, float(GATEWAY_QUEUED)) == GATEWAY_QUEUED
        for name in ("haproxy_backend_current_queue", "haproxy_server_current_queue"):  # both exported, by these names
            assert prom.query(f'{name}{{proxy="be_guard_floor"}}'), name
        assert len(ups["floor1"].log.completions()) + len(ups["floor2"].log.completions()) >= held
        # the engine's queue adds to the gateway's (a replica whose KV is full queues in vLLM too)
        engines["guard-vllm-0"][0].set(ep.engine.served_model_name, 2)
        assert wait_for_value(prom, query, float(GATEWAY_QUEUED + 2)) == GATEWAY_QUEUED + 2
    finally:
        for u in ups.values():
            u.release()
        loader.join(timeout=60)
    assert len(results) == held + GATEWAY_QUEUED and all(r[0] == 200 for r in results)  # queued, then served
    assert wait_for_value(prom, query, 2.0) == 2.0  # gateway queue drained; the engine's 2 remain


def test_two_endpoints_serving_one_model_name_each_scale_on_their_own_queue(shared_model_stack, tmp_path):
    """assist and autocomplete serve one model name in one namespace (tests/conftest.py shared_model_stack); vLLM's
    series differ only by the endpoint label the PodMonitor copies from the pods. The target labels here are what
    the operator makes of the rendered PodMonitor's podTargetLabels and the rendered pods' labels, and the queries
    are the rendered ScaledObjects': one endpoint's deep queue never scales the idle other."""
    from tests.conftest import SHARED_MODEL_ENDPOINTS, SHARED_MODEL_NAME

    require_binary("prometheus")
    objs = recorded(shared_model_stack.resolve()).kubernetes_objects()

    def named(kind, name):
        (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
        return obj

    queries = {}
    for name in SHARED_MODEL_ENDPOINTS:
        (t,) = [t for t in named("ScaledObject", f"{name}-vllm")["spec"]["triggers"] if t["name"] == "requests-waiting"]
        queries[name] = t["metadata"]["query"]
    assert queries["assist"] != queries["autocomplete"]
    pods = {  # pod: (its Deployment, its first queue)
        "assist-vllm-0": ("assist-vllm", 30), "assist-vllm-1": ("assist-vllm", 12),
        "assist-vllm-canary-0": ("assist-vllm-canary", 40),  # the shadow candidate: its queue is not the floor's
        "autocomplete-vllm-0": ("autocomplete-vllm", 0), "autocomplete-vllm-1": ("autocomplete-vllm", 0),
    }
    with ExitStack() as stack:
        engines, targets = {}, []
        for pod, (deployment, waiting) in pods.items():
            pod_labels = named("Deployment", deployment)["spec"]["template"]["metadata"]["labels"]
            monitor = named("PodMonitor", f"{pod_labels['serving.llm/endpoint']}-vllm")["spec"]
            assert monitor["selector"]["matchLabels"].items() <= pod_labels.items()  # the monitor scrapes the pod
            engine = FakeEngine(SHARED_MODEL_NAME, waiting)
            stack.callback(engine.stop)
            engines[pod] = engine
            targets.append(("vllm", f"127.0.0.1:{engine.port}",
                            {"namespace": NS, "pod": pod, **operator_pod_target_labels(monitor, pod_labels)}))
        assert {t[2][ENDPOINT_METRIC_LABEL] for t in targets} == set(SHARED_MODEL_ENDPOINTS)
        (tmp_path / "prom").mkdir()
        prom = PrometheusServer(tmp_path / "prom", targets)
        stack.callback(prom.stop)

        # assist deep (30 + 12 on its stable pods), autocomplete idle
        assert wait_for_value(prom, queries["assist"], 42.0) == 42.0
        assert wait_for_value(prom, queries["autocomplete"], 0.0) == 0.0
        # the model name alone reads both endpoints' pods (and the candidate's): what the queries used to select
        assert wait_for_value(prom, f'sum(vllm:num_requests_waiting{{namespace="{NS}",model_name="{SHARED_MODEL_NAME}"}})',
                              82.0) == 82.0
        # the other way round: autocomplete deep, assist idle
        for pod, waiting in (("assist-vllm-0", 0), ("assist-vllm-1", 0), ("autocomplete-vllm-0", 25),
                             ("autocomplete-vllm-1", 9)):
            engines[pod].set(SHARED_MODEL_NAME, waiting)
        assert wait_for_value(prom, queries["autocomplete"], 34.0) == 34.0
        assert wait_for_value(prom, queries["assist"], 0.0) == 0.0
