"""Every alert the program renders, proven by Prometheus's own tool (promtool 2.42, Debian bookworm).

The rule groups come from the recorded mock run of each bundled stack (what `pulumi up` would create).
`promtool check rules` parses them; `promtool test rules` replays input series written the way vLLM and
HAProxy export them, one scenario per failure, plus a healthy period with realistic noise, and asserts the
alert, its labels and exactly when it fires (its `for` delay).

What the series follow (vllm-project/vllm, vllm/v1/metrics/loggers.py at 005a810, the v0.11 line the spec's
image pins; prometheus_client adds `_total` to counters and `_bucket{le=...}` to histograms):
  vllm:num_preemptions_total           counter, labels model_name, engine
  vllm:prefix_cache_queries_total      counter (prompt tokens looked up)
  vllm:prefix_cache_hits_total         counter (prompt tokens found)
  vllm:request_prompt_tokens_bucket    histogram, 1-2-5 buckets up to max_model_len
  vllm:num_requests_waiting            gauge
  vllm:time_to_first_token_seconds_bucket / vllm:time_per_output_token_seconds_bucket   histograms (the names are
                                       taken from the rendered rules: newer engines call the second
                                       vllm:inter_token_latency_seconds, same buckets)
  vllm:kv_cache_usage_perc             gauge, 0..1
HAProxy's built-in exporter (2.6, and 3.0 the tests run): haproxy_backend_current_sessions{proxy=...} (gauge; checked against a real
HAProxy in test_trigger_queries_live.py). The PodMonitor adds namespace, pod, the endpoint and the track label.

How Prometheus 2.42 evaluates (the hand model behind each expected firing minute): rules run every
`evaluation_interval` (1m here); range selectors are closed [t-w, t], so with one sample a minute and w a
whole number of minutes rate() sees exactly the samples of the window and does not extrapolate; an alert
fires at the first evaluation t with t - (first true evaluation) >= `for`.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from components.floor_replicas import TRACK_METRIC_LABEL
from components.names import ENDPOINT_METRIC_LABEL
from components.gateway_config import burst_backend_name
from tests.conftest import STACKS, stack_name
from tests.prometheus_support import rendered_rule_groups, require_binary, write_rule_file

NS = "llm-serving"
# failure onset: after a full healthy window (hour-long windows for the traffic-shape alerts, at most 10 minutes
# for the others); each scenario's series end at its last evaluation, which keeps promtool quick
HOUR_T0_MIN = 70
T0_MIN = 15
END_MIN = 160
TTFT_BUCKETS_S = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS_S = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                  40.0, 80.0]
REQUESTS_PER_MIN = 600  # finished requests a minute per pod in every histogram scenario


def one_two_five(limit: int) -> list[int]:
    """vLLM's build_1_2_5_buckets(max_model_len): 1, 2, 5, 10, ... up to the limit."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            if m * 10**exponent > limit:
                return out
            out.append(m * 10**exponent)
        exponent += 1


def le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))  # prometheus_client's floatToGoString below 1e6


def seconds(text: str) -> int:
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    return 3600 * int(m[1] or 0) + 60 * int(m[2] or 0) + int(m[3] or 0)


def firing_minute(first_true_min: int, for_text: str) -> int:
    """The first whole-minute evaluation at which an alert true since `first_true_min` has held `for`."""
    return first_true_min + math.ceil(seconds(for_text) / 60)


def series_text(values: list) -> str:
    """promtool's notation: numbers, `stale` (the series ends: a scrape target gone) and `_` (no sample)."""
    return " ".join(v if isinstance(v, str) else f"{v:.10g}" for v in values)


def labels_text(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def counter(per_minute) -> list[float]:
    """Cumulative values at minutes 0..END_MIN of a counter increasing by per_minute(m) in minute (m-1, m]."""
    out, total = [], 0.0
    for m in range(END_MIN + 1):
        if m:
            total += per_minute(m)
        out.append(total)
    return out


def histogram(observations_in_minute, buckets: list[float]) -> dict[str, list[float]]:
    """{le: cumulative bucket counter} of a histogram observing observations_in_minute(m) = [(value, count)]."""
    bounds = [*buckets, math.inf]
    return {le(b): counter(lambda m, b=b: sum(n for v, n in observations_in_minute(m) if v <= b)) for b in bounds}


class Endpoint:
    """The series labels and healthy figures of one endpoint, from the spec (never from the rules)."""

    def __init__(self, e):
        self.e = e
        self.base = {"namespace": NS, ENDPOINT_METRIC_LABEL: e.name, "model_name": e.engine.served_model_name,
                     "engine": "0"}
        self.stable = [{**self.base, "pod": f"{e.name}-vllm-{i}", TRACK_METRIC_LABEL: "stable"} for i in (0, 1)]
        self.canary = {**self.base, "pod": f"{e.name}-vllm-canary-0", TRACK_METRIC_LABEL: "canary"}
        self.pods = [*self.stable, self.canary]

    def alert_labels(self, **extra) -> dict[str, str]:
        severity = "critical" if extra.pop("_critical", False) else "warning"
        return {"severity": severity, "endpoint": self.e.name, **extra}


def scenario(name: str, series: list[tuple[str, dict, list[float]]], checks: list[tuple[int, str, list[dict]]]):
    last = max(t for t, _, _ in checks)
    assert last <= END_MIN
    series = [(m, lab, v[:last + 1]) for m, lab, v in series]
    return {
        "name": name,
        "interval": "1m",
        "input_series": [{"series": labels_text(m, lab), "values": series_text(v)} for m, lab, v in series],
        "alert_rule_test": [{"eval_time": f"{t}m", "alertname": a, "exp_alerts": exp} for t, a, exp in checks],
    }


def expected(rule: dict, labels: dict[str, str]) -> dict:
    """The alert as promtool reports it: its labels, and the annotations with $labels rendered (the test copy
    of the rules drops `description`, whose $value formatting is Prometheus's, not ours)."""
    def render(text):
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), text)
    return {"exp_labels": labels,
            "exp_annotations": {k: render(v) for k, v in rule["annotations"].items() if k != "description"}}


# ── the scenarios ─────────────────────────────────────────────────────────────────────────────────

def preemption_storm(ep: Endpoint, rules: dict) -> dict:
    rule = rules["VllmPreemptionStorm"]
    window_min = seconds(re.search(r"\[(\w+)\]", rule["expr"])[1]) // 60
    rps = ep.e.capacity.planning_requests_per_s
    healthy = 0.01 * rps * 60  # one preemption per 100 planned requests: noise
    storm = 1.0 * rps * 60  # as many preemptions as requests: contexts no longer fit
    series = [("vllm:num_preemptions_total", p, counter(lambda m: healthy)) for p in ep.pods[1:]]
    series.append(("vllm:num_preemptions_total", ep.stable[0],
                   counter(lambda m: storm if m > T0_MIN else healthy)))
    # storm > doctrine's 1 per 20 planned requests once a single stormy minute is in the window
    assert (storm + (window_min - 1) * healthy) / (window_min * 60) > 0.05 * rps > healthy / 60
    fire = firing_minute(T0_MIN + 1, rule["for"])
    labels = ep.alert_labels(_critical=True, namespace=NS, pod=ep.stable[0]["pod"],
                             **{TRACK_METRIC_LABEL: "stable"})
    return scenario(f"{ep.e.name}: preemption storm on one stable pod", series, [
        (fire - 1, "VllmPreemptionStorm", []),
        (fire, "VllmPreemptionStorm", [expected(rule, labels)]),
    ])


def prefix_hit_step_down(ep: Endpoint, rules: dict) -> dict:
    rule = rules["VllmPrefixCacheHitRateDrop"]
    planned = ep.e.planned_prefix_cache_hit_fraction
    after = 0.1 * planned  # a timestamp put at the front of the system prompt: almost nothing matches
    queries = 200_000.0  # prompt tokens a minute per pod
    series = []
    for p in ep.stable:
        series.append(("vllm:prefix_cache_queries_total", p, counter(lambda m: queries)))
        series.append(("vllm:prefix_cache_hits_total", p,
                       counter(lambda m: queries * (after if m > HOUR_T0_MIN else planned))))
    # a canary still hitting well does not hide the stable drop (and is not judged here)
    series.append(("vllm:prefix_cache_queries_total", ep.canary, counter(lambda m: queries)))
    series.append(("vllm:prefix_cache_hits_total", ep.canary, counter(lambda m: queries * planned)))
    # the hour's share at T0+k: 60-k minutes at the plan, k minutes after the change; first below half the plan
    first_true = HOUR_T0_MIN + next(k for k in range(61) if ((60 - k) * planned + k * after) / 60 < 0.5 * planned)
    fire = firing_minute(first_true, rule["for"])
    return scenario(f"{ep.e.name}: prefix-hit share steps down after a prompt change", series, [
        (fire - 1, "VllmPrefixCacheHitRateDrop", []),
        (fire, "VllmPrefixCacheHitRateDrop", [expected(rule, ep.alert_labels())]),
    ])


def prompt_lengths(ep: Endpoint, shifted: bool):
    """Healthy: 99.5 % of prompts at half the planned p99, 0.5 % at the product limit (the p99 stays under
    the plan). Shifted: 5 % at the limit (p99 near max_model_len)."""
    p99, limit = ep.e.planned_input_tokens_p99, ep.e.engine.max_model_len
    long_share = 0.05 if shifted else 0.005
    n = REQUESTS_PER_MIN
    return [(p99 / 2, n * (1 - long_share)), (limit - 1, n * long_share)]


def prompt_p99_shift(ep: Endpoint, rules: dict) -> dict:
    rule = rules["VllmPromptLengthShift"]
    buckets = one_two_five(ep.e.engine.max_model_len)
    series = []
    for p in ep.pods:  # both tracks see the same users, so both see the shift
        hist = histogram(lambda m: prompt_lengths(ep, m > HOUR_T0_MIN), buckets)
        series += [("vllm:request_prompt_tokens_bucket", {**p, "le": bound}, values) for bound, values in hist.items()]
    hold_min = math.ceil(seconds(rule["for"]) / 60)
    return scenario(f"{ep.e.name}: p99 prompt length shifts to the product limit", series, [
        # not true before T0+1 (the hour is all healthy), so not firing before T0+1+for
        (HOUR_T0_MIN + hold_min, "VllmPromptLengthShift", []),
        # after a whole shifted hour plus `for`, certainly firing
        (HOUR_T0_MIN + 60 + hold_min, "VllmPromptLengthShift", [expected(rule, ep.alert_labels())]),
    ])


def queue_not_draining(ep: Endpoint, rules: dict) -> dict:
    rule = rules["VllmQueueNotDraining"]
    target = ep.e.autoscaling.target_waiting_per_replica
    series = [("vllm:num_requests_waiting", p, [target / 2 if m < T0_MIN else 3 * target for m in range(END_MIN + 1)])
              for p in ep.stable]
    series.append(("vllm:num_requests_waiting", ep.canary, [0.0] * (END_MIN + 1)))
    fire = firing_minute(T0_MIN, rule["for"])  # a gauge: true at the onset's own evaluation
    return scenario(f"{ep.e.name}: the stable queue stays at 3x the target", series, [
        (fire - 1, "VllmQueueNotDraining", []),
        (fire, "VllmQueueNotDraining", [expected(rule, ep.alert_labels())]),
    ])


def latency_series(rules: dict, alert: str, e) -> tuple[str, list[float], float]:
    """The histogram the rendered rule reads (an engine-version table may rename the inter-token one, e.g. to
    vllm:inter_token_latency_seconds, which has the same buckets), its vLLM buckets and the SLO in seconds."""
    metric = re.search(r"rate\(([\w:]+_bucket)\{", rules[alert]["expr"])[1]
    if alert.startswith("VllmTtftSlo"):
        return metric, TTFT_BUCKETS_S, e.slo_ttft_p99_ms / 1000
    return metric, TPOT_BUCKETS_S, e.slo_inter_token_p99_ms / 1000


def latency_histograms(ep: Endpoint, metric: str, buckets: list[float], fast: float, slow: float,
                       breach_share: float) -> list:
    """Every pod's latency histogram: requests at `fast` but a share at `slow` — 0.5 % while healthy, and
    `breach_share` on the stable pods after T0 (the canary stays healthy: the SLO alerts read the stable track)."""
    n = REQUESTS_PER_MIN

    def observed(m, breach):
        share = breach_share if breach and m > T0_MIN else 0.005
        return [(fast, n * (1 - share)), (slow, n * share)]

    series = []
    for p in ep.pods:
        hist = histogram(lambda m, b=p is not ep.canary: observed(m, b), buckets)
        series += [(metric, {**p, "le": bound}, v) for bound, v in hist.items()]
    return series


def latency_breach(ep: Endpoint, rules: dict, alert: str) -> dict:
    rule = rules[alert]
    metric, buckets, slo_s = latency_series(rules, alert, ep.e)
    fast, slow = slo_s / 4, min(4 * slo_s, buckets[-1])
    # the construction holds: the fast bucket lies wholly under the SLO, the slow one wholly above
    assert next(b for b in buckets if b >= fast) < slo_s <= max(b for b in buckets if b < slow)
    series = latency_histograms(ep, metric, buckets, fast, slow, breach_share=0.2)
    # one breaching minute in the window already puts the p99 in the slow bucket: true from T0+1
    fire = firing_minute(T0_MIN + 1, rule["for"])
    return scenario(f"{ep.e.name}: {alert} (20 % of requests at 4x the SLO)", series, [
        (fire - 1, alert, []),
        (fire, alert, [expected(rule, ep.alert_labels(_critical=True))]),
    ])


def latency_inside_the_slo_bucket(ep: Endpoint, rules: dict, maybe: str, critical: str) -> dict:
    """An SLO inside one of vLLM's buckets (autocomplete's 400 ms TTFT in (250, 500]): 5 % of requests land between
    the bucket's lower bound and the SLO's. The histogram cannot tell them from requests above the SLO: the warning
    fires, the critical page stays silent (it fires only when more than 1 % exceed the bucket's upper bound, a
    certain breach). With histogram_quantile against the SLO the critical page fired here, the SLO met (4 % in
    (250, 400] ms gave an estimate of 437 ms), and stayed silent with 2 % at 450 ms, the SLO broken."""
    rule = rules[maybe]
    metric, buckets, slo_s = latency_series(rules, maybe, ep.e)
    lo = max(b for b in buckets if b < slo_s)
    middle = (lo + slo_s) / 2  # inside the bucket, under the SLO: the SLO is met
    series = latency_histograms(ep, metric, buckets, slo_s / 4, middle, breach_share=0.05)
    fire = firing_minute(T0_MIN + 1, rule["for"])
    return scenario(f"{ep.e.name}: {maybe} (5 % of requests inside the SLO's bucket, under the SLO)", series, [
        (fire - 1, maybe, []),
        (fire, maybe, [expected(rule, ep.alert_labels())]),
        (fire, critical, []),
        (END_MIN, critical, []),
    ])


def kv_saturation(ep: Endpoint, rules: dict) -> dict:
    rule = rules["VllmKvCacheSaturated"]
    series = [("vllm:kv_cache_usage_perc", p, [0.7] * (END_MIN + 1)) for p in ep.stable[1:]]
    # the canary is at its memory edge: per-pod engine health reads both tracks
    series.append(("vllm:kv_cache_usage_perc", ep.canary, [0.7 if m < T0_MIN else 0.99 for m in range(END_MIN + 1)]))
    series.append(("vllm:kv_cache_usage_perc", ep.stable[0], [0.7] * (END_MIN + 1)))
    fire = firing_minute(T0_MIN, rule["for"])
    labels = ep.alert_labels(namespace=NS, pod=ep.canary["pod"], **{TRACK_METRIC_LABEL: "canary"})
    return scenario(f"{ep.e.name}: KV cache saturated on the canary pod", series, [
        (fire - 1, "VllmKvCacheSaturated", []),
        (fire, "VllmKvCacheSaturated", [expected(rule, labels)]),
    ])


def burst_backlog(ep: Endpoint, rules: dict) -> dict:
    rule = rules["GatewayBurstBacklog"]
    threshold = ep.e.autoscaling.burst_backlog_threshold
    proxy = burst_backend_name(ep.e.name)
    # two gateway pods, each holding half the requests in flight to the burst backend
    series = [("haproxy_backend_current_sessions", {"namespace": NS, "pod": f"gateway-{i}", "proxy": proxy},
               [threshold / 4 if m < T0_MIN else 0.75 * threshold for m in range(END_MIN + 1)]) for i in (0, 1)]
    series.append(("haproxy_backend_current_sessions", {"namespace": NS, "pod": "gateway-0", "proxy": f"be_{ep.e.name}_floor"},
                   [10 * threshold] * (END_MIN + 1)))  # the floor backend's sessions are not burst backlog
    fire = firing_minute(T0_MIN, rule["for"])
    return scenario(f"{ep.e.name}: burst backlog 1.5x the floor trigger's threshold", series, [
        (fire - 1, "GatewayBurstBacklog", []),
        (fire, "GatewayBurstBacklog", [expected(rule, ep.alert_labels())]),
    ])


def desired_replicas(ep: Endpoint, values: list[float]) -> tuple[str, dict, list[float]]:
    """kube-state-metrics' desired replicas of the endpoint's stable Deployment (labels as its ServiceMonitor keeps
    them: the object's namespace and name)."""
    return ("kube_deployment_spec_replicas", {"namespace": NS, "deployment": f"{ep.e.name}-vllm"}, values)


def floor_not_serving(ep: Endpoint, rules: dict) -> dict:
    """The stable pods crash-loop from T0 (their series go stale) while the Deployment still asks for 2; at minute
    120 the clock scales the floor to 0 and the page resolves. The canary's engine still reports throughout: it is
    not the floor."""
    rule = rules["VllmFloorNotServing"]
    target = ep.e.autoscaling.target_waiting_per_replica
    gone = [target / 2 if m < T0_MIN else ("stale" if m == T0_MIN else "_") for m in range(END_MIN + 1)]
    series = [("vllm:num_requests_waiting", p, gone) for p in ep.stable]
    series.append(("vllm:num_requests_waiting", ep.canary, [0.0] * (END_MIN + 1)))
    series.append(desired_replicas(ep, [2.0 if m < 120 else 0.0 for m in range(END_MIN + 1)]))
    fire = firing_minute(T0_MIN, rule["for"])
    assert fire < 120, "the scenario needs the page to fire before the floor is scaled to 0"
    firing = expected(rule, ep.alert_labels(_critical=True))
    return scenario(f"{ep.e.name}: the stable engines stop reporting while the floor wants 2", series, [
        (T0_MIN - 1, "VllmFloorNotServing", []),
        (fire - 1, "VllmFloorNotServing", []),
        (fire, "VllmFloorNotServing", [firing]),
        (121, "VllmFloorNotServing", []),  # scaled to 0 by the clock: no engine is expected
    ])


def healthy_period(ep: Endpoint, rules: dict) -> dict:
    """Two healthy hours with the noise production has: a canary with a long queue, a three-minute KV spike,
    a slow tail under the p99, the odd preemption, a burst tier busy below its capacity."""
    e = ep.e
    series = []
    minutes = range(END_MIN + 1)
    for p in ep.pods:
        series.append(("vllm:num_preemptions_total", p, counter(lambda m: 0.01 * e.capacity.planning_requests_per_s * 60)))
        series.append(("vllm:prefix_cache_queries_total", p, counter(lambda m: 200_000.0)))
        series.append(("vllm:prefix_cache_hits_total", p, counter(lambda m: 200_000.0 * e.planned_prefix_cache_hit_fraction)))
        hist = histogram(lambda m: prompt_lengths(ep, False), one_two_five(e.engine.max_model_len))
        series += [("vllm:request_prompt_tokens_bucket", {**p, "le": b}, v) for b, v in hist.items()]
        for metric, buckets, slo_s in (latency_series(rules, a, e) for a in ("VllmTtftSloBreach", "VllmInterTokenSloBreach")):
            obs = [(slo_s / 4, REQUESTS_PER_MIN * 0.995), (min(4 * slo_s, buckets[-1]), REQUESTS_PER_MIN * 0.005)]
            hist = histogram(lambda m, o=obs: o, buckets)
            series += [(metric, {**p, "le": b}, v) for b, v in hist.items()]
        target = e.autoscaling.target_waiting_per_replica
        waiting = 20 * target if p is ep.canary else target  # at the target, not above; the canary is not scaled
        series.append(("vllm:num_requests_waiting", p, [waiting] * (END_MIN + 1)))
        spike = p is ep.stable[0]
        series.append(("vllm:kv_cache_usage_perc", p, [0.99 if spike and 60 <= m < 63 else 0.8 for m in minutes]))
    if e.autoscaling.burst_backlog_threshold is not None:
        series.append(("haproxy_backend_current_sessions", {"namespace": NS, "pod": "gateway-0",
                                                            "proxy": burst_backend_name(e.name)},
                       [0.9 * e.autoscaling.burst_backlog_threshold] * (END_MIN + 1)))
    series.append(desired_replicas(ep, [2.0] * (END_MIN + 1)))
    checks = [(t, alert, []) for alert in rules for t in (30, 62, 70, 100, 130)]
    return scenario(f"{e.name}: a healthy period", series, checks)


FAILURES = {
    "VllmPreemptionStorm": preemption_storm,
    "VllmPrefixCacheHitRateDrop": prefix_hit_step_down,
    "VllmPromptLengthShift": prompt_p99_shift,
    "VllmQueueNotDraining": queue_not_draining,
    "VllmTtftSloBreach": lambda ep, r: latency_breach(ep, r, "VllmTtftSloBreach"),
    "VllmInterTokenSloBreach": lambda ep, r: latency_breach(ep, r, "VllmInterTokenSloBreach"),
    "VllmTtftSloMaybeBreached": lambda ep, r: latency_inside_the_slo_bucket(ep, r, "VllmTtftSloMaybeBreached",
                                                                            "VllmTtftSloBreach"),
    "VllmInterTokenSloMaybeBreached": lambda ep, r: latency_inside_the_slo_bucket(
        ep, r, "VllmInterTokenSloMaybeBreached", "VllmInterTokenSloBreach"),
    "VllmKvCacheSaturated": kv_saturation,
    "GatewayBurstBacklog": burst_backlog,
    "VllmFloorNotServing": floor_not_serving,
}


# ── the tests ─────────────────────────────────────────────────────────────────────────────────────

@pytest.fixture(scope="module")
def rendered(planned_stacks):
    """{stack: (spec, {endpoint: rule group})} from the recorded mock run of every stack file."""
    require_binary("promtool")
    return {stack_name(f): (planned_stacks[stack_name(f)][1], rendered_rule_groups(f)) for f in STACKS}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def unit_test_files(tmp_path: Path, spec, groups: dict[str, dict], mutate=None) -> Path:
    test_groups = [{**g, "rules": [{**r, "annotations": {k: v for k, v in r["annotations"].items() if k != "description"}}
                                   for r in g["rules"]]} for g in groups.values()]
    write_rule_file(tmp_path / "rules.yml", test_groups)
    cases = []
    for endpoint, group in groups.items():
        ep = Endpoint(spec.endpoint(endpoint))
        rules = {r["alert"]: r for r in group["rules"]}
        assert set(rules) <= set(FAILURES), f"an alert without a failure scenario: {set(rules) - set(FAILURES)}"
        cases.append(healthy_period(ep, rules))
        cases += [FAILURES[alert](ep, rules) for alert in rules]
    if mutate:
        mutate(cases)
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": cases}
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    return path


def test_every_rendered_group_passes_promtool_check(rendered, tmp_path):
    groups = [g for _, per_endpoint in rendered.values() for g in per_endpoint.values()]
    assert groups, "no rule group rendered"
    for stack, (_, per_endpoint) in rendered.items():
        if not per_endpoint:
            continue
        path = write_rule_file(tmp_path / f"{stack}.yml", list(per_endpoint.values()))
        out = promtool("check", "rules", path.name, cwd=tmp_path)
        n_rules = sum(len(g["rules"]) for g in per_endpoint.values())
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"SUCCESS: {n_rules} rules found" in out.stdout, out.stdout


def test_every_alert_fires_on_its_failure_and_stays_silent_when_healthy(rendered, tmp_path):
    runs = []
    for stack, (spec, per_endpoint) in rendered.items():
        for endpoint, group in per_endpoint.items():  # one promtool per endpoint, run side by side
            d = tmp_path / f"{stack}-{endpoint}"
            d.mkdir()
            path = unit_test_files(d, spec, {endpoint: group})
            runs.append((endpoint, len(group["rules"]), subprocess.Popen(
                ["promtool", "test", "rules", path.name], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)))
    tested = 0
    for endpoint, n_rules, proc in runs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "SUCCESS" in out, (endpoint, out)
        tested += n_rules
    # prod: assist and autocomplete (with a burst tier), guard; autocomplete's two SLOs and guard's TTFT lie inside
    # vLLM's buckets and add a warning each
    assert tested == 9 + (9 + 2) + (8 + 1)


def test_promtool_catches_a_wrong_for_delay_or_label(rendered, tmp_path):
    """The harness asserts something: firing one evaluation early, or under another label, fails promtool."""
    spec, per_endpoint = rendered["prod"]
    groups = {"assist": per_endpoint["assist"]}

    def early(cases):
        cases[:] = [c for c in cases if "KV cache saturated" in c["name"]]
        (case,) = cases
        silent, firing = case["alert_rule_test"]
        silent["exp_alerts"] = firing["exp_alerts"]  # claim it fires one minute before `for` has passed

    def wrong_track(cases):
        cases[:] = [c for c in cases if "preemption storm" in c["name"]]
        (case,) = cases
        case["alert_rule_test"][1]["exp_alerts"][0]["exp_labels"][TRACK_METRIC_LABEL] = "canary"

    for name, mutate in (("early", early), ("track", wrong_track)):
        d = tmp_path / name
        d.mkdir()
        out = promtool("test", "rules", unit_test_files(d, spec, groups, mutate).name, cwd=d)
        assert out.returncode != 0 and "FAILED" in out.stdout + out.stderr, (name, out.stdout)


def test_two_endpoints_serving_one_model_name_alert_only_on_their_own_pods(shared_model_stack, tmp_path):
    """assist and autocomplete serve one model name in one namespace (tests/conftest.py shared_model_stack). With
    both endpoints' rules loaded, one endpoint's deep queue and saturated KV cache fire its alerts only: the idle
    endpoint's rules, which select the same model name, stay silent. The levels are chosen so that selecting by
    model name alone would fire the idle endpoint's alerts too (checked below), so the test tells the two apart."""
    from tests.conftest import SHARED_MODEL_ENDPOINTS
    from topology import plan
    from topology.loading import load_inputs

    require_binary("promtool")
    spec = plan(load_inputs(shared_model_stack))
    groups = rendered_rule_groups(shared_model_stack)
    eps = {n: Endpoint(spec.endpoint(n)) for n in SHARED_MODEL_ENDPOINTS}
    rules = {n: {r["alert"]: r for r in groups[n]["rules"]} for n in SHARED_MODEL_ENDPOINTS}
    assert len({ep.base["model_name"] for ep in eps.values()}) == 1
    targets = {n: ep.e.autoscaling.target_waiting_per_replica for n, ep in eps.items()}
    level = 6 * max(targets.values())  # per deep stable pod
    # by model name alone the idle endpoint's rule would average 2 deep and 2 idle stable pods: above its target
    assert 2 * level / 4 > max(targets.values())
    cases = []
    for deep_name, idle_name in (SHARED_MODEL_ENDPOINTS, SHARED_MODEL_ENDPOINTS[::-1]):
        deep, idle = eps[deep_name], eps[idle_name]
        minutes = range(END_MIN + 1)
        queue = [("vllm:num_requests_waiting", p, [targets[deep_name] / 2 if m < T0_MIN else level for m in minutes])
                 for p in deep.stable]
        queue += [("vllm:num_requests_waiting", p, [0.0] * (END_MIN + 1)) for p in idle.stable]
        fire = firing_minute(T0_MIN, rules[deep_name]["VllmQueueNotDraining"]["for"])
        late = max(fire, firing_minute(T0_MIN, rules[idle_name]["VllmQueueNotDraining"]["for"])) + 1
        own = [expected(rules[deep_name]["VllmQueueNotDraining"], deep.alert_labels())]
        cases.append(scenario(f"{deep_name} queues, {idle_name} idle on the same model", queue, [
            (fire - 1, "VllmQueueNotDraining", []), (fire, "VllmQueueNotDraining", own),
            (late, "VllmQueueNotDraining", own)]))
        kv = [("vllm:kv_cache_usage_perc", deep.stable[0], [0.7 if m < T0_MIN else 0.99 for m in minutes])]
        kv += [("vllm:kv_cache_usage_perc", p, [0.7] * (END_MIN + 1)) for p in [*deep.stable[1:], *idle.stable]]
        fire = firing_minute(T0_MIN, rules[deep_name]["VllmKvCacheSaturated"]["for"])
        late = max(fire, firing_minute(T0_MIN, rules[idle_name]["VllmKvCacheSaturated"]["for"])) + 1
        labels = deep.alert_labels(namespace=NS, pod=deep.stable[0]["pod"], **{TRACK_METRIC_LABEL: "stable"})
        own = [expected(rules[deep_name]["VllmKvCacheSaturated"], labels)]
        cases.append(scenario(f"{deep_name}'s KV cache saturated, {idle_name} healthy on the same model", kv, [
            (fire - 1, "VllmKvCacheSaturated", []), (fire, "VllmKvCacheSaturated", own),
            (late, "VllmKvCacheSaturated", own)]))
        # the deep endpoint's floor stops reporting while the other's engines of the same model still do: its page
        # fires (selected by model name alone, the other's series would hide the outage), the other's stays silent
        gone = [1.0 if m < T0_MIN else ("stale" if m == T0_MIN else "_") for m in minutes]
        down = [("vllm:num_requests_waiting", p, gone) for p in deep.stable]
        down += [("vllm:num_requests_waiting", p, [0.0] * (END_MIN + 1)) for p in idle.stable]
        down += [desired_replicas(ep, [2.0] * (END_MIN + 1)) for ep in (deep, idle)]
        fire = firing_minute(T0_MIN, rules[deep_name]["VllmFloorNotServing"]["for"])
        late = max(fire, firing_minute(T0_MIN, rules[idle_name]["VllmFloorNotServing"]["for"])) + 1
        own = [expected(rules[deep_name]["VllmFloorNotServing"], deep.alert_labels(_critical=True))]
        cases.append(scenario(f"{deep_name}'s floor stops reporting, {idle_name} serves the same model", down, [
            (fire - 1, "VllmFloorNotServing", []), (fire, "VllmFloorNotServing", own),
            (late, "VllmFloorNotServing", own)]))
    test_groups = [{**g, "rules": [{**r, "annotations": {k: v for k, v in r["annotations"].items() if k != "description"}}
                                   for r in g["rules"]]} for g in groups.values()]
    write_rule_file(tmp_path / "rules.yml", test_groups)
    doc = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": cases}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    out = promtool("test", "rules", "t.yml", cwd=tmp_path)
    assert out.returncode == 0 and "SUCCESS" in out.stdout + out.stderr, out.stdout + out.stderr

    # the same rules selecting by model name alone (the endpoint matcher dropped) fire for the idle endpoint too
    unscoped = [{**g, "rules": [{**r, "expr": re.sub(ENDPOINT_METRIC_LABEL + r'="[^"]*",', "", r["expr"])}
                                for r in g["rules"]]} for g in test_groups]
    assert all(ENDPOINT_METRIC_LABEL not in r["expr"] for g in unscoped for r in g["rules"])
    write_rule_file(tmp_path / "rules.yml", unscoped)
    out = promtool("test", "rules", "t.yml", cwd=tmp_path)
    report = out.stdout + out.stderr
    assert out.returncode != 0 and "FAILED" in report, report
    a, b = SHARED_MODEL_ENDPOINTS  # the idle endpoint's alert fired on the deep one's pods
    assert re.search(rf"name: {a} queues.*?exp:\[\],\s*got:\[.*?endpoint=\"{b}\"", report, re.S), report
    # and the floor that stopped reporting is hidden by the other endpoint's engines of the same model
    assert re.search(rf"name: {a}'s floor stops reporting.*?got:\[\]", report, re.S), report
