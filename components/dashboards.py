"""A Grafana dashboard per endpoint with floor replicas: what production does next to what the plan assumed.

Pure functions (spec in, Grafana dashboard JSON model out); `Observability` ships each one as a ConfigMap that
kube-prometheus-stack's Grafana loads: its dashboards sidecar watches ConfigMaps labelled
`grafana_dashboard: "1"` in every namespace (chart 88.5.3 values: grafana.sidecar.dashboards.label /
labelValue / searchNamespace ALL), and its Prometheus datasource has uid `prometheus`.

Every plan figure a panel compares with is drawn as a constant line (`vector(x)`), read from the spec or from
the alert that guards it (one source for the threshold). Queries read the same series as the alerts and the
KEDA triggers: `sel` below are their selectors.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from zoneinfo import ZoneInfo

from topology.inputs import Prices
from topology.names import dashboard_file_name, dashboard_uid  # noqa: F401  (unique per namespace, ≤ 40)
from topology.spec import EndpointSpec

from .floor_replicas import burst_backlog_query, gateway_queues_floor, queue_query
from .names import TRACK_METRIC_LABEL, burst_backend_name, config_name, engine_selector
from .observability import (
    INTER_TOKEN_BUCKETS_S,
    KV_SATURATION,
    SHAPE_WINDOW_S,
    SLO_QUANTILE,
    TTFT_BUCKETS_S,
    duration,
    endpoint_alerts,
    prompt_p99_query,
    share_above_query,
    slo_bucket_bounds,
)

# kube-prometheus-stack 88.5.3 (prometheus-community/helm-charts, charts/kube-prometheus-stack/values.yaml)
DASHBOARD_LABEL = ("grafana_dashboard", "1")
DATASOURCE_UID = "prometheus"
SCHEMA_VERSION = 39  # what the chart's own bundled dashboards declare
GRID_WIDTH = 24
PANEL_W, PANEL_H = 12, 8
RATE = "$__rate_interval"  # Grafana's rate window: at least four scrape intervals of the datasource


def _sel(namespace: str, ep: EndpointSpec, *, stable: bool) -> str:
    return engine_selector(namespace, ep.name, ep.engine.served_model_name, stable=stable)


def _line(value: float) -> str:
    return f"vector({value:.6g})"


def minute_of_week_utc() -> str:
    """PromQL: the current minute of the week in UTC, Monday 00:00 = 0 (day_of_week() counts from Sunday = 0)."""
    return "(((day_of_week() + 6) % 7) * 1440 + hour() * 60 + minute())"


def schedule_query(replicas_by_hour: tuple[int, ...], utc_offset_min: int) -> str:
    """PromQL: the planned floor replicas now, from the plan's 168 hourly values in a zone `utc_offset_min` ahead
    of UTC. Runs of equal hours become one range test each: `(m >= a < b) * 0 + r`, joined with `or`."""
    if len(replicas_by_hour) != 168:
        raise ValueError(f"a weekly schedule has 168 hours, got {len(replicas_by_hour)}")
    local = f"(({minute_of_week_utc()} + {utc_offset_min + 10080}) % 10080)"
    runs, start = [], 0
    for h in range(1, 169):
        if h == 168 or replicas_by_hour[h] != replicas_by_hour[start]:
            runs.append((start * 60, h * 60, replicas_by_hour[start]))
            start = h
    return " or ".join(f"({local} >= {a} < {b}) * 0 + {r}" for a, b, r in runs)


def utc_offsets_min(timezone: str, year: int) -> dict[str, int]:
    """The zone's UTC offsets in January and July of `year` (standard and summer time; one entry when equal).
    PromQL's clock functions are UTC only, so a DST zone gets a line for each."""
    zone = ZoneInfo(timezone)
    offsets = {}
    for label, month in (("winter", 1), ("summer", 7)):
        off = dt.datetime(year, month, 1, 12, tzinfo=zone).utcoffset()
        offsets[label] = int(off.total_seconds() // 60)
    if offsets["winter"] == offsets["summer"]:
        return {"": offsets["winter"]}
    return offsets


def tier_prices_usd_per_gpu_hour(ep: EndpointSpec, prices: Prices) -> dict[str, float]:
    """$/GPU-hour of the floor's reserved and on-demand capacity (a burst container's price is the spec's own
    burst.usd_per_container_hour: GPUs, cores and memory, region pinning included)."""
    on_demand = prices.dedicated_on_demand_usd_per_gpu_hour[ep.capacity.gpu_kind]
    return {"reserved": on_demand * (1 - prices.reserved_discount_fraction), "on_demand": on_demand}


def _target(expr: str, legend: str, ref: int) -> dict:
    return {"refId": chr(ord("A") + ref), "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "expr": expr, "legendFormat": legend, "range": True}


def _panel(title: str, description: str, unit: str, targets: list[tuple[str, str]]) -> dict:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit, "min": 0}, "overrides": []},
        "options": {"legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi", "sort": "none"}},
        "targets": [_target(expr, legend, i) for i, (expr, legend) in enumerate(targets)],
    }


def endpoint_panels(ep: EndpointSpec, namespace: str, prices: Prices | None, year: int) -> list[dict]:
    alerts = {a.name: a for a in endpoint_alerts(ep, namespace).alerts}
    stable, every = _sel(namespace, ep, stable=True), _sel(namespace, ep, stable=False)
    a = ep.autoscaling
    hour = duration(SHAPE_WINDOW_S)
    m = ep.engine.metrics  # the pinned engine version's series names
    panels = []
    # vLLM observes TTFT once per request and the inter-token gap once per token (0.11.0 v1/metrics/loggers.py)
    for title, metric, slo_ms, buckets, counted in (
            ("TTFT", m.ttft_seconds_bucket, ep.slo_ttft_p99_ms, TTFT_BUCKETS_S, "requests"),
            ("Inter-token latency", m.inter_token_seconds_bucket, ep.slo_inter_token_p99_ms, INTER_TOKEN_BUCKETS_S,
             "token gaps")):
        q = f"sum by (le) (rate({metric}{stable}[{RATE}]))"
        panels.append(_panel(
            f"{title} p50 / p99 vs the SLO",
            f"Stable replicas, engine-side ({metric}); the SLO is a p99. Both lines are interpolated inside vLLM's "
            "buckets: where the SLO is not a bucket bound, read the share panel beside this one, which the page reads.",
            "s", [(f"histogram_quantile(0.5, {q})", "p50"), (f"histogram_quantile(0.99, {q})", "p99 (interpolated)"),
                  (_line(slo_ms / 1000), "SLO p99")]))
        # the share the SLO alerts read (observability.py): exact at a bucket bound, no interpolation
        lo, hi = slo_bucket_bounds(slo_ms / 1000, buckets)
        shares = [(share_above_query(metric, namespace, ep, hi, RATE),
                   f"over {hi * 1000:g} ms" + ("" if lo == hi else " (surely over the SLO)"))]
        if lo != hi:
            shares.append((share_above_query(metric, namespace, ep, lo, RATE), f"over {lo * 1000:g} ms (maybe over)"))
        shares.append((_line(1 - SLO_QUANTILE), "a p99 allows"))
        panels.append(_panel(
            f"{title}: share of {counted} over the SLO",
            f"Stable replicas: the share of {counted} slower than the bucket bound of {metric} at or above the "
            f"{slo_ms:g} ms SLO" + ("" if lo == hi else f" (and above its lower bound {lo * 1000:g} ms: the SLO lies "
                                    f"inside that bucket, so the histogram cannot tell {counted} between the two)")
            + ". The SLO alerts page when this stays above the line.", "percentunit", shares))
    panels.append(_panel(
        "Requests waiting per stable replica vs the KEDA target",
        "The queue trigger's query (engine queue, plus the gateway's floor queue under admission control) divided "
        "by the replicas reporting it (KEDA's AverageValue compares this).",
        "short",
        [(f"({queue_query(namespace, ep.name, ep.engine.served_model_name, m.requests_waiting, gateway_queues_floor(ep))})"
          f" / count({m.requests_waiting}{stable})",
          "waiting per replica"), (_line(a.target_waiting_per_replica), "target")]))
    panels.append(_panel(
        "KV-cache usage", "Share of KV-cache blocks in use per pod (both tracks).", "percentunit",
        [(f"max by (pod) ({m.kv_cache_usage}{every})", "{{pod}}"), (_line(KV_SATURATION), "saturation alert")]))
    panels.append(_panel(
        "Preemptions", "Requests preempted per second per pod; the line is the storm alert's threshold.", "reqps",
        [(f"sum by (pod) (rate({m.preemptions_total}{every}[{RATE}]))", "{{pod}}"),
         (_line(alerts["VllmPreemptionStorm"].threshold), "storm alert")]))
    hit = [(f"sum(rate({m.prefix_cache_hits_total}{stable}[{hour}])) / "
            f"sum(rate({m.prefix_cache_queries_total}{stable}[{hour}]))", "hit share (1 h)"),
           (_line(ep.planned_prefix_cache_hit_fraction), "plan")]
    if "VllmPrefixCacheHitRateDrop" in alerts:
        hit.append((_line(alerts["VllmPrefixCacheHitRateDrop"].threshold), "alert"))
    panels.append(_panel("Prefix-cache hit share vs plan", "Prompt tokens served from the prefix cache, last hour.",
                         "percentunit", hit))
    prompt = [(prompt_p99_query(namespace, ep, ep.planned_input_tokens_p99), "p99 prompt (1 h)"),
              (_line(ep.planned_input_tokens_p99), "plan")]
    if "VllmPromptLengthShift" in alerts:
        prompt.append((_line(alerts["VllmPromptLengthShift"].threshold), "alert"))
    panels.append(_panel(
        "p99 prompt tokens vs plan",
        "Interpolated in vLLM's 1-2-5 buckets with +Inf bounded by max_model_len: exact inside the bucket that "
        "holds the planned p99, on the right side of it elsewhere.", "short", prompt))
    schedule = [(f"count by ({TRACK_METRIC_LABEL}) ({m.requests_waiting}{every})", f"{{{{{TRACK_METRIC_LABEL}}}}}")]
    for season, offset in utc_offsets_min(ep.floor.timezone, year).items():
        schedule.append((schedule_query(ep.floor.replicas_by_hour, offset),
                         f"planned ({ep.floor.timezone}{', ' + season + ' time' if season else ''})"))
    panels.append(_panel(
        "Floor replicas vs the planned schedule",
        "Replicas whose engine reports metrics, by track, and the plan's replicas for this hour of the week "
        "(PromQL's clock is UTC: a zone with summer time gets a line for each offset).", "short", schedule))
    if ep.burst is not None:
        backends = "|".join(f"be_{config_name(ep.name)}_{side}" for side in ("floor", "canary", "burst"))
        share = (f'{burst_backlog_query(namespace, ep.name)} / sum(haproxy_backend_current_sessions'
                 f'{{namespace="{namespace}",proxy=~"{backends}"}})')
        burst_targets = [(burst_backlog_query(namespace, ep.name), "in flight to burst"), (share, "burst share")]
        if a.burst_backlog_threshold is not None:
            burst_targets.append((_line(a.burst_backlog_threshold), "floor's burst-backlog trigger"))
        panel = _panel("Burst: requests in flight and share",
                       f"Gateway backend {burst_backend_name(ep.name)}; the share is of all in-flight requests of the "
                       "endpoint.", "short", burst_targets)
        panel["fieldConfig"]["overrides"] = [{"matcher": {"id": "byName", "options": "burst share"},
                                              "properties": [{"id": "unit", "value": "percentunit"},
                                                             {"id": "custom.axisPlacement", "value": "right"}]}]
        panels.append(panel)
    if prices is not None:
        panels.append(cost_panel(ep, namespace, prices))
    return panels


def cost_panel(ep: EndpointSpec, namespace: str, prices: Prices) -> dict:
    """Cost per hour by tier: reserved replicas are paid whether busy or not; replicas above them are on demand;
    burst containers are estimated from the requests in flight to them (⌈in flight / target_inputs⌉, at least
    the warm minimum), as Modal's autoscaler sizes them."""
    usd = tier_prices_usd_per_gpu_hour(ep, prices)
    gpus = ep.capacity.gpus_per_replica / ep.capacity.replicas_per_gpu  # GPUs a replica occupies (MIG: a share)
    reserved = ep.floor.reserved_replicas
    replicas = f"count({ep.engine.metrics.requests_waiting}{_sel(namespace, ep, stable=False)})"
    targets = [(_line(reserved * gpus * usd["reserved"]), "reserved floor"),
               (f"clamp_min({replicas} - {reserved}, 0) * {gpus * usd['on_demand']:.6g}", "on-demand floor")]
    if ep.burst is not None:
        b = ep.burst
        containers = f"clamp_min(ceil({burst_backlog_query(namespace, ep.name)} / {b.target_inputs}), {b.min_containers})"
        targets.append((f"{containers} * {b.usd_per_container_hour:.6g}", "burst (estimated)"))
    return _panel("Cost per hour by tier", f"USD per hour at the prices of {prices.prices_as_of} "
                  f"({ep.capacity.gpu_kind}: on demand ${usd['on_demand']:.2f}/GPU-h).", "currencyUSD", targets)


def endpoint_dashboard(ep: EndpointSpec, namespace: str, prices: Prices | None = None, *,
                       year: int | None = None) -> dict:
    """The Grafana dashboard JSON model of one endpoint with floor replicas. `year` picks the summer/winter
    offsets of the floor's timezone (default: the prices' year, or 2026)."""
    if not ep.node_pools or ep.autoscaling is None:
        raise ValueError(f"endpoint {ep.name!r} has no floor replicas: its vLLM metrics are not scraped here")
    year = year or (prices.prices_as_of.year if prices is not None else 2026)
    panels = endpoint_panels(ep, namespace, prices, year)
    per_row = GRID_WIDTH // PANEL_W
    for i, p in enumerate(panels):
        p["id"] = i + 1
        p["gridPos"] = {"h": PANEL_H, "w": PANEL_W, "x": (i % per_row) * PANEL_W, "y": (i // per_row) * PANEL_H}
    return {
        "uid": dashboard_uid(namespace, ep.name),
        # Grafana keeps titles unique within a folder: the namespace tells two stacks' endpoints apart
        "title": f"LLM serving / {ep.name} ({namespace})",
        "description": f"{ep.name} ({ep.tier}): {ep.engine.served_model_name}, production against the plan.",
        "tags": ["llm-serving", ep.tier],
        "timezone": "browser",
        "editable": False,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-24h", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {"selected": False, "text": "Prometheus", "value": DATASOURCE_UID}, "hide": 0,
        }]},
        "annotations": {"list": []},
        "panels": panels,
    }


def dashboard_configmap_labels(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {DASHBOARD_LABEL[0]: DASHBOARD_LABEL[1], **(extra or {})}
