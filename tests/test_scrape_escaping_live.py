"""The floor PodMonitor's `metricRelabelings` keep the engine's `vllm:` names on a Prometheus 2.x scrape.

prometheus_client >= 0.22 (0.26 here) negotiates the exposition format: a Prometheus 2.x (Debian's 2.42 here) asks
for OpenMetrics without an `escaping` term, is answered with `escaping=underscores`, and the colon in
`vllm:num_requests_waiting` arrives as `vllm_num_requests_waiting` (client_python issue #1177): every alert, KEDA
trigger and dashboard query reads nothing. vLLM (0.11.0 and 0.13.0 checked) serves the same registry twice: the
exact `/metrics` by prometheus-fastapi-instrumentator's handler (`generate_latest`: plain text, colons kept,
whatever the scraper asks) and everything below `/metrics/` by prometheus_client's negotiating app. The fake
engine here does the same with the real library, so both answers are what a vLLM pod gives.

A real Prometheus on 127.0.0.1 scrapes it with `metric_relabel_configs` made from the rendered PodMonitor's
`metricRelabelings` the way prometheus-operator writes them (tests/prometheus_support.operator_relabel_configs);
the project's exact queue query (read from the rendered ScaledObject) must return the engine's value. The same
negotiated scrape without the rule shows the defect, and the rule must leave colon names and other metrics alone.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import pytest

from components.floor_replicas import TRACK_METRIC_LABEL, colon_restoring_relabelings, gateway_queues_floor, queue_query
from components.names import ENDPOINT_METRIC_LABEL, TRACK_STABLE
from pulumi_support import by_name, objects, recording
from tests.prometheus_support import PrometheusServer, operator_relabel_configs, require_binary

WAIT_S = 20.0  # longest wait for the scrapes to show (Prometheus 2.42 applies new targets after ~5 s, 1 s scrapes)


class VllmLikeEngine:
    """One vLLM pod's metrics routes on 127.0.0.1: `/metrics` as prometheus-fastapi-instrumentator's handler
    answers it (vLLM 0.13.0 vllm/entrypoints/serve/instrumentator/metrics.py; instrumentator 7.1.0 `expose`:
    `generate_latest(registry)`, Content-Type CONTENT_TYPE_LATEST) and `/metrics/` as the prometheus_client app
    vLLM mounts there (`make_asgi_app`; its WSGI twin here: the same `choose_encoder` negotiation)."""

    def __init__(self, model_name: str, waiting: float, requests: float):
        import prometheus_client
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
        from socketserver import ThreadingMixIn

        registry = prometheus_client.CollectorRegistry()
        gauge = prometheus_client.Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                                        labelnames=["model_name", "engine"], registry=registry)
        gauge.labels(model_name=model_name, engine="0").set(waiting)
        # the instrumentator's own HTTP counter, a name without a colon, scraped from the same route
        counter = prometheus_client.Counter("http_requests", "Total number of requests by method, status and handler.",
                                            labelnames=["handler"], registry=registry)
        counter.labels(handler="/v1/chat/completions").inc(requests)
        negotiated = prometheus_client.make_wsgi_app(registry)
        self.accept_headers: list[str] = []

        def app(environ, start_response):
            self.accept_headers.append(environ.get("HTTP_ACCEPT", ""))
            if environ["PATH_INFO"] == "/metrics":
                body = prometheus_client.generate_latest(registry)
                start_response("200 OK", [("Content-Type", prometheus_client.CONTENT_TYPE_LATEST),
                                          ("Content-Length", str(len(body)))])
                return [body]
            return negotiated(environ, start_response)

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args):
                pass

        class Threading(ThreadingMixIn, WSGIServer):
            daemon_threads = True

        self.server = make_server("127.0.0.1", 0, app, server_class=Threading, handler_class=Quiet)
        self.address = f"127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def rendered(stack: str, endpoint: str) -> tuple[dict, str, str]:
    """(the floor PodMonitor's metrics endpoint, the ScaledObject's queue query, its namespace) as rendered."""
    rec = recording(stack)
    monitor = by_name(objects(rec, "PodMonitor"))[f"{endpoint}-vllm"]
    scaled = by_name(objects(rec, "ScaledObject"))[f"{endpoint}-vllm"]
    (trigger,) = [t for t in scaled["spec"]["triggers"] if t["name"] == "requests-waiting"]
    (metrics_endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    return metrics_endpoint, trigger["metadata"]["query"], monitor["metadata"]["namespace"]


def test_every_floor_podmonitor_restores_vllm_colon_names(planned_stacks):
    """Each floor endpoint's scrape carries the rule for the prefix of its engine's metric names, in the form the
    operator's validation accepts (replace needs a target label; the regex anchors, so `vllm:x` is untouched)."""
    for stack, (_inputs, spec) in planned_stacks.items():
        monitors = by_name(objects(recording(stack), "PodMonitor"))
        for ep in spec.endpoints:
            if not ep.has_floor:
                continue
            (metrics_endpoint,) = monitors[f"{ep.name}-vllm"]["spec"]["podMetricsEndpoints"]
            assert metrics_endpoint["path"] == "/metrics"
            assert {n.partition(":")[0] for n in ep.engine.metrics.model_dump().values()} == {"vllm"}
            assert operator_relabel_configs(metrics_endpoint["metricRelabelings"]) == [{
                "source_labels": ["__name__"], "target_label": "__name__", "regex": "vllm_(.+)",
                "replacement": "vllm:$1", "action": "replace"}]


@pytest.fixture
def scraped(planned_stacks, tmp_path):
    require_binary("prometheus")
    spec = planned_stacks["prod"][1]
    served = spec.endpoint("assist").engine.served_model_name
    metrics_endpoint, query, ns = rendered("prod", "assist")
    relabel = operator_relabel_configs(metrics_endpoint["metricRelabelings"])
    with ExitStack() as stack:
        # one pod per case, in its own namespace so the project's query can name each one
        cases = {  # job: (namespace, route, the rendered metric relabelling or none, waiting, http requests)
            "negotiated-relabelled": (ns, "/metrics/", relabel, 3, 11),
            "negotiated-bare": ("llm-bare", "/metrics/", None, 5, 13),
            "vllm-route-relabelled": ("llm-text", "/metrics", relabel, 7, 17),
        }
        engines, targets, settings = {}, [], {}
        for job, (namespace, path, relabelling, waiting, requests) in cases.items():
            engine = VllmLikeEngine(served, waiting, requests)
            stack.callback(engine.stop)
            engines[job] = engine
            targets.append((job, engine.address, {"namespace": namespace, "pod": f"{job}-0",
                                                  ENDPOINT_METRIC_LABEL: "assist", TRACK_METRIC_LABEL: TRACK_STABLE}))
            settings[job] = {"metrics_path": path, **({"metric_relabel_configs": relabelling} if relabelling else {})}
        (tmp_path / "prom").mkdir()
        prom = PrometheusServer(tmp_path / "prom", targets, job_settings=settings)
        stack.callback(prom.stop)
        deadline = time.monotonic() + WAIT_S
        while len(prom.query('up == 1')) < len(cases) and time.monotonic() < deadline:
            time.sleep(0.25)
        yield {"prom": prom, "query": query, "ns": ns, "served": served, "spec": spec, "engines": engines}


def test_relabelled_negotiated_scrape_answers_the_projects_queue_query(scraped):
    prom, ns, served = scraped["prom"], scraped["ns"], scraped["served"]
    metric = scraped["spec"].endpoint("assist").engine.metrics.requests_waiting
    assert metric == "vllm:num_requests_waiting"
    ep = scraped["spec"].endpoint("assist")
    # the function is what the ScaledObject carries (assist runs admission control: the gateway's queue is added)
    assert queue_query(ns, "assist", served, metric, gateway_queues_floor(ep)) == scraped["query"]
    assert len(prom.query("up == 1")) == 3, "not every fake engine was scraped in time"
    # Prometheus 2.42 asked for OpenMetrics first, without an escaping term
    accept = scraped["engines"]["negotiated-bare"].accept_headers[0]
    assert accept.startswith("application/openmetrics-text;version=1.0.0,") and "escaping" not in accept

    # the defect: a negotiated scrape without the rule stores the escaped name, the project's query finds nothing
    assert prom.scalar(queue_query("llm-bare", "assist", served, metric)) is None
    assert prom.scalar('sum(vllm_num_requests_waiting{namespace="llm-bare"})') == 5

    # the fix: the same negotiated scrape with the PodMonitor's rule answers the rendered query verbatim
    assert prom.scalar(scraped["query"]) == 3
    # vLLM's own `/metrics` route keeps the colon: the rule does not match, the value is there once
    assert prom.scalar(queue_query("llm-text", "assist", served, metric)) == 7
    escaped = {s["metric"]["namespace"] for s in prom.query('{__name__=~"vllm_.+"}')}
    assert escaped == {"llm-bare"}  # no escaped name survives a relabelled scrape
    # other metrics pass through unchanged
    requests = {s["metric"]["namespace"]: float(s["value"][1]) for s in prom.query("http_requests_total")}
    assert requests == {ns: 11, "llm-bare": 13, "llm-text": 17}


def test_one_rule_per_colon_prefix_and_names_that_cannot_be_mapped_back_are_refused():
    assert [r["regex"] for r in colon_restoring_relabelings(("vllm:a", "vllm:b_total", "up", "sglang:c"))] == [
        "vllm_(.+)", "sglang_(.+)"]
    # underscore escaping turns `a:b:c` into `a_b_c`; one rule would restore only `a:b_c`
    with pytest.raises(ValueError, match="more than one colon"):
        colon_restoring_relabelings(("vllm:a:b",))
