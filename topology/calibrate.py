"""Calibrate: what production measured → updated cost inputs. Pure: query results in, figures out.

The I/O side (offline/calibrate_prometheus.py) runs the queries named in `QUERIES` against Prometheus, or reads a
saved results document, and passes the date in; this module never reads the clock or the network.

The results document (JSON), per endpoint:
  requests_by_hour   [[unix_s, requests in the hour ending then], ...]   gateway frontend (floor + burst)
  requests_by_minute [[unix_s, requests in the minute ending then], ...] the same, per minute (optional)
  requests_by_window {"window_s": w, "rows": [[unix_s, requests in the w s ending then], ...]} the same, per
                     window within a minute (w a divisor of 60: the scrape interval; optional)
  prompt_tokens / generation_tokens  {"sum", "count", "buckets": {le: cumulative count}}   vLLM histograms
  prefix_cache       {"hits", "queries"}                                  vLLM counters (prompt tokens)
  prefill_hours      [[unix_s, prompt tokens, prefix-cache hits, prefill seconds, running per replica], ...]
                     the hour ending then (vLLM counters; running weighted by each replica's time)
  busiest_hour       {"generation_tokens_per_s_per_replica", "running_per_replica"}
  pods               [{"pod", "created_s", "started_s", "ready_s"}]       kube-state-metrics
  queries            {name: the query text as run}  (optional; provenance)
plus "window": {"start_s", "end_s"}.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
from pydantic import ValidationError

from .inputs import HOURS_PER_WEEK, CostInputs, EndpointInputs
from .loading import InputError, format_validation_error
from .names import ENDPOINT_METRIC_LABEL, TRACK_METRIC_LABEL, TRACK_STABLE
from .plan.serverless import cluster_size_from_counts, correlation_s_from_minute_counts, within_hour_from_minute_counts

# The floor runs near saturation when its mean running sequences reach this share of what a replica holds: only
# then is its busiest hour's output rate a saturation figure (below it, the engine could have done more).
SATURATED_RUNNING_SHARE = 0.8
# A pod that waited this long between creation and start waited for a node: its created → ready is a new-node start.
NODE_WAIT_S = 60
MIN_REQUESTS_FOR_SHAPE = 100  # fewer finished requests than this say nothing about a p99
# vLLM's per-request prefill time runs from scheduling to the first token (0.11.0 v1/metrics/stats.py), so
# requests running together share those seconds (chunked prefill packs prompts with the others' decode steps):
# their sum is replica time only where a replica seldom runs more than one request. The prefill rate is measured
# in the hours whose mean running requests per replica stay at or below this, from this much prefill time.
QUIET_RUNNING_PER_REPLICA = 1.5
MIN_QUIET_PREFILL_S = 60.0
# Whole clock hours of per-minute counts (every minute sampled, requests in the hour) before the within-hour
# traffic figures move: a day's hours, so one odd hour does not set an endpoint's burstiness
MIN_HOURS_FOR_BURSTINESS = 24

# What the I/O side asks Prometheus for ({ns}, {endpoint}, {model}, {frontend}, {pod_re} filled per endpoint, as PromQL
# string contents; [{w}] the window). The floor pods' series are selected by the endpoint label the PodMonitor copies
# from the pods: vLLM labels them by served model name, which two endpoints of one stack may share. Stable track
# only: the figures describe the deployment the plan sizes, not a rollout candidate (its own engine settings, and
# under shadow copies of requests the stable track served too) or the warm previous version.
_ENGINE = ('{{namespace="{ns}",' + ENDPOINT_METRIC_LABEL + '="{endpoint}",model_name="{model}",'
           + TRACK_METRIC_LABEL + '="' + TRACK_STABLE + '"}}')
QUERIES: dict[str, str] = {
    "requests_by_hour": 'sum(increase(haproxy_frontend_http_requests_total{{namespace="{ns}",proxy="{frontend}"}}[1h]))',
    # the raw counters, one series per gateway pod, sampled each minute: their differences are the minute's
    # requests exactly (increase() over [1m] extrapolates from the samples inside the minute)
    "requests_by_minute": 'haproxy_frontend_http_requests_total{{namespace="{ns}",proxy="{frontend}"}}',
    # each gateway pod's HAProxy start (promex's process info, addons/promex in 3.0): a counter first seen in the
    # window counts from 0 only when its process started within the minute before
    "gateway_started": 'max_over_time(haproxy_process_start_time_seconds{{namespace="{ns}"}}[{w}])',
    "prompt_tokens": 'sum by (le) (increase(vllm:request_prompt_tokens_bucket' + _ENGINE + '[{w}]))',
    "prompt_tokens_sum": 'sum(increase(vllm:request_prompt_tokens_sum' + _ENGINE + '[{w}]))',
    "generation_tokens": 'sum by (le) (increase(vllm:request_generation_tokens_bucket' + _ENGINE + '[{w}]))',
    "generation_tokens_sum": 'sum(increase(vllm:request_generation_tokens_sum' + _ENGINE + '[{w}]))',
    "prefix_hits": 'sum(increase(vllm:prefix_cache_hits_total' + _ENGINE + '[{w}]))',
    "prefix_queries": 'sum(increase(vllm:prefix_cache_queries_total' + _ENGINE + '[{w}]))',
    "prefill_seconds_by_hour": 'sum(increase(vllm:request_prefill_time_seconds_sum' + _ENGINE + '[1h]))',
    "prompt_tokens_by_hour": 'sum(increase(vllm:request_prompt_tokens_sum' + _ENGINE + '[1h]))',
    "prefix_hits_by_hour": 'sum(increase(vllm:prefix_cache_hits_total' + _ENGINE + '[1h]))',
    # per replica over the hour: the tokens of every replica that ran in it over the replicas averaged across it
    # (minute by minute), not over those alive at its end — a floor scaled 2 → 1 in the hour read 1.5× its rate
    "generation_per_replica": 'sum(rate(vllm:generation_tokens_total' + _ENGINE + '[1h])) '
                              '/ avg_over_time(count(vllm:num_requests_running' + _ENGINE + ')[1h:1m])',
    # requests running per replica, weighted by each replica's time in the hour (every sample of every replica)
    "running_per_replica": 'sum(sum_over_time(vllm:num_requests_running' + _ENGINE + '[1h])) '
                           '/ sum(count_over_time(vllm:num_requests_running' + _ENGINE + '[1h]))',
    "pod_created": 'last_over_time(kube_pod_created{{namespace="{ns}",pod=~"{pod_re}"}}[{w}])',
    "pod_started": 'last_over_time(kube_pod_start_time{{namespace="{ns}",pod=~"{pod_re}"}}[{w}])',
    # kube-state-metrics' ready time is the Ready condition's last transition, whatever its status: a pod that
    # flapped or restarted later reads that later time. The first value seen while the pod is Ready is its
    # first Ready transition (checked minute by minute over the window)
    "pod_ready": ('min_over_time((kube_pod_status_ready_time{{namespace="{ns}",pod=~"{pod_re}"}} and on(namespace, pod) '
                  '(kube_pod_status_ready{{namespace="{ns}",pod=~"{pod_re}",condition="true"}} == 1))[{w}:1m])'),
}


class CalibrationError(InputError):
    """A results document that cannot be read, or figures the inputs' validators refuse."""


@dataclass(frozen=True)
class Figure:
    """One input figure: its path in the inputs document, old and new values, and where the new one came from."""

    path: str
    old: Any
    new: Any
    source: str

    @property
    def changed(self) -> bool:
        return self.old != self.new


@dataclass
class Calibration:
    inputs: CostInputs
    as_of: dt.date
    window: tuple[float, float]
    figures: list[Figure] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # figures left as they were, and why


def histogram_quantile(q: float, buckets: Mapping[str, float], top_bound: float) -> float:
    """The q-quantile of a cumulative histogram {le: count}, interpolated linearly inside its bucket (as PromQL's
    histogram_quantile does), with `top_bound` the largest value there is (vLLM's token histograms: max_model_len,
    or max_tokens for outputs): it bounds the +Inf bucket and any bucket reaching past it."""
    pairs = sorted(((math.inf if le == "+Inf" else float(le)), float(c)) for le, c in buckets.items())
    if not pairs or pairs[-1][0] != math.inf:
        raise CalibrationError("a histogram without its +Inf bucket")
    total = pairs[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    lo_bound, lo_count = 0.0, 0.0
    for bound, count in pairs:
        if count >= rank:
            hi = max(lo_bound, min(top_bound, bound))  # (outputs recorded before a lower cap: no backwards)
            if count == lo_count:
                return hi
            return lo_bound + (hi - lo_bound) * (rank - lo_count) / (count - lo_count)
        lo_bound, lo_count = bound, count
    return top_bound  # unreachable: the +Inf bucket holds the total


def hour_of_week(unix_s: float, timezone: str) -> int:
    """Hour of the week (Monday 00:00 = 0) of an instant, in the profile's timezone."""
    local = dt.datetime.fromtimestamp(unix_s, tz=dt.timezone.utc).astimezone(ZoneInfo(timezone))
    return local.weekday() * 24 + local.hour


def hourly_profile(requests_by_hour: Sequence[Sequence[float]], timezone: str) -> list[float | None]:
    """Mean requests/s per hour of the week: each sample counts the requests of the hour ending at its timestamp;
    several weeks average; an hour with no sample is None."""
    sums = [0.0] * HOURS_PER_WEEK
    counts = [0] * HOURS_PER_WEEK
    for t, n in requests_by_hour:
        if n is None or not math.isfinite(n):
            continue
        h = hour_of_week(t - 3600, timezone)
        sums[h] += n / 3600
        counts[h] += 1
    return [s / c if c else None for s, c in zip(sums, counts)]


def counts_by_span(rows: Sequence[Sequence[float]], window_s: int = 60, what: str = "requests_by_minute"
                   ) -> np.ndarray:
    """(hours, 60) request counts of the whole clock hours (UTC) in the samples, in time order: each sample counts
    the requests of the minute ending at its timestamp (rounded to the minute); an hour with a minute missing or
    not finite is left out (its dispersion and neighbours would be wrong), a minute sampled twice is refused.
    window_s < 60 (a divisor of 60): (minutes, 60 / window_s) counts of the whole minutes, the same way."""
    span, per = (3600, 60) if window_s == 60 else (60, 60 // window_s)
    groups: dict[int, list[float | None]] = {}
    for row in rows:
        t, n = _num(row[0], f"{what} time"), _num(row[1], f"{what} value")
        if not math.isfinite(t):
            raise CalibrationError(f"results: {what} has a time {t!r}, not a finite unix time")
        start = math.floor((t - window_s) / window_s + 0.5) * window_s  # nearest window (a half rounds up)
        g, m = divmod(int(start), span)
        row = groups.setdefault(g, [None] * per)
        if row[m // window_s] is not None:
            raise CalibrationError(f"results: {what} has two samples for the window ending at {start + window_s}")
        row[m // window_s] = n if (n is not None and math.isfinite(n) and n >= 0) else math.nan
    whole = [row for _, row in sorted(groups.items()) if all(x is not None and not math.isnan(x) for x in row)]
    return np.array(whole, dtype=float).reshape(len(whole), per)


def _num(x: Any, what: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise CalibrationError(f"results: {what} is {x!r}, not a number") from None
    return v


def _round(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def calibrate_endpoint(ep: EndpointInputs, res: Mapping[str, Any], gpu_kind: str, mig_profile: str | None,
                       window: tuple[float, float]) -> tuple[EndpointInputs, list[Figure], list[str]]:
    figures: list[Figure] = []
    kept: list[str] = []
    name = ep.name
    span = f"{dt.datetime.fromtimestamp(window[0], dt.timezone.utc):%Y-%m-%d %H:%M} to " \
           f"{dt.datetime.fromtimestamp(window[1], dt.timezone.utc):%Y-%m-%d %H:%M} UTC"

    def fig(path, old, new, source):
        figures.append(Figure(f"endpoints[{name}].{path}", old, new, f"{source}; {span}"))
        return new

    # hour-of-week profile (the gateway sees floor and burst traffic)
    traffic = ep.traffic
    rows = res.get("requests_by_hour") or []
    profile = hourly_profile([(_num(t, "requests_by_hour time"), _num(n, "requests_by_hour value")) for t, n in rows],
                             traffic.timezone)
    measured = sum(p is not None for p in profile)
    if measured:
        old = list(traffic.hourly_mean_requests_per_s or [])
        new = [_round(p, 5) if p is not None else (old[h] if old else 0.0) for h, p in enumerate(profile)]
        query = (res.get("queries") or {}).get("requests_by_hour", QUERIES["requests_by_hour"])
        src = f"{query} per hour, {measured} of 168 hours measured"
        if measured < HOURS_PER_WEEK:
            src += f" (the other {HOURS_PER_WEEK - measured} kept from the current inputs)"
        fig("traffic.hourly_mean_requests_per_s", old, new, src)
        traffic = traffic.model_copy(update={"hourly_mean_requests_per_s": new, "rate_trace": None})
    else:
        kept.append(f"{name}: traffic profile (no gateway request counts in the window)")

    # within-hour burstiness from per-minute counts (the cluster size needs 10-second counts, finer than a scrape:
    # the current input's figure takes the Poisson noise out)
    by_hour = counts_by_span(res.get("requests_by_minute") or [])
    busy = int((by_hour.mean(axis=1) >= 1.0).sum()) if len(by_hour) else 0
    if busy >= MIN_HOURS_FOR_BURSTINESS:
        B = traffic.arrival_cluster_size
        windows = res.get("requests_by_window") or {}
        w = int(_num(windows.get("window_s", 0), "requests_by_window.window_s")) if windows else 0
        if windows and (w <= 0 or w >= 60 or 60 % w):
            raise CalibrationError(f"results: requests_by_window.window_s is {w}, not a divisor of 60 below 60")
        by_minute = counts_by_span(windows.get("rows") or [], w, "requests_by_window") if w else np.zeros((0, 1))
        measured_b = len(by_minute) >= MIN_HOURS_FOR_BURSTINESS * 60
        if measured_b:
            B = fig("traffic.arrival_cluster_size", traffic.arrival_cluster_size,
                    _round(min(1000.0, max(1.0, cluster_size_from_counts(by_minute))), 3),
                    f"variance over mean of {w}-second request counts within each minute, {len(by_minute)} whole "
                    f"minutes (serverless.cluster_size_from_counts; the input's definition says 10-second windows: "
                    f"bunches shorter than a window read the same)")
            traffic = traffic.model_copy(update={"arrival_cluster_size": B})
        elif B == 1.0:
            kept.append(f"{name}: arrival_cluster_size 1 (independent arrivals) taken for the within-hour figures: "
                        "clients that submit in bunches read as burstiness and idle minutes; measure it from 10-second "
                        "request counts (topology.plan.serverless.cluster_size_from_counts) and set it first")
        pf, idle = within_hour_from_minute_counts(by_hour, B)
        pf, idle = min(20.0, max(1.0, pf)), min(0.99, max(0.0, idle))
        tau = min(3600.0, max(0.0, correlation_s_from_minute_counts(by_hour, B)))
        query = (res.get("queries") or {}).get("requests_by_minute", QUERIES["requests_by_minute"])
        src = (f"differences of {query} a minute apart, {busy} whole hours with traffic, Poisson noise removed "
               f"with arrival_cluster_size {B:g}"
               + (" (measured above)" if measured_b else
                  " (kept: no scrape finer than a minute, or fewer than a day of whole minutes)"))
        traffic = traffic.model_copy(update={
            "within_hour_peak_factor": fig("traffic.within_hour_peak_factor", traffic.within_hour_peak_factor,
                                           _round(pf, 3), src + " (serverless.within_hour_from_minute_counts)"),
            "within_hour_correlation_s": fig("traffic.within_hour_correlation_s", traffic.within_hour_correlation_s,
                                             _round(tau, 3), src + " (serverless.correlation_s_from_minute_counts)"),
            "idle_minute_share": fig("traffic.idle_minute_share", traffic.idle_minute_share, _round(idle, 3),
                                     src + " (serverless.within_hour_from_minute_counts)"),
        })
    else:
        kept.append(f"{name}: within-hour burstiness ({busy} whole hours of per-minute request counts with traffic, "
                    f"fewer than {MIN_HOURS_FOR_BURSTINESS})")

    # token shape
    shape = ep.shape.model_dump()
    limit = ep.shape.product_max_context_tokens
    for key, label in (("prompt_tokens", "input"), ("generation_tokens", "output")):
        h = res.get(key)
        count = _num(h.get("count", 0), f"{key}.count") if h else 0.0
        if count < MIN_REQUESTS_FOR_SHAPE:
            kept.append(f"{name}: {label} token shape ({count:g} finished requests, fewer than {MIN_REQUESTS_FOR_SHAPE})")
            continue
        mean = _num(h["sum"], f"{key}.sum") / count
        # an output never exceeds max_tokens (vLLM's max_new_tokens override): interpolating inside a 1-2-5 bucket
        # that straddles the cap (le=200 … le=500 with a cap of 256) read a p99 above it, which the inputs refuse
        top = limit if label == "input" else min(limit, ep.shape.max_tokens)
        p99 = histogram_quantile(0.99, {le: _num(c, f"{key} bucket") for le, c in h["buckets"].items()}, top)
        metric = f"vllm:request_{key}"
        shape[f"{label}_tokens_mean"] = fig(f"shape.{label}_tokens_mean", shape[f"{label}_tokens_mean"], _round(mean),
                                            f"{metric}_sum / _count over {count:g} requests")
        capped = f"; at most max_tokens {top}" if label == "output" else ""
        shape[f"{label}_tokens_p99"] = fig(f"shape.{label}_tokens_p99", shape[f"{label}_tokens_p99"], _round(p99),
                                           f"{metric}_bucket, p99 interpolated in its bucket (+Inf bounded by {top})"
                                           + capped)

    # prefix-cache hit share
    hit = ep.prefix_cache_hit_fraction
    pc = res.get("prefix_cache") or {}
    queries = _num(pc.get("queries", 0), "prefix_cache.queries")
    if queries > 0:
        hit = fig("prefix_cache_hit_fraction", ep.prefix_cache_hit_fraction,
                  _round(_num(pc["hits"], "prefix_cache.hits") / queries, 3),
                  "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total")
    else:
        kept.append(f"{name}: prefix-cache hit share (no prefix-cache lookups)")

    # engine throughput on the GPU kind (or MIG slice) the floor runs on
    engines = list(ep.engine)
    idx = next((i for i, e in enumerate(engines) if e.gpu_kind == gpu_kind), None)
    if idx is None:
        kept.append(f"{name}: engine throughput (no engine entry for {gpu_kind})")
    else:
        eng = engines[idx]
        target: Any = eng
        where = f"engine[{gpu_kind}]"
        if mig_profile is not None:
            target = next((m for m in eng.mig if m.profile == mig_profile), None)
            where = f"engine[{gpu_kind}].mig[{mig_profile}]"
        if target is None:
            kept.append(f"{name}: engine throughput (no MIG entry for {mig_profile})")
        else:
            upd: dict[str, float] = {}
            # the prompt tokens a replica computed (prefix-cache hits are not: the plan takes them off with the hit
            # share) over the prefill time, in the quiet hours only (QUIET_RUNNING_PER_REPLICA)
            quiet = [(_num(tok, "prefill_hours tokens") - _num(hits, "prefill_hours hits"), _num(s, "prefill_hours seconds"))
                     for _, tok, hits, s, run in (res.get("prefill_hours") or [])
                     if _num(run, "prefill_hours running") <= QUIET_RUNNING_PER_REPLICA and _num(s, "prefill_hours seconds") > 0]
            seconds = sum(s for _, s in quiet)
            if seconds >= MIN_QUIET_PREFILL_S:
                upd["prefill_tokens_per_s"] = fig(
                    f"{where}.prefill_tokens_per_s", target.prefill_tokens_per_s,
                    _round(sum(tok for tok, _ in quiet) / seconds),
                    f"(vllm:request_prompt_tokens_sum − vllm:prefix_cache_hits_total) / "
                    f"vllm:request_prefill_time_seconds_sum over the {len(quiet)} hours whose mean running requests per "
                    f"replica were ≤ {QUIET_RUNNING_PER_REPLICA:g} (busier, requests share their prefill seconds)")
            else:
                kept.append(f"{name}: prefill throughput ({seconds:.0f} s of prefill in hours with ≤ "
                            f"{QUIET_RUNNING_PER_REPLICA:g} running requests per replica, under {MIN_QUIET_PREFILL_S:g} s: "
                            "in busier hours requests share their prefill seconds, so their sum is not replica time)")
            busy = res.get("busiest_hour") or {}
            running = _num(busy.get("running_per_replica", 0), "busiest_hour.running_per_replica")
            holds = target.max_concurrent_sequences
            if running >= SATURATED_RUNNING_SHARE * holds:
                upd["decode_tokens_per_s"] = fig(
                    f"{where}.decode_tokens_per_s", target.decode_tokens_per_s,
                    _round(_num(busy["generation_tokens_per_s_per_replica"], "busiest_hour rate")),
                    f"busiest hour: vllm:generation_tokens_total per replica at {running:.0f} running sequences "
                    f"(≥ {SATURATED_RUNNING_SHARE:g} × max_concurrent_sequences {holds})")
            else:
                kept.append(f"{name}: decode throughput (busiest hour ran {running:.1f} sequences a replica, under "
                            f"{SATURATED_RUNNING_SHARE:g} × {holds}: not a saturation figure)")
            if upd:
                new_target = target.model_copy(update=upd)
                if mig_profile is not None:
                    eng = eng.model_copy(update={"mig": [new_target if m.profile == mig_profile else m for m in eng.mig]})
                else:
                    eng = new_target
                engines[idx] = eng

    # cold starts (kube-state-metrics timestamps per pod)
    cold = ep.cold_starts.model_dump()
    pods = res.get("pods") or []
    ready = [p for p in pods if p.get("ready_s") is not None and p.get("started_s") is not None]
    if ready:
        warm = statistics.median(_num(p["ready_s"], "ready_s") - _num(p["started_s"], "started_s") for p in ready)
        cold["pod_on_warm_node_s"] = fig("cold_starts.pod_on_warm_node_s", cold["pod_on_warm_node_s"], _round(warm, 3),
                                         f"median kube_pod_status_ready_time − kube_pod_start_time over {len(ready)} pods")
        waited = [p for p in ready if p.get("created_s") is not None
                  and _num(p["started_s"], "started_s") - _num(p["created_s"], "created_s") > NODE_WAIT_S]
        if waited:
            new_node = statistics.median(_num(p["ready_s"], "ready_s") - _num(p["created_s"], "created_s") for p in waited)
            cold["new_node_and_pod_s"] = fig(
                "cold_starts.new_node_and_pod_s", cold["new_node_and_pod_s"], _round(new_node, 3),
                f"median kube_pod_status_ready_time − kube_pod_created over {len(waited)} pods that waited "
                f"> {NODE_WAIT_S} s for a node")
        else:
            kept.append(f"{name}: new-node cold start (no pod waited for a node)")
    else:
        kept.append(f"{name}: cold starts (no pod became ready in the window)")

    try:
        new_ep = EndpointInputs.model_validate({
            **ep.model_dump(), "traffic": traffic.model_dump(), "shape": shape,
            "engine": [e.model_dump() for e in engines], "cold_starts": cold, "prefix_cache_hit_fraction": hit,
        })
    except ValidationError as e:
        raise CalibrationError(format_validation_error(e, f"calibrated figures of endpoint {name!r}")) from None
    return new_ep, figures, kept


LAST_UNIX_S = 253_402_300_799  # 9999-12-31 23:59:59 UTC: the last second a date can name
# the results document's entries by kind (module docstring): rows of so many numbers, or objects
_ROWS = {"requests_by_hour": 2, "requests_by_minute": 2, "prefill_hours": 5}
_OBJECTS = ("prompt_tokens", "generation_tokens", "prefix_cache", "busiest_hour", "queries", "requests_by_window")


def check_results_shape(results: Any) -> None:
    """Refuse a results document whose entries have the wrong shape, naming the entry (a saved document edited by
    hand, or another tool's: a string where rows belong ended in a traceback inside the arithmetic)."""
    def bad(where: str, want: str, got: Any) -> CalibrationError:
        return CalibrationError(f"results: {where}: expected {want}, got {str(got)[:80]!r}")

    def rows(x: Any, where: str, width: int) -> None:
        if not isinstance(x, list):
            raise bad(where, f"a list of [{', '.join(['number'] * width)}] rows", x)
        for i, r in enumerate(x):
            if not (isinstance(r, list) and len(r) == width and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in r)):
                raise bad(f"{where}[{i}]", f"{width} finite numbers", r)

    if not isinstance(results, Mapping):
        raise bad("(top level)", "an object with 'window' and 'endpoints'", results)
    if not isinstance(results.get("window"), Mapping):
        raise bad("window", "an object with start_s and end_s", results.get("window"))
    per_endpoint = results.get("endpoints") or {}
    if not isinstance(per_endpoint, Mapping):
        raise bad("endpoints", "an object of endpoint name → measurements", per_endpoint)
    for name, res in per_endpoint.items():
        if res is None:
            continue
        if not isinstance(res, Mapping):
            raise bad(f"endpoints.{name}", "an object of measurements", res)
        for key, width in _ROWS.items():
            if res.get(key) is not None:
                rows(res[key], f"endpoints.{name}.{key}", width)
        for key in _OBJECTS:
            if res.get(key) is not None and not isinstance(res[key], Mapping):
                raise bad(f"endpoints.{name}.{key}", "an object", res[key])
        windows = res.get("requests_by_window")
        if windows and windows.get("rows") is not None:
            rows(windows["rows"], f"endpoints.{name}.requests_by_window.rows", 2)
        pods = res.get("pods")
        if pods is not None and not (isinstance(pods, list) and all(isinstance(p, Mapping) for p in pods)):
            raise bad(f"endpoints.{name}.pods", "a list of objects (pod, created_s, started_s, ready_s)", pods)


def calibrate(inputs: CostInputs, results: Mapping[str, Any], placement: Mapping[str, tuple[str, str | None]],
              as_of: dt.date) -> Calibration:
    """New inputs from measured results. `placement`: endpoint -> (GPU kind, MIG profile) its floor runs on (the
    current plan's), so throughput lands on the engine entry that was measured. Endpoints without results keep
    their inputs."""
    check_results_shape(results)
    window = results.get("window") or {}
    try:
        span = (float(window["start_s"]), float(window["end_s"]))
    except (KeyError, TypeError, ValueError):
        raise CalibrationError("results: 'window' needs start_s and end_s (unix seconds)") from None
    if not span[0] < span[1]:
        raise CalibrationError(f"results: window start {span[0]} is not before its end {span[1]}")
    if not (0 <= span[0] and span[1] <= LAST_UNIX_S):
        raise CalibrationError(f"results: window {span[0]!r} to {span[1]!r} is not unix seconds between 0 and "
                               f"{LAST_UNIX_S:,}")
    per_endpoint = results.get("endpoints") or {}
    unknown = sorted(set(per_endpoint) - {e.name for e in inputs.endpoints})
    if unknown:
        raise CalibrationError(f"results name endpoints the inputs do not have: {unknown}")
    out = Calibration(inputs=inputs, as_of=as_of, window=span)
    endpoints = []
    for ep in inputs.endpoints:
        res = per_endpoint.get(ep.name)
        if not res or ep.name not in placement:
            endpoints.append(ep)
            out.kept.append(f"{ep.name}: everything (no measurements: no floor replicas or no data)")
            continue
        kind, mig = placement[ep.name]
        new_ep, figs, kept = calibrate_endpoint(ep, res, kind, mig, span)
        endpoints.append(new_ep)
        out.figures += figs
        out.kept += kept
    out.inputs = inputs.model_copy(update={"endpoints": endpoints})
    return out


def figure_change(f: Figure) -> str:
    """A figure's change in one line: old → new, and a 168-hour profile by its weekly mean."""
    if f.path.endswith("hourly_mean_requests_per_s"):
        new = f"{sum(f.new) / len(f.new):.4g} req/s"
        return f"mean {sum(f.old) / len(f.old):.4g} → {new}" if f.old else f"→ mean {new}"
    return f"{f.old} → {f.new}"


def provenance_header(cal: Calibration, stack: str) -> list[str]:
    """Comment lines for the written inputs document: dated, each figure with its source."""
    start, end = (dt.datetime.fromtimestamp(t, dt.timezone.utc) for t in cal.window)
    lines = [f"Calibrated inputs for {stack}, written {cal.as_of.isoformat()} from production measurements",
             f"window {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC. Figures replaced (old → new, source):"]
    for f in cal.figures:
        lines.append(f"- {f.path}: {figure_change(f)}  [{f.source}]")
    if cal.kept:
        lines.append("Kept as they were:")
        lines += [f"- {k}" for k in cal.kept]
    return lines
