"""The per-endpoint Grafana dashboards: shipped as the ConfigMaps kube-prometheus-stack's Grafana sidecar loads,
every panel query parses as PromQL, the JSON model survives decoding by Grafana's own schema types, and the
hand-built queries (planned schedule, waiting per replica, burst share) return the right figures when Prometheus
itself evaluates them (promtool's expression tests).

Upstream facts: kube-prometheus-stack 88.5.3 (prometheus-community/helm-charts at cf408a2, values.yaml):
grafana.sidecar.dashboards.label `grafana_dashboard`, labelValue "1", searchNamespace ALL; datasource uid
`prometheus`. Schema: grafana-foundation-sdk (PyPI, generated from Grafana's dashboard and panel schemas).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess

import pytest
import yaml

from components.dashboards import endpoint_dashboard, schedule_query, utc_offsets_min
from components.floor_replicas import TRACK_METRIC_LABEL
from components.names import ENDPOINT_METRIC_LABEL
from components.observability import GATEWAY_METRICS, VLLM_METRICS, endpoint_alerts


def endpoint_alerts_rules(e) -> list[dict]:
    return [a.rule(e.name) for a in endpoint_alerts(e, NS).alerts]
from offline.validate import validate_objects
from tests.conftest import ROOT
from tests.prometheus_support import recorded, require_binary

NS = "llm-serving"
KNOWN_FUNCTIONS = {"sum", "count", "max", "rate", "histogram_quantile", "vector", "clamp_min", "ceil",
                   "day_of_week", "hour", "minute"}


@pytest.fixture(scope="module")
def prod():
    from topology import load_inputs, plan

    inputs = load_inputs(ROOT / "stacks/Pulumi.prod.yaml")
    return inputs, plan(inputs), recorded((ROOT / "stacks/Pulumi.prod.yaml").resolve())


def boards(rec) -> dict[str, tuple[dict, dict]]:
    out = {}
    for o in rec.kubernetes_objects():
        if o["kind"] == "ConfigMap" and o["metadata"].get("labels", {}).get("grafana_dashboard") == "1":
            (text,) = o["data"].values()
            out[o["metadata"]["labels"]["serving.llm/endpoint"]] = (o, json.loads(text))
    return out


def exprs(board: dict) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def test_one_sidecar_labelled_dashboard_per_floor_endpoint(prod):
    _, spec, rec = prod
    got = boards(rec)
    assert sorted(got) == sorted(e.name for e in spec.endpoints if e.node_pools)
    for endpoint, (cm, board) in got.items():
        assert cm["metadata"]["namespace"] == NS
        assert board["uid"] == f"llm-serving-{endpoint}" and len(board["uid"]) <= 40
        assert board["templating"]["list"][0] == {**board["templating"]["list"][0], "type": "datasource",
                                                   "query": "prometheus", "name": "datasource"}
        titles = [p["title"] for p in board["panels"]]
        must = ["TTFT p50 / p99 vs the SLO", "Inter-token latency p50 / p99 vs the SLO",
                "TTFT: share of requests over the SLO", "Inter-token latency: share of token gaps over the SLO",
                "Requests waiting per stable replica vs the KEDA target", "KV-cache usage", "Preemptions",
                "Prefix-cache hit share vs plan", "p99 prompt tokens vs plan", "Floor replicas vs the planned schedule",
                "Cost per hour by tier"]
        if spec.endpoint(endpoint).burst is not None:
            must.append("Burst: requests in flight and share")
        assert sorted(titles) == sorted(must), endpoint
    assert validate_objects([cm for cm, _ in got.values()]) == []
    # a dashboard for an endpoint without floor replicas is refused (nothing of it is scraped)
    from topology import load_inputs, plan

    dev = plan(load_inputs(ROOT / "stacks/Pulumi.dev.yaml"))
    with pytest.raises(ValueError, match="no floor replicas"):
        endpoint_dashboard(dev.endpoints[0], NS)


def test_every_panel_query_parses_and_reads_only_exported_metrics(prod):
    import promql_parser

    _, spec, rec = prod
    checked = 0
    for endpoint, (_, board) in boards(rec).items():
        served = spec.endpoint(endpoint).engine.served_model_name
        for expr in exprs(board):
            promql_parser.parse(expr.replace("$__rate_interval", "5m"))  # raises on a syntax error
            bare = re.sub(r'"[^"]*"', '""', expr)
            assert set(re.findall(r"([A-Za-z_]\w*)\s*\(", bare)) - {"by", "or"} <= KNOWN_FUNCTIONS, expr
            for metric, matchers in re.findall(r"([A-Za-z_:][\w:]*)\{([^}]*)\}", expr):
                assert metric in VLLM_METRICS | GATEWAY_METRICS, metric
                assert f'namespace="{NS}"' in matchers
                if metric.startswith("vllm:"):
                    assert f'model_name="{served}"' in matchers
            checked += 1
        # the constant lines are the plan's figures (hand-read from the spec)
        e = spec.endpoint(endpoint)
        lines = {t["legendFormat"]: t["expr"] for p in board["panels"] for t in p["targets"]
                 if t["expr"].startswith("vector(")}
        assert lines["SLO p99"] in (f"vector({e.slo_ttft_p99_ms / 1000:g})", f"vector({e.slo_inter_token_p99_ms / 1000:g})")
        assert lines["target"] == f"vector({e.autoscaling.target_waiting_per_replica:g})"
        assert lines["a p99 allows"] == "vector(0.01)"
        # the share panels read the bucket bounds the SLO alerts page on, no interpolated p99
        rules = {r["alert"]: r["expr"] for r in endpoint_alerts_rules(e)}
        panel = {p["title"]: p for p in board["panels"]}
        # vLLM observes TTFT per request and the inter-token gap per token (0.11.0 v1/metrics/loggers.py)
        for title, critical, maybe, counted in (("TTFT", "VllmTtftSloBreach", "VllmTtftSloMaybeBreached", "requests"),
                                                ("Inter-token latency", "VllmInterTokenSloBreach",
                                                 "VllmInterTokenSloMaybeBreached", "token gaps")):
            shown = {b for t in panel[f"{title}: share of {counted} over the SLO"]["targets"]
                     for b in re.findall(r'le="([^"]+)"', t["expr"])}
            paged = {b for a in (critical, maybe) if a in rules for b in re.findall(r'le="([^"]+)"', rules[a])}
            assert shown == paged and len(shown) >= 2, (endpoint, title, shown, paged)
            assert "histogram_quantile" not in " ".join(t["expr"] for t in panel[f"{title}: share of {counted} over the SLO"]["targets"])
    # a broken query is caught by the parser
    with pytest.raises(Exception):
        promql_parser.parse("sum(rate(vllm:num_preemptions_total[5m])")
    assert checked > 50


def deep_subset(ours, theirs, path="") -> list[str]:
    """Where `ours` is not contained in `theirs` (a key dropped or a value changed by the typed round trip)."""
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [f"{path}: not an object after decoding"]
        return [m for k, v in ours.items() for m in (deep_subset(v, theirs[k], f"{path}.{k}") if k in theirs
                                                      else [f"{path}.{k}: unknown to the schema"])]
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            return [f"{path}: list changed"]
        return [m for i, (a, b) in enumerate(zip(ours, theirs)) for m in deep_subset(a, b, f"{path}[{i}]")]
    return [] if ours == theirs else [f"{path}: {ours!r} became {theirs!r}"]


def test_dashboards_fit_grafanas_schema(prod):
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()  # panels and Prometheus queries decode into their typed models

    def round_trip(board):
        return json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))

    _, _, rec = prod
    for endpoint, (_, board) in boards(rec).items():
        assert deep_subset(board, round_trip(board)) == [], endpoint
        # structure Grafana relies on: unique ids, refIds per panel, panels inside the 24-column grid, no overlap
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        cells = set()
        for p in board["panels"]:
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine
            cells |= mine
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs))
    # the check has teeth: a misspelt panel field does not survive Grafana's types
    board = boards(rec)["assist"][1]
    bad = {**board, "panels": [{**board["panels"][0], "fieldconfig": {}}]}
    assert any("fieldconfig: unknown" in m for m in deep_subset(bad, round_trip(bad)))


def local_hour_of_week(t: dt.datetime, offset_min: int) -> int:
    local = t + dt.timedelta(minutes=offset_min)
    return local.weekday() * 24 + local.hour  # Monday 00:00 = hour 0


def test_queries_evaluated_by_prometheus(prod, tmp_path):
    """promtool evaluates the hand-built queries at chosen instants (its clock starts Thursday 1970-01-01 00:00 UTC)."""
    require_binary("promtool")
    inputs, spec, rec = prod
    guard, assist = spec.endpoint("guard"), spec.endpoint("assist")
    offsets = utc_offsets_min(guard.floor.timezone, 2026)
    assert offsets == {"winter": -300, "summer": -240}  # New York: EST and EDT
    epoch = dt.datetime(1970, 1, 1)
    tests = []
    for label, offset in offsets.items():
        query = schedule_query(guard.floor.replicas_by_hour, offset)
        for minutes in (0, 13 * 60, 13 * 60 + 59, 3 * 1440 + 7 * 60, 6 * 1440 + 23 * 60 + 30):
            want = guard.floor.replicas_by_hour[local_hour_of_week(epoch + dt.timedelta(minutes=minutes), offset)]
            tests.append({"expr": query, "eval_time": f"{minutes}m", "exp_samples": [{"labels": "{}", "value": want}]})
    assert len({t["exp_samples"][0]["value"] for t in tests}) > 1  # the instants see different planned sizes

    board = boards(rec)["assist"][1]
    panel = {p["title"]: p for p in board["panels"]}
    waiting = panel["Requests waiting per stable replica vs the KEDA target"]["targets"][0]["expr"]
    share = next(t["expr"] for t in panel["Burst: requests in flight and share"]["targets"] if t["legendFormat"] == "burst share")
    replicas = panel["Floor replicas vs the planned schedule"]["targets"][0]["expr"]
    base = {"namespace": NS, ENDPOINT_METRIC_LABEL: "assist", "model_name": assist.engine.served_model_name,
            "engine": "0"}
    # another endpoint serving the same model name in the same namespace: none of assist's panels may count it
    other = {**base, ENDPOINT_METRIC_LABEL: "assist-batch"}

    def series(metric, labels, value):
        return {"series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}",
                "values": f"{value}x10"}

    input_series = [
        series("vllm:num_requests_waiting", {**base, "pod": "a-0", TRACK_METRIC_LABEL: "stable"}, 3),
        series("vllm:num_requests_waiting", {**base, "pod": "a-1", TRACK_METRIC_LABEL: "stable"}, 5),
        series("vllm:num_requests_waiting", {**base, "pod": "a-c", TRACK_METRIC_LABEL: "canary"}, 40),
        series("vllm:num_requests_waiting", {**other, "pod": "b-0", TRACK_METRIC_LABEL: "stable"}, 70),
        series("vllm:num_requests_waiting", {**other, "pod": "b-c", TRACK_METRIC_LABEL: "canary"}, 9),
        *[series("haproxy_backend_current_sessions", {"namespace": NS, "pod": "gw-0", "proxy": f"be_assist_{side}"}, n)
          for side, n in (("floor", 98), ("canary", 4), ("burst", 23))],
        series("haproxy_backend_current_sessions", {"namespace": NS, "pod": "gw-0", "proxy": "be_autocomplete_burst"}, 500),
    ]
    tests += [
        {"expr": waiting, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 4}]},  # (3 + 5) / 2
        {"expr": share, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 23 / (98 + 4 + 23)}]},
        {"expr": replicas, "eval_time": "5m", "exp_samples": [
            {"labels": f'{{{TRACK_METRIC_LABEL}="stable"}}', "value": 2},
            {"labels": f'{{{TRACK_METRIC_LABEL}="canary"}}', "value": 1}]},
    ]
    doc = {"rule_files": [], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": input_series, "promql_expr_test": tests}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc, width=100_000))
    out = subprocess.run(["promtool", "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cost_lines_are_the_price_arithmetic(prod):
    """Hand figures for guard (MIG: 7 replicas share an H100) and assist (2 GPUs a replica, burst on Modal)."""
    inputs, spec, rec = prod
    on_demand = inputs.prices.dedicated_on_demand_usd_per_gpu_hour["H100-80GB"]
    discount = inputs.prices.reserved_discount_fraction
    for endpoint, (_, board) in boards(rec).items():
        e = spec.endpoint(endpoint)
        (cost,) = [p for p in board["panels"] if p["title"] == "Cost per hour by tier"]
        t = {x["legendFormat"]: x["expr"] for x in cost["targets"]}
        gpus = {"guard": 1 / 7, "assist": 2, "autocomplete": 1}[endpoint]
        assert float(t["reserved floor"][7:-1]) == pytest.approx(e.floor.reserved_replicas * gpus * on_demand * (1 - discount),
                                                                  rel=1e-5)
        assert float(t["on-demand floor"].rsplit("* ", 1)[1]) == pytest.approx(gpus * on_demand, rel=1e-5)
        if e.burst is not None:
            per_container = float(t["burst (estimated)"].rsplit("* ", 1)[1])
            p = inputs.prices
            b = e.burst
            # what Modal bills a running container an hour: its GPUs, cores and memory, times the region multiplier
            multiplier = {x.name: x for x in inputs.endpoints}[endpoint].serverless.price_multiplier
            by_hand = (b.gpus_per_container * p.serverless_usd_per_gpu_second["H100-80GB"]
                       + b.cpu_cores * p.serverless_usd_per_cpu_core_second
                       + b.memory_mib / 1024 * p.serverless_usd_per_memory_gib_second) * multiplier * 3600
            assert per_container == pytest.approx(by_hand, rel=1e-5)
