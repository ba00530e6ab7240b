"""Observability under Pulumi's mocks: one PrometheusRule per endpoint with floor replicas, valid against the
CRD schema, every threshold the spec's figure, expressions over vLLM's own metrics only and plausible
PromQL; and the two hand-built estimates (p99 prompt tokens, prefix hit rate) fire on the right side of
their thresholds when fed synthetic counters."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

from components.floor_replicas import TRACK_METRIC_LABEL, burst_backlog_query, gateway_queues_floor, queue_query
from components.names import ENDPOINT_METRIC_LABEL
from components.observability import (
    INTER_TOKEN_BUCKETS_S,
    INTER_TOKEN_TOP_BUCKET_S,
    KV_SATURATION,
    KV_SATURATION_FOR_S,
    TTFT_BUCKETS_S,
    PREEMPTION_STORM_SHARE,
    GATEWAY_METRICS,
    KUBE_STATE_METRICS,
    VLLM_METRICS,
    Observability,
    ObservabilityArgs,
    duration,
    endpoint_alerts,
    le_label,
    rule_name,
    vllm_token_buckets,
)
from offline.mockrun import run_function
from offline.validate import validate_object, validate_objects

NS = "llm-serving"
MONITOR_LABELS = {"release": "kube-prometheus-stack"}
# What the expressions may use besides vLLM's metric names.
PROMQL_FUNCTIONS = {"sum", "avg", "max", "rate", "histogram_quantile", "count", "vector"}
KUBE_STATE_MATCHER_LABELS = {"namespace", "deployment"}
GROUPING_LABELS = {"namespace", "pod", TRACK_METRIC_LABEL, "le"}
MATCHER_LABELS = {"namespace", ENDPOINT_METRIC_LABEL, "model_name", TRACK_METRIC_LABEL, "le"}
GATEWAY_MATCHER_LABELS = {"namespace", "proxy"}
STABLE_ONLY = {"VllmFloorNotServing", "VllmQueueNotDraining", "VllmTtftSloBreach", "VllmInterTokenSloBreach", "VllmPrefixCacheHitRateDrop",
               "VllmTtftSloMaybeBreached", "VllmInterTokenSloMaybeBreached"}
ALL_TRACKS = {"VllmPreemptionStorm", "VllmKvCacheSaturated", "VllmPromptLengthShift"}


def declare(spec):
    made = []
    rec = run_function(
        lambda: made.append(Observability("observability", ObservabilityArgs(spec=spec, namespace=NS,
                                                                            monitor_labels=MONITOR_LABELS))),
        stack=spec.environment,
    )
    return rec, made[0]


@pytest.fixture(scope="module")
def declared(planned_stacks):
    """{stack: (spec, recording, component)} for every stack in stacks/."""
    return {name: (spec, *declare(spec)) for name, (_, spec) in planned_stacks.items()}


def rules_of(rec):
    return [o for o in rec.kubernetes_objects() if o["kind"] == "PrometheusRule"]


def alerts_by_name(rule_obj):
    (group,) = rule_obj["spec"]["groups"]
    return {r["alert"]: r for r in group["rules"]}


def seconds(text: str) -> int:
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert m and text, text
    h, mi, s = (int(x or 0) for x in m.groups())
    return 3600 * h + 60 * mi + s


def strip_strings(expr: str) -> str:
    return re.sub(r'"[^"\\]*"', '""', expr)


def top_level_comparison(expr: str) -> tuple[str, str, float]:
    """(query, operator, threshold) of `<query> <op> <number>`, checking the operator sits outside all brackets."""
    m = re.fullmatch(r"(?P<q>.+) (?P<op>[<>]) (?P<t>[0-9][0-9.e+-]*)", expr)
    assert m, f"no trailing comparison with a number: {expr}"
    q = strip_strings(m["q"])
    assert q.count("(") == q.count(")"), expr
    assert not re.search(r"(?<![=!])[<>]=?(?!~)", q), f"a second comparison in {expr}"
    return m["q"], m["op"], float(m["t"])


def balanced(expr: str) -> bool:
    pairs, stack = {")": "(", "}": "{", "]": "["}, []
    for c in strip_strings(expr):
        if c in "({[":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric, {label: value}) for every `metric{...}` selector."""
    out = []
    for m in re.finditer(r"([A-Za-z_:][\w:]*)\{([^}]*)\}", expr):
        matchers = {}
        for part in m[2].split(","):
            mm = re.fullmatch(r'(\w+)="([^"]*)"', part)
            assert mm, f"matcher {part!r} in {expr}"
            matchers[mm[1]] = mm[2]
        out.append((m[1], matchers))
    return out


_SUM_RATE = re.compile(r"sum\(rate\(([\w:]+)\{([^}]*)\}\[\w+\]\)\)")


def evaluate(expr: str, rate_of) -> bool:
    """Evaluate an expression whose series are all `sum(rate(metric{...}[w]))`, given each one's value
    (`rate_of(metric, matchers)`), with IEEE arithmetic as Prometheus does (x/0 = ±Inf, 0/0 = NaN)."""
    values = {}

    def substitute(m):
        name = f"v{len(values)}"
        values[name] = np.float64(rate_of(m[1], dict(re.findall(r'(\w+)="([^"]*)"', m[2]))))
        return name

    arithmetic = _SUM_RATE.sub(substitute, expr)
    assert re.fullmatch(r"[v0-9.e+\-*/()<> ]+", arithmetic), f"unsubstituted series in {arithmetic}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # division by zero is the point of two cases
        return bool(eval(arithmetic, {"__builtins__": {}}, values))  # noqa: S307 (arithmetic over v0.. only)


def cumulative_prompt_rates(prompt_lengths: list[float], max_model_len: int):
    """rate_of() for vllm:request_prompt_tokens_bucket: cumulative counts per `le` of these prompt lengths."""
    bounds = {le_label(b): b for b in vllm_token_buckets(max_model_len)} | {"+Inf": math.inf}
    lengths = np.asarray(prompt_lengths)

    def rate_of(metric, matchers):
        assert metric == "vllm:request_prompt_tokens_bucket"
        return float(np.sum(lengths <= bounds[matchers["le"]]))
    return rate_of


# ── what is declared ───────────────────────────────────────────────────────────────────────────────

def test_one_rule_per_endpoint_with_floor_replicas(declared):
    for name, (spec, rec, comp) in declared.items():
        floor = [e.name for e in spec.endpoints if e.node_pools]
        assert sorted(r["metadata"]["name"] for r in rules_of(rec)) == sorted(rule_name(e) for e in floor), name
        assert sorted(comp.rule_names) == sorted(floor)
    dev_spec, dev_rec, _ = declared["dev"]
    assert dev_spec.endpoints and not any(e.node_pools for e in dev_spec.endpoints)
    assert rules_of(dev_rec) == []
    assert len(rules_of(declared["prod"][1])) == 3


def test_component_token_children_and_labels(declared):
    spec, rec, _ = declared["prod"]
    (component,) = rec.of_type("serving:components:Observability")
    children = [r for r in rec.resources if r.parent == component.urn]
    assert sorted(r.name for r in children) == sorted(f"observability-{e.name}-{part}" for e in spec.endpoints
                                                      for part in ("rules", "dashboard"))
    assert {r.type for r in children} == {"kubernetes:monitoring.coreos.com/v1:PrometheusRule",
                                          "kubernetes:core/v1:ConfigMap"}
    for rule in rules_of(rec):
        meta = rule["metadata"]
        assert meta["namespace"] == NS
        assert meta["labels"]["release"] == "kube-prometheus-stack"  # what the Prometheus operator selects by
        endpoint = meta["labels"]["serving.llm/endpoint"]
        assert meta["name"] == rule_name(endpoint)
        assert rule["spec"]["groups"][0]["name"] == f"{endpoint}.vllm"


def test_manifests_validate_against_the_crd_schema(declared):
    for name, (_, rec, _) in declared.items():
        assert validate_objects(rec.kubernetes_objects()) == [], name
    # the validator does check PrometheusRules: a malformed duration and a misspelt field are caught
    rule = rules_of(declared["prod"][1])[0]
    bad = {**rule, "spec": {"groups": [{**rule["spec"]["groups"][0], "rules": [
        {**rule["spec"]["groups"][0]["rules"][0], "for": "5 minutes"},
        {**rule["spec"]["groups"][0]["rules"][1], "annotation": {"summary": "typo"}},
    ]}]}}
    errors = validate_object(bad)
    assert any("for" in e for e in errors) and any("annotation: unknown field" in e for e in errors), errors


# ── thresholds are the spec's figures ──────────────────────────────────────────────────────────────

def test_every_threshold_is_the_spec_figure(declared):
    spec, rec, _ = declared["prod"]
    rules = {r["metadata"]["labels"]["serving.llm/endpoint"]: alerts_by_name(r) for r in rules_of(rec)}
    for e in spec.endpoints:
        a = e.autoscaling
        reaction = math.ceil(a.polling_interval_s + a.scale_up_stabilization_s + e.herd.start_jitter_s
                             + e.pod_cold_start_s)
        expected = {  # alert: (comparison, threshold, for seconds)
            "VllmPreemptionStorm": (">", PREEMPTION_STORM_SHARE * e.capacity.planning_requests_per_s, 300),
            "VllmPrefixCacheHitRateDrop": ("<", 0.5 * e.planned_prefix_cache_hit_fraction, 900),
            "VllmQueueNotDraining": (">", a.target_waiting_per_replica, reaction),
            # the share of requests above the SLO's bucket bound, against the 1 % a p99 allows (exact: no
            # interpolation inside vLLM's buckets)
            "VllmTtftSloBreach": (">", 0.01, reaction),
            "VllmInterTokenSloBreach": (">", 0.01, reaction),
            "VllmKvCacheSaturated": (">", KV_SATURATION, KV_SATURATION_FOR_S),
            # desired replicas with no stable engine scraped, for longer than a replica needs to start on a new
            # node (assist: 540 s node cold start + 170 s jitter = 710 s, longer than its 485 s reaction)
            "VllmFloorNotServing": (">", 0, max(reaction, math.ceil(e.node_cold_start_s + e.herd.start_jitter_s))),
        }
        if a.burst_backlog_threshold is not None:  # floor_plus_burst endpoints (assist, autocomplete)
            expected["GatewayBurstBacklog"] = (">", a.burst_backlog_threshold, reaction)
        # an SLO inside one of vLLM's buckets gets a warning on the bucket's lower bound beside the critical alert
        # on its upper bound: autocomplete's 400 ms TTFT and 30 ms inter-token, guard's 300 ms TTFT
        for maybe, slo_ms, buckets in (("VllmTtftSloMaybeBreached", e.slo_ttft_p99_ms, TTFT_BUCKETS_S),
                                       ("VllmInterTokenSloMaybeBreached", e.slo_inter_token_p99_ms,
                                        INTER_TOKEN_BUCKETS_S)):
            if not any(math.isclose(b, slo_ms / 1000) for b in buckets):
                expected[maybe] = (">", 0.01, reaction)
        expected["VllmPromptLengthShift"] = (
            ">", min(1.5 * e.planned_input_tokens_p99, (e.planned_input_tokens_p99 + e.engine.max_model_len) / 2), 1800)
        assert set(rules[e.name]) == set(expected), e.name
        for alert, (op, threshold, for_s) in expected.items():
            rule = rules[e.name][alert]
            _, got_op, got = top_level_comparison(rule["expr"])
            assert got_op == op and got == pytest.approx(threshold, rel=1e-5), (e.name, alert, rule["expr"])
            assert seconds(rule["for"]) == for_s, (e.name, alert)
    # the bound each reads is the endpoint's: assist's 2.5 s SLO is a bound; autocomplete's 400 ms and guard's
    # 300 ms lie in (0.25, 0.5], so the critical alert reads 0.5 and the warning 0.25
    bound = lambda alert, name: re.findall(r'le="([^"]+)"', rules[name].get(alert, {"expr": ""})["expr"])  # noqa: E731
    assert {n: bound("VllmTtftSloBreach", n) for n in rules} == {
        "assist": ["2.5", "+Inf"], "autocomplete": ["0.5", "+Inf"], "guard": ["0.5", "+Inf"]}
    assert {n: bound("VllmTtftSloMaybeBreached", n) for n in rules} == {
        "assist": [], "autocomplete": ["0.25", "+Inf"], "guard": ["0.25", "+Inf"]}
    assert bound("VllmInterTokenSloBreach", "autocomplete") == ["0.05", "+Inf"]  # 30 ms in (25, 50]
    # queue alert waits out the autoscaler: assist's 150 s stabilization + 170 s jitter + 150 s cold start + 15 s poll
    assert seconds(rules["assist"]["VllmQueueNotDraining"]["for"]) == 485
    assert seconds(rules["assist"]["VllmFloorNotServing"]["for"]) == 710


def test_prompt_shift_stays_reachable_below_the_product_limit(declared):
    """1.5 × the planned p99 would sit above max_model_len for autocomplete and guard, where the engine rejects
    prompts: there the alert fires halfway from the planned p99 to the limit, so it can still fire."""
    spec, _, comp = declared["prod"]
    for name in ("assist", "autocomplete", "guard"):
        assert "VllmPromptLengthShift" not in comp.skipped.get(name, {})
    for name in ("autocomplete", "guard"):
        e = spec.endpoint(name)
        (alert,) = [a for a in endpoint_alerts(e, NS).alerts if a.name == "VllmPromptLengthShift"]
        assert e.planned_input_tokens_p99 < alert.threshold < e.engine.max_model_len
        assert alert.threshold == (e.planned_input_tokens_p99 + e.engine.max_model_len) / 2


def test_prefix_alert_skipped_without_a_planned_hit_share_or_prefix_caching(planned_stacks):
    e = planned_stacks["prod"][1].endpoint("assist")
    none_planned = endpoint_alerts(e.model_copy(update={"planned_prefix_cache_hit_fraction": 0.0}), NS)
    assert "VllmPrefixCacheHitRateDrop" not in {a.name for a in none_planned.alerts}
    assert "planned_prefix_cache_hit_fraction = 0" in none_planned.skipped["VllmPrefixCacheHitRateDrop"]
    no_caching = e.model_copy(update={"engine": e.engine.model_copy(update={"enable_prefix_caching": False})})
    assert "without prefix caching" in endpoint_alerts(no_caching, NS).skipped["VllmPrefixCacheHitRateDrop"]


def test_endpoints_without_floor_get_no_alerts_and_unmeasurable_slos_are_refused(planned_stacks):
    for e in planned_stacks["dev"][1].endpoints:
        assert endpoint_alerts(e, NS).alerts == ()
    e = planned_stacks["prod"][1].endpoint("guard")
    with pytest.raises(ValueError, match="slo_inter_token_p99_ms"):
        endpoint_alerts(e.model_copy(update={"slo_inter_token_p99_ms": INTER_TOKEN_TOP_BUCKET_S * 1000}), NS)


# ── the expressions ───────────────────────────────────────────────────────────────────────────────

def test_vllm_metric_list():
    assert all(m.startswith("vllm:") for m in VLLM_METRICS)
    # prometheus_client suffixes: counters _total, histogram series _bucket
    assert {m for m in VLLM_METRICS if m.endswith("_total")} == {
        "vllm:num_preemptions_total", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"}


def test_expressions_use_only_vllm_metrics_and_are_plausible_promql(declared):
    checked, used = 0, set()
    for _, (spec, rec, _) in declared.items():
        for rule_obj in rules_of(rec):
            e = spec.endpoint(rule_obj["metadata"]["labels"]["serving.llm/endpoint"])
            for alert, rule in alerts_by_name(rule_obj).items():
                expr = rule["expr"]
                assert balanced(expr), expr
                query, _, _ = top_level_comparison(expr)
                bare = strip_strings(query)
                assert bare.count('"') % 2 == 0
                sels = selectors(expr)
                assert sels, expr
                for metric, matchers in sels:
                    used.add(metric)
                    if alert == "GatewayBurstBacklog":  # the gateway's exporter: the floor's KEDA trigger query
                        assert metric in GATEWAY_METRICS and set(matchers) == GATEWAY_MATCHER_LABELS, (alert, matchers)
                        assert query == burst_backlog_query(NS, e.name)
                        continue
                    if metric in KUBE_STATE_METRICS:  # the floor's desired replicas: its stable Deployment
                        assert alert == "VllmFloorNotServing", (alert, metric)
                        assert matchers == {"namespace": NS, "deployment": f"{e.name}-vllm"}, (alert, matchers)
                        continue
                    if metric in GATEWAY_METRICS:  # under admission control the floor's queue waits in the gateway
                        assert alert == "VllmQueueNotDraining" and gateway_queues_floor(e), (alert, metric)
                        assert matchers == {"namespace": NS, "proxy": f"be_{e.name}_floor"}, (alert, matchers)
                        continue
                    assert metric in VLLM_METRICS, (alert, metric)
                    assert set(matchers) <= MATCHER_LABELS, (alert, matchers)
                    assert matchers["namespace"] == NS and matchers["model_name"] == e.engine.served_model_name
                    # the endpoint's own pods: another endpoint may serve the same model name
                    assert matchers[ENDPOINT_METRIC_LABEL] == e.name, (alert, matchers)
                    stable = matchers.get(TRACK_METRIC_LABEL)
                    assert stable == ("stable" if alert in STABLE_ONLY else None), (alert, matchers)
                # every name with a colon is a vLLM metric; every call is a known PromQL function
                assert set(re.findall(r"[A-Za-z_]\w*:[\w:]*", bare)) <= VLLM_METRICS, expr
                calls = set(re.findall(r"([A-Za-z_]\w*)\s*\(", bare)) - {"by", "on"}
                assert calls <= PROMQL_FUNCTIONS, (alert, calls)
                for grouping in re.findall(r"by \(([^)]*)\)", bare):
                    assert {g.strip() for g in grouping.split(",")} <= GROUPING_LABELS, grouping
                for window in re.findall(r"\[([^\]]*)\]", bare):
                    assert seconds(window) >= 300, (alert, window)  # at least four 15 s scrapes, never shorter
                checked += 1
    # every alert on each prod floor endpoint; guard has no burst tier; autocomplete's two SLOs and guard's TTFT lie
    # inside vLLM's buckets and add a warning each
    assert checked == 9 + (9 + 2) + (8 + 1)
    assert used == VLLM_METRICS | GATEWAY_METRICS | KUBE_STATE_METRICS  # the lists are exactly what the alerts read


def test_labels_and_annotations(declared):
    spec, rec, _ = declared["prod"]
    for rule_obj in rules_of(rec):
        endpoint = rule_obj["metadata"]["labels"]["serving.llm/endpoint"]
        for alert, rule in alerts_by_name(rule_obj).items():
            assert rule["labels"]["severity"] in ("critical", "warning")
            assert rule["labels"]["endpoint"] == endpoint
            assert rule["annotations"]["summary"].startswith(f"{endpoint}: "), rule["annotations"]
            assert spec.endpoint(endpoint).engine.served_model_name in rule["annotations"]["description"] or \
                "{{ $labels.pod }}" in rule["annotations"]["description"]
            assert rule["annotations"]["threshold"]  # the arithmetic, naming the spec fields it read
    assert alerts_by_name(rules_of(rec)[0])["VllmTtftSloBreach"]["labels"]["severity"] == "critical"


def test_queue_alert_watches_what_the_autoscaler_scales_on(declared):
    """The alert's selector is the KEDA trigger's: same namespace, endpoint, served model and stable track."""
    spec, rec, _ = declared["prod"]
    for rule_obj in rules_of(rec):
        e = spec.endpoint(rule_obj["metadata"]["labels"]["serving.llm/endpoint"])
        expr = alerts_by_name(rule_obj)["VllmQueueNotDraining"]["expr"]
        trigger = queue_query(NS, e.name, e.engine.served_model_name, e.engine.metrics.requests_waiting,
                              gateway_queues_floor(e))
        def unique(q):
            return {(m, tuple(sorted(d.items()))) for m, d in selectors(q)}
        assert unique(expr) == unique(trigger), (expr, trigger)


def test_prompt_p99_estimate_fires_only_above_the_threshold(planned_stacks):
    """Synthetic prompt lengths through the alert's own arithmetic: in vLLM's +Inf bucket (assist: 12 692
    tokens lies above the top finite bucket 10 000) and inside a finite bucket."""
    assist = planned_stacks["prod"][1].endpoint("assist")
    mid_bucket = assist.model_copy(update={"planned_input_tokens_p99": 2000.0})  # threshold 3000 in (2000, 5000]
    rng = np.random.default_rng(7)
    for e, lo, hi in ((assist, 10_000, assist.engine.max_model_len), (mid_bucket, 2000, 5000)):
        (alert,) = [a for a in endpoint_alerts(e, NS).alerts if a.name == "VllmPromptLengthShift"]
        p99, limit = e.planned_input_tokens_p99, e.engine.max_model_len
        threshold = min(1.5 * p99, (p99 + limit) / 2)  # assist: halfway to 16 384 = 12 692; mid-bucket: 3 000
        assert alert.threshold == threshold and lo < threshold <= hi
        n = 100_000
        for share_above, fires in ((0.013, True), (0.007, False)):
            # the long tail spread evenly over the threshold's bucket, so the estimate's interpolation is exact
            k_above = int(n * share_above)
            in_bucket_above = np.linspace(threshold + 1, hi, k_above)
            in_bucket_below = np.linspace(lo + 1, threshold, int(k_above * (threshold - lo) / (hi - threshold)))
            short = rng.integers(1, 1000, n - len(in_bucket_above) - len(in_bucket_below))
            lengths = list(short) + list(in_bucket_below) + list(in_bucket_above)
            true_p99 = float(np.quantile(lengths, 0.99))
            assert (true_p99 > threshold) == fires
            assert evaluate(alert.expr, cumulative_prompt_rates(lengths, e.engine.max_model_len)) == fires, share_above
        if hi < e.engine.max_model_len:
            # 10 % of prompts beyond the threshold's bucket, none in it: H = L, the estimate is +Inf, it fires
            assert evaluate(alert.expr, cumulative_prompt_rates([1.0] * 90 + [hi + 1.0] * 10, e.engine.max_model_len))
        # no traffic: 0/0 is NaN and compares false
        assert evaluate(alert.expr, cumulative_prompt_rates([], e.engine.max_model_len)) is False


def test_prefix_hit_rate_fires_below_half_the_plan(planned_stacks):
    e = planned_stacks["prod"][1].endpoint("autocomplete")
    (alert,) = [a for a in endpoint_alerts(e, NS).alerts if a.name == "VllmPrefixCacheHitRateDrop"]
    planned = e.planned_prefix_cache_hit_fraction
    for hit_rate, fires in ((planned, False), (0.55 * planned, False), (0.45 * planned, True), (0.0, True)):
        rates = {"vllm:prefix_cache_queries_total": 1000.0, "vllm:prefix_cache_hits_total": 1000.0 * hit_rate}
        assert evaluate(alert.expr, lambda m, _: rates[m]) == fires, hit_rate
    idle = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    assert evaluate(alert.expr, lambda m, _: idle[m]) is False  # an idle night is not a drop


def test_helpers_match_vllm_and_prometheus_formats():
    assert vllm_token_buckets(100) == [1, 2, 5, 10, 20, 50, 100]  # vLLM's build_1_2_5_buckets docstring
    assert vllm_token_buckets(16384)[-1] == 10000 and vllm_token_buckets(8192)[-1] == 5000
    assert [le_label(x) for x in (1, 10000, 500000, 1_000_000, 2_000_000, math.inf)] == \
        ["1.0", "10000.0", "500000.0", "1e+06", "2e+06", "+Inf"]
    assert [duration(s) for s in (300, 485, 3600, 5415)] == ["5m", "8m5s", "1h", "1h30m15s"]
    with pytest.raises(ValueError):
        duration(0)
