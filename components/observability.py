"""Observability: the doctrine's serving alerts for every endpoint with floor replicas, as PrometheusRules.

One `monitoring.coreos.com/v1` PrometheusRule per endpoint whose floor replicas run vLLM (`node_pools`
non-empty: serverless and managed-API endpoints have no pods this cluster scrapes), one group per rule.
Each alert compares production with what the plan assumed, so every threshold is read from the spec
(or, where the doctrine fixes a figure, is a named constant below saying why):

- preemption storm — preemptions per second on a replica above a share of its planned request rate
  (storms precede OOM: the long-context time bomb);
- prefix-cache hit-rate step change — the 1 h token hit rate below half of the planned hit share
  (someone put volatile content at the front of the system prompt: prefill cost doubles);
- p99 prompt-length shift — p99 prompt tokens over 1 h above the planned p99 by more than 50 %
  (token-shape changes are cost and stability changes before they are incidents);
- queue not draining — requests waiting per stable replica above the autoscaler's target for longer
  than the autoscaler needs to add a replica (poll + stabilization + start jitter + pod cold start);
- TTFT and inter-token p99 above the endpoint's SLOs for that same reaction time;
- KV-cache saturation — usage above 95 % for 5 minutes on a replica;
- burst backlog (floor_plus_burst) — requests the gateway has in flight to the burst tier above the floor's
  burst-backlog trigger threshold (the burst's planned capacity) for longer than the autoscaler needs to add
  a floor replica: the floor is not growing (max replicas, pending nodes) while the burst is saturated.

Selectors: the floor pods' metrics carry `namespace`, `model_name` (= engine.served_model_name) and the
endpoint and track labels the PodMonitor copies from the pods (`serving_llm_endpoint`, `serving_llm_track`).
Every selector names the endpoint: two endpoints of one stack may serve one model name, and each alerts on its
own pods only (components/names.py engine_selector). Alerts about what the plan assumed (queue, SLOs,
prefix hits) read the stable track only: the canary is a different revision on a hash of users and is
judged by its own rollout gate. Per-pod engine health (preemptions, KV) and the traffic's prompt shape
read both tracks: a canary pod heading for OOM is as much an incident, and both tracks see the same users.
Floor pods see only the traffic the gateway keeps on the floor; burst (Modal) containers are not scraped.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from topology.engines import DEFAULT_ENGINE_IMAGE, engine_release
from topology.inputs import Prices
from topology.spec import EndpointSpec, TopologySpec

from ._common import ENDPOINT_LABEL, TYPE_PREFIX, child
from .floor_replicas import burst_backlog_query, gateway_queues_floor, queue_query
from .names import TRACK_METRIC_LABEL, engine_selector
from topology.names import promql_string

# Metrics the alerts read, exported by vLLM's v1 engine (vllm/v1/metrics/loggers.py): prometheus_client
# exposes a Counter `x` as `x_total` and a Histogram's buckets as `x_bucket`. Each series is labelled
# model_name (the served name) and engine (the data-parallel index). The names depend on the pinned vLLM
# version and come from the spec (`EngineSpec.metrics`, from topology/engines.py); this set is the names of
# the default engine image, for checks that read the list.
VLLM_METRICS = frozenset(
    name for field, name in engine_release(DEFAULT_ENGINE_IMAGE)[1].metrics.model_dump().items()
    if field != "requests_running"  # exported, but no alert reads it
)

# The gateway's metrics (HAProxy's built-in exporter, gauges per backend or server labelled `proxy`): in-flight
# sessions, and requests queued in a backend or on one of its servers (read against HAProxy 2.6.22's exporter, and
# 3.0.11's in tests/test_trigger_queries_live.py).
GATEWAY_METRICS = frozenset({"haproxy_backend_current_sessions", "haproxy_backend_current_queue",
                             "haproxy_server_current_queue"})

# kube-state-metrics (the monitoring chart's own; internal/store/deployment.go, v2.12): a Deployment's desired
# replicas, labelled namespace and deployment (its ServiceMonitor honours the object's labels)
KUBE_STATE_METRICS = frozenset({"kube_deployment_spec_replicas"})

# vLLM's latency histogram bounds (vllm/v1/metrics/loggers.py, the same at v0.11.0 and v0.13.0). A p99 can be
# told against an SLO exactly only at a bound: the share of requests above it is a ratio of two bucket counters.
# Inside a bucket histogram_quantile interpolates, and the alert then answers another question (autocomplete's
# 400 ms TTFT lies in (250, 500]: the p99 estimate passes 400 when more than 2.5 % of requests exceed 250 ms,
# whether or not 1 % exceed 400). A quantile above the top finite bound is unmeasurable: an SLO must lie below it.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                  40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0)
TTFT_TOP_BUCKET_S = TTFT_BUCKETS_S[-1]
INTER_TOKEN_TOP_BUCKET_S = INTER_TOKEN_BUCKETS_S[-1]

# Rates over at least four scrapes (one missed scrape leaves three points), and never under 5 minutes:
# shorter windows turn single long requests into spikes.
RATE_WINDOW_SCRAPES = 4
MIN_RATE_WINDOW_S = 300
# Traffic-shape alerts average an hour: the brief's window for hit-rate and prompt-length shifts, long
# enough that one tenant's burst of odd requests is not a shift of the traffic.
SHAPE_WINDOW_S = 3600

# Preemption storm: a replica sized by the plan holds usable_concurrency sequences within its KV memory at
# the planned lengths, so it preempts ~never. Preemptions at more than one per 20 requests of the replica's
# planned rate mean contexts no longer fit the memory budget; 5 minutes separates a storm from the burst
# one long prompt causes (that settles within its prefill) and still precedes the OOM.
PREEMPTION_STORM_SHARE = 0.05
PREEMPTION_STORM_FOR_S = 300

# Prefix-cache step change (brief): the 1 h hit rate below half the plan's hit share; 15 minutes more, on
# top of the hour's average, makes it a step and not the tail of a quiet night.
PREFIX_HIT_DROP_FACTOR = 0.5
PREFIX_HIT_FOR_S = 900

# p99 prompt-length shift (brief): > 50 % above the planned p99; it is a cost alert, not a page, so it
# must hold for half an hour on top of the hour's window.
PROMPT_P99_SHIFT_FACTOR = 1.5
PROMPT_QUANTILE = 0.99
PROMPT_SHIFT_FOR_S = 1800

# The SLOs are p99s (spec: slo_ttft_p99_ms, slo_inter_token_p99_ms).
SLO_QUANTILE = 0.99

# KV saturation (doctrine/brief): above 95 % of blocks the next decode steps preempt; 5 minutes of it is
# a replica running at its memory edge, not a momentary peak.
KV_SATURATION = 0.95
KV_SATURATION_FOR_S = 300


def prompt_shift_threshold(planned_p99: float, max_model_len: int) -> tuple[float, str]:
    """1.5 × the planned p99 prompt — or, where the product limit is closer than that (the engine rejects longer
    prompts, so the p99 can never get there), halfway from the planned p99 to max_model_len."""
    shifted = PROMPT_P99_SHIFT_FACTOR * planned_p99
    halfway = (planned_p99 + max_model_len) / 2
    if shifted < halfway:
        return shifted, f"{PROMPT_P99_SHIFT_FACTOR:g} × planned_input_tokens_p99 {planned_p99:g}"
    return halfway, (f"halfway from planned_input_tokens_p99 {planned_p99:g} to max_model_len {max_model_len} "
                     f"({PROMPT_P99_SHIFT_FACTOR:g}× the plan would be above the product limit)")


def vllm_token_buckets(max_model_len: int) -> list[int]:
    """Upper bounds of vLLM's token histograms (`build_1_2_5_buckets(max_model_len)`): 1, 2, 5, 10, 20, 50,
    ... up to max_model_len; everything above the last lands in +Inf."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return out
            out.append(value)
        exponent += 1


def le_label(bound: float) -> str:
    """The `le` value of a bucket as prometheus_client writes it (and Prometheus 3 normalises to): Go's
    shortest float, '10000.0', '1e+06', '+Inf'."""
    if math.isinf(bound):
        return "+Inf"
    text = repr(float(bound))
    dot = text.find(".")
    if bound > 0 and dot > 6:  # Go's %g switches to an exponent from 1e+06 on
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def duration(seconds: int) -> str:
    """A Prometheus duration ('5m15s'), as the PrometheusRule CRD's pattern allows."""
    if seconds <= 0:
        raise ValueError(f"durations must be positive, got {seconds}")
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v)


def _number(x: float) -> str:
    return f"{x:.6g}"


def rate_window_s(ep: EndpointSpec) -> int:
    """Rate window: four scrapes of the PodMonitor (whose interval is the autoscaler's polling interval)."""
    scrape_s = ep.autoscaling.polling_interval_s if ep.autoscaling else 0
    return max(MIN_RATE_WINDOW_S, RATE_WINDOW_SCRAPES * scrape_s)


def autoscaler_reaction_s(ep: EndpointSpec) -> int:
    """How long after a queue builds a new stable replica serves: KEDA's next poll, the HPA's scale-up
    stabilization window, the new pod's random start delay (herd jitter), then the measured pod cold start."""
    a = ep.autoscaling
    assert a is not None  # endpoint_alerts() checks floor endpoints have autoscaling (internal invariant)
    return math.ceil(a.polling_interval_s + a.scale_up_stabilization_s + ep.herd.start_jitter_s + ep.pod_cold_start_s)


@dataclass(frozen=True)
class Alert:
    """One alerting rule: `expr` is `<query> <comparison> <threshold>`, the threshold a spec figure."""

    name: str
    query: str
    comparison: str  # ">" or "<"
    threshold: float
    for_s: int
    severity: str
    summary: str
    description: str
    derivation: str  # the arithmetic, with the spec fields it read

    @property
    def expr(self) -> str:
        return f"{self.query} {self.comparison} {_number(self.threshold)}"

    def rule(self, endpoint: str) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": duration(self.for_s),
            "labels": {"severity": self.severity, "endpoint": endpoint},
            "annotations": {"summary": self.summary, "description": self.description, "threshold": self.derivation},
        }


@dataclass(frozen=True)
class EndpointAlerts:
    endpoint: str
    alerts: tuple[Alert, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)  # alert -> why it is not declared


def _selector(namespace: str, ep: EndpointSpec, *, stable: bool, extra: str = "") -> str:
    return engine_selector(namespace, ep.name, ep.engine.served_model_name, stable=stable, extra=extra)



def slo_bucket_bounds(slo_s: float, buckets: tuple[float, ...]) -> tuple[float, float]:
    """The histogram bounds around an SLO: (the largest at or below it, the smallest at or above it); equal when
    the SLO is a bound (to a part in a million: 0.1 is 0.1 however it was written)."""
    on = [b for b in buckets if math.isclose(b, slo_s, rel_tol=1e-6)]
    if on:
        return on[0], on[0]
    return max(b for b in buckets if b < slo_s), min(b for b in buckets if b > slo_s)


def share_above_query(metric_bucket: str, namespace: str, ep: EndpointSpec, bound_s: float, window: str) -> str:
    """The share of requests to the stable replicas whose latency exceeded `bound_s` (a bucket bound) over the
    window: 1 − the bound's cumulative count over the total, exact (no interpolation). No requests: no value, and
    no alert."""
    with_le = _selector(namespace, ep, stable=True, extra=f'le="{le_label(bound_s)}"')
    total = _selector(namespace, ep, stable=True, extra='le="+Inf"')
    return (f"(1 - sum(rate({metric_bucket}{with_le}[{window}])) / "
            f"sum(rate({metric_bucket}{total}[{window}])))")

def prompt_p99_query(namespace: str, ep: EndpointSpec, threshold_tokens: float) -> str:
    """p99 prompt tokens over the hour, interpolated inside the bucket holding `threshold_tokens` the way
    histogram_quantile interpolates — but with the +Inf bucket bounded by max_model_len (the engine rejects
    longer prompts). histogram_quantile cannot be used: vLLM's top finite bucket is the largest 1-2-5 value
    up to max_model_len (10000 for 16384), so it never reports a p99 above it.

    With L and H the cumulative rates at the bucket's bounds lo < T <= hi and N the total, the estimate
    lo + (hi - lo) × (0.99 N − L) / (H − L) is exact where the quantile lies in that bucket and on the right
    side of T elsewhere: below lo when fewer than 1 % are above lo, above hi (or +Inf when H = L) when more
    than 1 % are above hi. No traffic gives NaN, which compares false."""
    bounds = vllm_token_buckets(ep.engine.max_model_len)
    i = bisect.bisect_left(bounds, threshold_tokens)  # first bound >= T
    if i == 0:
        raise ValueError(f"endpoint {ep.name!r}: prompt threshold {threshold_tokens:g} is below vLLM's first bucket")
    lo = bounds[i - 1]
    hi_value, hi_label = (bounds[i], le_label(bounds[i])) if i < len(bounds) else (ep.engine.max_model_len, "+Inf")
    w = SHAPE_WINDOW_S

    def cum(le: str) -> str:
        sel = _selector(namespace, ep, stable=False, extra='le="' + le + '"')
        return f"sum(rate({ep.engine.metrics.prompt_tokens_bucket}{sel}[{duration(w)}]))"

    low, high, total = cum(le_label(lo)), cum(hi_label), cum("+Inf")
    return (f"{lo} + {hi_value - lo} * ({PROMPT_QUANTILE} * {total} - {low})"
            f" / ({high} - {low})")


def endpoint_alerts(ep: EndpointSpec, namespace: str) -> EndpointAlerts:
    """The alerts for one endpoint's floor replicas (none when it has no node pools)."""
    if not ep.node_pools:
        return EndpointAlerts(ep.name, ())
    a = ep.autoscaling
    if a is None:
        raise ValueError(f"endpoint {ep.name!r} has node pools but no autoscaling settings in the spec")
    name, served = ep.name, ep.engine.served_model_name
    m = ep.engine.metrics  # names for the pinned vLLM version (topology/engines.py)
    rw = duration(rate_window_s(ep))
    react_s = autoscaler_reaction_s(ep)
    react_how = (f"autoscaler's reaction = poll {a.polling_interval_s} s + scale-up stabilization "
                 f"{a.scale_up_stabilization_s} s + start jitter {ep.herd.start_jitter_s} s + pod cold start "
                 f"{ep.pod_cold_start_s:g} s = {react_s} s")
    per_pod = f"namespace, pod, {TRACK_METRIC_LABEL}"
    alerts: list[Alert] = []
    skipped: dict[str, str] = {}

    # every other engine alert reads the stable engines' series, and so does KEDA's trigger: with none scraped (a
    # crash loop, an image that does not pull, pods pending on nodes) they go empty, KEDA holds the replica count
    # and nothing else pages. The Deployment's desired replicas tell an outage from a floor the clock scaled to 0.
    deployment = f"{name}-vllm"  # components/floor_replicas.py
    wanted = (f"max(kube_deployment_spec_replicas{{namespace={promql_string(namespace)},"
              f"deployment={promql_string(deployment)}}})")
    # a floor whose every stable pod starts on a new node (a first `up`, reserved nodes replaced or lost) is not
    # down until a node cold start plus the start jitter has passed: the warm-node reaction time would page first
    down_for_s = max(react_s, math.ceil(ep.node_cold_start_s + ep.herd.start_jitter_s))
    down_how = (f"the longer of the {react_s} s reaction and a new node's cold start {ep.node_cold_start_s:g} s + "
                f"start jitter {ep.herd.start_jitter_s} s")
    alerts.append(Alert(
        name="VllmFloorNotServing",
        query=(f"({wanted} unless on() "
               f"count({m.requests_waiting}{_selector(namespace, ep, stable=True)}))"),
        comparison=">", threshold=0, for_s=down_for_s, severity="critical",
        summary=f"{name}: the floor wants replicas and no stable vLLM engine is scraped",
        description=(f"Deployment {deployment} asks for {{{{ $value | humanize }}}} replica(s) and Prometheus scrapes no "
                     f"stable engine of {served}, for longer than a replica needs to start on a new node "
                     f"({down_for_s} s: {down_how}). Requests "
                     "overflow to burst where the endpoint has one, else fail; the queue and latency alerts and "
                     "KEDA's trigger read nothing while it lasts. Look for pods crash-looping, pending, or failing to pull their image or "
                     "weights, and for a NetworkPolicy that shuts Prometheus out (llm-serving:networkPolicy.scrapers)."),
        derivation=f"kube_deployment_spec_replicas > 0 with no stable engine series; for: {down_how}",
    ))

    storm = PREEMPTION_STORM_SHARE * ep.capacity.planning_requests_per_s
    alerts.append(Alert(
        name="VllmPreemptionStorm",
        query=f"sum by ({per_pod}) (rate({m.preemptions_total}{_selector(namespace, ep, stable=False)}[{rw}]))",
        comparison=">", threshold=storm, for_s=PREEMPTION_STORM_FOR_S, severity="critical",
        summary=f"{name}: preemption storm on {{{{ $labels.pod }}}} ({{{{ $labels.{TRACK_METRIC_LABEL} }}}})",
        description=(f"vLLM on {{{{ $labels.pod }}}} preempts {{{{ $value | humanize }}}}/s, above {_number(storm)}/s "
                     f"({PREEMPTION_STORM_SHARE:g} of the {ep.capacity.planning_requests_per_s:g} req/s a replica is "
                     "planned to carry). Contexts no longer fit the KV budget: storms precede OOM. Check prompt "
                     f"lengths against max_model_len {ep.engine.max_model_len} and the gateway's input caps."),
        derivation=f"{PREEMPTION_STORM_SHARE:g} × capacity.planning_requests_per_s {ep.capacity.planning_requests_per_s:g}",
    ))

    planned_hit = ep.planned_prefix_cache_hit_fraction
    if planned_hit <= 0:
        skipped["VllmPrefixCacheHitRateDrop"] = "the plan assumed no prefix-cache hits (planned_prefix_cache_hit_fraction = 0)"
    elif not ep.engine.enable_prefix_caching:
        skipped["VllmPrefixCacheHitRateDrop"] = (
            f"the plan assumed a prefix-cache hit share of {planned_hit:g} but the engine runs without prefix caching")
    else:
        floor_hit = PREFIX_HIT_DROP_FACTOR * planned_hit
        sel = _selector(namespace, ep, stable=True)
        w = duration(SHAPE_WINDOW_S)
        alerts.append(Alert(
            name="VllmPrefixCacheHitRateDrop",
            query=(f"sum(rate({m.prefix_cache_hits_total}{sel}[{w}]))"
                   f" / sum(rate({m.prefix_cache_queries_total}{sel}[{w}]))"),
            comparison="<", threshold=floor_hit, for_s=PREFIX_HIT_FOR_S, severity="warning",
            summary=f"{name}: prefix-cache hit rate fell below half the planned {planned_hit:g}",
            description=(f"The stable replicas of {served} served {{{{ $value | humanizePercentage }}}} of prompt "
                         f"tokens from the prefix cache over the last hour; the plan assumed {planned_hit:g}. "
                         "Prefill cost and TTFT rise with every miss: look for volatile content (a timestamp, a "
                         "request id) added to the front of a system prompt."),
            derivation=f"{PREFIX_HIT_DROP_FACTOR:g} × planned_prefix_cache_hit_fraction {planned_hit:g}",
        ))

    planned_p99 = ep.planned_input_tokens_p99
    long_prompt, shift_derivation = prompt_shift_threshold(planned_p99, ep.engine.max_model_len)
    if planned_p99 >= ep.engine.max_model_len:  # unreachable for validated inputs (p99 + output ≤ the limit)
        skipped["VllmPromptLengthShift"] = (
            f"planned p99 prompt {planned_p99:g} is at max_model_len {ep.engine.max_model_len}: no shift is visible")
    else:
        alerts.append(Alert(
            name="VllmPromptLengthShift",
            query=prompt_p99_query(namespace, ep, long_prompt),
            comparison=">", threshold=long_prompt, for_s=PROMPT_SHIFT_FOR_S, severity="warning",
            summary=f"{name}: p99 prompt length is {long_prompt / planned_p99 - 1:.0%} above the plan",
            description=(f"p99 prompt tokens of {served} over the last hour is {{{{ $value | humanize }}}}; the plan "
                         f"assumed {planned_p99:g}. Token-shape changes are cost changes (GPU-seconds per request) "
                         "and stability changes (KV pressure, preemptions) before they are incidents: re-plan."),
            derivation=shift_derivation,
        ))

    alerts.append(Alert(
        name="VllmQueueNotDraining",
        # under admission control the queue waits in the gateway: the trigger's own sum, per replica
        query=(f"({queue_query(namespace, name, served, m.requests_waiting, True)}) / "
               f"count(sum by (pod) ({m.requests_waiting}{_selector(namespace, ep, stable=True)}))"
               if gateway_queues_floor(ep) else
               f"avg(sum by (pod) ({m.requests_waiting}{_selector(namespace, ep, stable=True)}))"),
        comparison=">", threshold=a.target_waiting_per_replica, for_s=react_s, severity="warning",
        summary=f"{name}: requests waiting per replica stayed above the autoscaling target",
        description=(f"{{{{ $value | humanize }}}} requests wait per stable replica of {served}, above KEDA's target "
                     f"{a.target_waiting_per_replica:g}, for longer than the autoscaler needs to add a replica "
                     f"({react_how}). Check max replicas ({a.max_replicas}), pending pods and node capacity."),
        derivation=f"autoscaling.target_waiting_per_replica {a.target_waiting_per_replica:g}; for: {react_how}",
    ))

    for alert_name, maybe_name, metric, slo_ms, field_name, buckets in (
        ("VllmTtftSloBreach", "VllmTtftSloMaybeBreached", m.ttft_seconds_bucket, ep.slo_ttft_p99_ms,
         "slo_ttft_p99_ms", TTFT_BUCKETS_S),
        ("VllmInterTokenSloBreach", "VllmInterTokenSloMaybeBreached", m.inter_token_seconds_bucket,
         ep.slo_inter_token_p99_ms, "slo_inter_token_p99_ms", INTER_TOKEN_BUCKETS_S),
    ):
        slo_s = slo_ms / 1000
        if slo_s >= buckets[-1]:
            raise ValueError(f"endpoint {name!r}: {field_name} {slo_ms:g} ms is beyond vLLM's top finite bucket "
                             f"({buckets[-1]:g} s); its p99 cannot be measured against it")
        lo, hi = slo_bucket_bounds(slo_s, buckets)
        what = "TTFT" if alert_name == "VllmTtftSloBreach" else "inter-token latency"
        # vLLM observes TTFT once per request and the inter-token gap once per token (0.11.0 v1/metrics/loggers.py)
        counted = "requests" if alert_name == "VllmTtftSloBreach" else "token gaps"
        allowed = 1 - SLO_QUANTILE
        exact = lo == hi
        alerts.append(Alert(
            name=alert_name,
            query=share_above_query(metric, namespace, ep, hi, rw),
            comparison=">", threshold=allowed, for_s=react_s, severity="critical",
            summary=(f"{name}: p99 {what} above the {slo_ms:g} ms SLO" if exact else
                     f"{name}: p99 {what} above {hi * 1000:g} ms, beyond the {slo_ms:g} ms SLO"),
            description=(f"{{{{ $value | humanizePercentage }}}} of the {counted} at the stable replicas of {served} "
                         f"took longer than {hi * 1000:g} ms ({what})"
                         + ("" if exact else f", the first bucket bound of vLLM's histogram above the "
                            f"{slo_ms:g} ms SLO")
                         + f": the p99 is over the SLO, for longer than the autoscaler needs to add capacity "
                         f"({react_how}). Engine-side figure: gateway and network time come on top."),
            derivation=(f"{field_name} {slo_ms:g} ms "
                        + ("is a bucket bound of vLLM's histogram" if exact else
                           f"lies inside vLLM's bucket ({lo * 1000:g}, {hi * 1000:g}] ms: the share above its upper "
                           "bound")
                        + f" > 1 − {SLO_QUANTILE:g}; for: {react_how}"),
        ))
        if not exact:
            alerts.append(Alert(
                name=maybe_name,
                query=share_above_query(metric, namespace, ep, lo, rw),
                comparison=">", threshold=allowed, for_s=react_s, severity="warning",
                summary=f"{name}: p99 {what} may be above the {slo_ms:g} ms SLO",
                description=(f"{{{{ $value | humanizePercentage }}}} of the {counted} at the stable replicas of "
                             f"{served} took longer than {lo * 1000:g} ms ({what}): the p99 lies between "
                             f"{lo * 1000:g} and {hi * 1000:g} ms or above, and vLLM's histogram cannot tell it "
                             f"against the {slo_ms:g} ms SLO inside that bucket (an SLO on a bucket bound can be "
                             f"told exactly). For longer than the autoscaler needs to add capacity ({react_how})."),
                derivation=(f"{field_name} {slo_ms:g} ms lies inside vLLM's bucket ({lo * 1000:g}, {hi * 1000:g}] "
                            f"ms: the share above its lower bound > 1 − {SLO_QUANTILE:g}; for: {react_how}"),
            ))

    alerts.append(Alert(
        name="VllmKvCacheSaturated",
        query=f"max by ({per_pod}) ({m.kv_cache_usage}{_selector(namespace, ep, stable=False)})",
        comparison=">", threshold=KV_SATURATION, for_s=KV_SATURATION_FOR_S, severity="warning",
        summary=f"{name}: KV cache above {KV_SATURATION:.0%} on {{{{ $labels.pod }}}}",
        description=(f"vLLM on {{{{ $labels.pod }}}} ({{{{ $labels.{TRACK_METRIC_LABEL} }}}}) uses "
                     "{{ $value | humanizePercentage }} of its KV-cache blocks: the next long contexts preempt. "
                     f"The plan sized {ep.capacity.usable_concurrency} sequences per replica."),
        derivation=f"doctrine: {KV_SATURATION:g} for {duration(KV_SATURATION_FOR_S)}",
    ))

    backlog = a.burst_backlog_threshold
    if backlog is not None:
        alerts.append(Alert(
            name="GatewayBurstBacklog",
            query=burst_backlog_query(namespace, name),
            comparison=">", threshold=backlog, for_s=react_s, severity="warning",
            summary=f"{name}: requests in flight to the burst tier stayed above its planned capacity",
            description=(f"The gateway has {{{{ $value | humanize }}}} requests of {served} in flight to the burst "
                         f"tier, above the floor's burst-backlog threshold {backlog:g}, for longer than the "
                         f"autoscaler needs to add a floor replica ({react_how}). The floor is not absorbing the "
                         f"overload: check max replicas ({a.max_replicas}), pending pods and node capacity."),
            derivation=f"autoscaling.burst_backlog_threshold {backlog:g}; for: {react_how}",
        ))
    return EndpointAlerts(name, tuple(alerts), skipped)


def rule_name(endpoint: str) -> str:
    return f"{endpoint}-vllm-alerts"


def prometheus_rule_spec(alerts: EndpointAlerts) -> dict:
    return {"groups": [{"name": f"{alerts.endpoint}.vllm", "rules": [a.rule(alerts.endpoint) for a in alerts.alerts]}]}


@dataclass(frozen=True)
class ObservabilityArgs:
    spec: TopologySpec
    """The plan; endpoints with node pools get a PrometheusRule."""
    namespace: str
    """Namespace of the serving workloads (the floor pods' metrics carry it)."""
    monitor_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels the Prometheus operator selects rules by (kube-prometheus-stack: its release label)."""
    prices: Prices | None = None
    """The inputs' dated prices: the dashboards' cost-per-hour panel (left out when None)."""
    dashboards: bool = True
    """Ship a Grafana dashboard per endpoint with floor replicas (a ConfigMap the Grafana sidecar loads)."""


class Observability(pulumi.ComponentResource):
    rule_names: dict[str, str]
    skipped: dict[str, dict[str, str]]
    dashboard_uids: dict[str, str]

    def __init__(self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        per_endpoint = [endpoint_alerts(e, args.namespace) for e in args.spec.endpoints if e.node_pools]
        super().__init__(f"{TYPE_PREFIX}:Observability", name, None, opts)

        self.rule_names, self.skipped, self.dashboard_uids = {}, {}, {}
        for alerts in per_endpoint:
            ep = alerts.endpoint
            for alert, why in alerts.skipped.items():
                pulumi.log.warn(f"Observability: endpoint {ep!r} gets no {alert}: {why}", resource=self)
            labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": ep, ENDPOINT_LABEL: ep}
            k8s.apiextensions.CustomResource(
                f"{name}-{ep}-rules",
                api_version="monitoring.coreos.com/v1",
                kind="PrometheusRule",
                metadata={"name": rule_name(ep), "namespace": args.namespace,
                          "labels": {**labels, **args.monitor_labels}},
                spec=prometheus_rule_spec(alerts),
                opts=child(self),
            )
            self.rule_names[ep] = rule_name(ep)
            self.skipped[ep] = dict(alerts.skipped)
            if args.dashboards:
                from .dashboards import dashboard_configmap_labels, dashboard_file_name, endpoint_dashboard

                board = endpoint_dashboard(args.spec.endpoint(ep), args.namespace, args.prices)
                k8s.core.v1.ConfigMap(
                    f"{name}-{ep}-dashboard",
                    metadata={"name": f"{ep}-dashboard", "namespace": args.namespace,
                              "labels": dashboard_configmap_labels(labels)},
                    data={dashboard_file_name(args.namespace, ep): json.dumps(board, sort_keys=True)},
                    opts=child(self),
                )
                self.dashboard_uids[ep] = board["uid"]
        self.register_outputs({"rules": self.rule_names, "skippedAlerts": self.skipped, "dashboards": self.dashboard_uids})
