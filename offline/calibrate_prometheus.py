"""`python -m topology calibrate STACK --prometheus URL --since 7d` (or `--from-file results.json`): the I/O side.

Runs the queries of topology/calibrate.py (QUERIES) against Prometheus's HTTP API for every endpoint with floor
replicas, assembles the results document (saved with --save-results, replayed with --from-file), then hands it
with today's date to the pure calibration, writes the updated inputs document and prints the plan diff.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from topology.cli import check_writable_file, today as cli_today
from topology.calibrate import LAST_UNIX_S, QUERIES, calibrate, figure_change, provenance_header
from topology.loading import InputError, load_inputs
from topology.reading import MAX_TRACE_BYTES, read_document
from topology.names import promql_escape
from topology.plan import plan

DEFAULT_NAMESPACE = "llm-serving"
_SINCE = re.compile(r"^(\d+)([mhdw])$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
HTTP_TIMEOUT_S = 30
RANGE_POINTS = 10_000  # points a range query asks for at most (Prometheus refuses more than 11,000 per series)


def since_seconds(text: str) -> int:
    m = _SINCE.match(text.strip())
    if not m or int(m[1]) == 0:
        raise InputError(f"--since {text!r}: give a positive duration like 7d, 36h, 2w")
    return int(m[1]) * _UNIT_S[m[2]]


class Prometheus:
    def __init__(self, url: str):
        if not re.match(r"^https?://", url):
            raise InputError(f"--prometheus {url!r}: give an http(s) URL, e.g. http://localhost:9090")
        self.url = url.rstrip("/")

    def _get(self, path: str, params: dict[str, str]) -> Any:
        full = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(full, timeout=HTTP_TIMEOUT_S) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            raise InputError(f"Prometheus at {self.url} refused a query ({e.code}): {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise InputError(f"Prometheus at {self.url} did not answer: {e}") from None
        if body.get("status") != "success":
            raise InputError(f"Prometheus at {self.url}: {body.get('error', body)}")
        return body["data"]

    def instant(self, query: str, at_s: float) -> list[dict]:
        return self._get("/api/v1/query", {"query": query, "time": f"{at_s:.3f}"})["result"]

    def range(self, query: str, start_s: float, end_s: float, step_s: int) -> list[dict]:
        return self._get("/api/v1/query_range", {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                                                 "step": str(step_s)})["result"]


def _scalar(result: list[dict]) -> float:
    if not result:
        return 0.0
    v = float(result[0]["value"][1])
    return v if math.isfinite(v) else 0.0


def requests_by_window(prom: Prometheus, query: str, start_s: float, end_s: float,
                       started_s: dict[str, float] | None = None, window_s: int = 60) -> list[list[float]]:
    """[[unix_s, requests in the window ending then], ...], windows of `window_s` (60: minutes; a divisor of 60)
    from the raw request counters (one series per gateway pod) sampled at each window's end: each series'
    difference a window apart (after a reset — a restarted pod — the counter's value itself, as Prometheus's
    increase() counts it), summed over the series. A series first seen in the window counts from 0 only when its
    pod's HAProxy started within the window before its first sample (`started_s`: pod -> process start, unix s);
    otherwise (a pod older than the data, a gap in scraping) its first window is left out — its counter holds
    more than one. The window a pod stopped in counts it no more (at most its last window's requests lost). A
    window where a series has a gap, or a value not scraped within that window (scrapes further apart than the
    window), is left out for all of them, so a sum never misses a pod or lumps windows together."""
    w = int(window_s)
    first = math.ceil(start_s / w) * w
    last = math.floor(end_s / w) * w
    values: dict[tuple, dict[float, float]] = {}
    scraped: dict[tuple, dict[float, float]] = {}  # samples each series has in the window ending at each stamp
    t = first
    while t <= last:
        stop = min(last, t + w * (RANGE_POINTS - 1))
        # [w s − 1 ms], not [w s]: Prometheus 2.x's range includes the sample a whole window back (3.x's does not);
        # not a second short, which misses every sample of a scrape at the window's own interval that lands less
        # than a second after the window's end
        for q, into in ((query, values), (f"count_over_time({query}[{w * 1000 - 1}ms])", scraped)):
            for series in prom.range(q, t, stop, w):
                key = tuple(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))
                into.setdefault(key, {}).update((float(ts), float(v)) for ts, v in series["values"])
        t = stop + w  # the next chunk starts a window on; the difference across the seam is taken below
    per_window: dict[float, float] = {}
    missing: set[float] = set()
    stamps = [first + w * i for i in range(1, int((last - first) // w) + 1)]
    for key, samples in values.items():
        born, gone = min(samples), max(samples)
        fresh = scraped.get(key, {})
        pod_started = (started_s or {}).get(dict(key).get("pod", ""))
        for ts in stamps:
            a, b = samples.get(ts - w), samples.get(ts)
            if a is None and b is None:
                continue  # this pod did not exist then
            started = (a is None and ts == born and born > first and pod_started is not None
                       and ts - w < pod_started <= ts)
            if started:
                a = 0.0  # a pod started in the window: its counter started at 0 within the window before
            if b is None and ts - w == gone:
                continue  # the pod stopped within the window: its last requests are not in any sample
            if (a is None or b is None or not (math.isfinite(a) and math.isfinite(b))
                    or fresh.get(ts, 0.0) < 1 or (not started and fresh.get(ts - w, 0.0) < 1)):
                # a gap, or a value carried over from an older sample (scrapes further apart than the window:
                # the difference would put several windows' requests in one)
                missing.add(ts)
                continue
            per_window[ts] = per_window.get(ts, 0.0) + (b - a if b >= a else b)
    return [[ts, n] for ts, n in sorted(per_window.items()) if ts not in missing]


def scrape_window_s(prom: Prometheus, query: str, end_s: float) -> int | None:
    """The gateway counters' scrape interval rounded to a divisor of 60 s below a minute (the finest window the
    counters can be differenced over), from the samples each series has in the last hour; None when it is a minute
    or more (no window within a minute to compare)."""
    counts = [float(s["value"][1]) for s in prom.instant(f"count_over_time({query}[1h])", end_s)]
    if not counts:
        return None
    interval = 3600.0 / max(counts)
    for w in (5, 6, 10, 12, 15, 20, 30):
        if interval <= w + 1e-9:
            return w
    return None


def _histogram(prom: Prometheus, key: str, fill: dict[str, str], end_s: float) -> dict | None:
    buckets = {s["metric"]["le"]: float(s["value"][1]) for s in prom.instant(QUERIES[key].format(**fill), end_s)
               if "le" in s["metric"]}
    if "+Inf" not in buckets:
        return None
    return {"sum": _scalar(prom.instant(QUERIES[f"{key}_sum"].format(**fill), end_s)), "count": buckets["+Inf"],
            "buckets": buckets}


def floor_pod_regex(endpoint: str) -> str:
    """The names of the endpoint's floor pods (stable, canary, previous version), whole (PromQL anchors a regex
    match): a Deployment's pod is `<deployment>-<pod-template-hash>-<5 characters>`, both from Kubernetes'
    alphanumeric alphabet. kube-state-metrics' kube_pod_* series carry no pod labels, so the name is what tells
    an endpoint's pods apart; `<endpoint>-vllm-.*` also took the pods of an endpoint named `<endpoint>-vllm-x`
    (`chat-vllm-batch-vllm-5c6d7f-fghij` for `chat`), whose cold starts then entered `chat`'s median. A long
    name loses its last dash: the API server cuts a generateName prefix (`<replicaset>-`) to 58 characters before
    the 5 random ones (k8s.io/apiserver names generator), which from a 33-character endpoint reaches into the
    `-previous` ReplicaSet's hash (`<deployment>-<hash cut><5>`); such a name is one run of [a-z0-9] after the
    Deployment's name, which a pod of another endpoint (its own `-vllm` and dashes after it) never is."""
    return f"{re.escape(endpoint)}-vllm(-canary|-previous)?-[a-z0-9]+(-[a-z0-9]{{5}})?"


def query_fill(namespace: str, e, window: str) -> dict[str, str]:
    """What QUERIES' placeholders hold for one endpoint, escaped as PromQL string contents: re.escape writes the
    '-' of a name like 'chat-batch' as `\\-`, which PromQL refuses unescaped ("unknown escape sequence")."""
    from components.gateway_config import config_name

    fill = {"ns": namespace, "endpoint": e.name, "model": e.engine.served_model_name,
            "frontend": f"fe_{config_name(e.name)}", "pod_re": floor_pod_regex(e.name)}
    return {**{k: promql_escape(v) for k, v in fill.items()}, "w": window}


def hour_aligned_range(start_s: float, end_s: float, timezone: str) -> tuple[float, float]:
    """(first, last) sample instants of an hourly range over [start_s, end_s] that fall on the profile's local
    hour boundaries. Prometheus evaluates a range at start + k·step; each sample counts the hour before it and is
    filed under the local hour that hour began in (topology.calibrate.hourly_profile), so unaligned steps filed
    nearly every sample of a run started at HH:59 under the hour before, and split each hour at HH:30. The
    zone's offset at the start (a half-hour zone's too) sets the boundaries."""
    from zoneinfo import ZoneInfo

    off = dt.datetime.fromtimestamp(start_s, tz=dt.timezone.utc).astimezone(ZoneInfo(timezone)).utcoffset()
    off_s = off.total_seconds() if off is not None else 0.0
    first = math.ceil((start_s + 3600 + off_s) / 3600) * 3600 - off_s
    last = math.floor((end_s + off_s) / 3600) * 3600 - off_s
    return first, last


def query_results(prom: Prometheus, spec, namespace: str, start_s: float, end_s: float) -> dict:
    """The results document for every endpoint with floor replicas, over [start_s, end_s]."""
    window = f"{int(end_s - start_s)}s"
    out: dict[str, Any] = {"window": {"start_s": start_s, "end_s": end_s}, "endpoints": {}}
    for e in spec.endpoints:
        if not e.node_pools:
            continue
        fill = query_fill(namespace, e, window)
        res: dict[str, Any] = {"queries": {k: q.format(**fill) for k, q in QUERIES.items()}}
        first_h, last_h = hour_aligned_range(start_s, end_s, e.floor.timezone if e.floor is not None else "UTC")

        def hourly_series(key: str) -> list:
            """The query's hourly range on the profile's hour boundaries (none when the window holds no whole hour)."""
            return prom.range(QUERIES[key].format(**fill), first_h, last_h, 3600) if first_h <= last_h else []

        def hourly(key: str) -> dict[float, float]:
            return {float(t): float(v) for s in hourly_series(key) for t, v in s["values"] if math.isfinite(float(v))}

        res["requests_by_hour"] = [[float(t), float(v)] for s in hourly_series("requests_by_hour") for t, v in s["values"]]
        started = {s["metric"].get("pod", ""): float(s["value"][1])
                   for s in prom.instant(QUERIES["gateway_started"].format(**fill), end_s)}
        counter = QUERIES["requests_by_minute"].format(**fill)
        res["requests_by_minute"] = requests_by_window(prom, counter, start_s, end_s, started)
        # arrival_cluster_size from windows within each minute, as fine as the scrape interval allows
        scrape_w = scrape_window_s(prom, counter, end_s)
        if scrape_w is not None:
            res["requests_by_window"] = {"window_s": scrape_w,
                                         "rows": requests_by_window(prom, counter, start_s, end_s, started, scrape_w)}
        for key in ("prompt_tokens", "generation_tokens"):
            h = _histogram(prom, key, fill, end_s)
            if h is not None:
                res[key] = h
        res["prefix_cache"] = {"hits": _scalar(prom.instant(QUERIES["prefix_hits"].format(**fill), end_s)),
                               "queries": _scalar(prom.instant(QUERIES["prefix_queries"].format(**fill), end_s))}
        gen_at, run_at = hourly("generation_per_replica"), hourly("running_per_replica")
        tok_at, hit_at, pre_at = hourly("prompt_tokens_by_hour"), hourly("prefix_hits_by_hour"), hourly("prefill_seconds_by_hour")
        res["prefill_hours"] = [[t, tok_at[t], hit_at.get(t, 0.0), pre_at[t], run_at[t]]
                                for t in sorted(tok_at) if t in pre_at and t in run_at]
        if gen_at:
            busiest = max(gen_at, key=gen_at.get)
            res["busiest_hour"] = {"at_s": busiest, "generation_tokens_per_s_per_replica": gen_at[busiest],
                                   "running_per_replica": run_at.get(busiest, 0.0)}
        pods: dict[str, dict] = {}
        for key, name in (("pod_created", "created_s"), ("pod_started", "started_s"), ("pod_ready", "ready_s")):
            for s in prom.instant(QUERIES[key].format(**fill), end_s):
                pods.setdefault(s["metric"]["pod"], {"pod": s["metric"]["pod"]})[name] = float(s["value"][1])
        res["pods"] = sorted(pods.values(), key=lambda p: p["pod"])
        out["endpoints"][e.name] = res
    return out


def _namespace(stack_file: Path) -> str:
    doc = yaml.safe_load(stack_file.read_text())
    if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
        for key, value in doc["config"].items():
            if key.endswith(":namespace") and isinstance(value, str):
                return value
    return DEFAULT_NAMESPACE


def write_inputs(path: Path, cal, stack: str) -> None:
    header = "".join(f"# {line}\n" for line in provenance_header(cal, stack))
    body = yaml.safe_dump(cal.inputs.model_dump(mode="json", exclude_none=True), sort_keys=False, width=120)
    path.write_text(header + body)


def check_command_line(args: argparse.Namespace) -> None:
    """Every option that can be wrong, before the stack is planned or Prometheus asked (a typo in --out found only
    after the queries cost the whole run)."""
    from topology.names import check_dns_label

    check_writable_file(args.out, "--out", None, "inputs file", "calibrated.yaml")
    if args.save_results and not args.from_file:  # unused when replaying a saved document
        check_writable_file(args.save_results, "--save-results", None, "results file", "results.json")
    if args.namespace is not None:
        try:
            check_dns_label(args.namespace)
        except ValueError as e:
            raise InputError(f"--namespace: {e}") from None
    if args.until is not None and not (0 < args.until <= LAST_UNIX_S):
        raise InputError(f"--until {args.until!r}: give the window's end as unix seconds, between 1 and {LAST_UNIX_S:,}")


def cli_main(args: argparse.Namespace, today: dt.date | None = None, now_s: float | None = None) -> int:
    stack_file = Path(args.stack)
    prom = None
    check_command_line(args)
    if args.from_file:
        # a saved results document of two weeks with 15-second request counts runs past 10 MB: the traces' limit
        results = read_document(args.from_file, "--from-file", max_bytes=MAX_TRACE_BYTES)
        if not isinstance(results, dict):
            raise InputError(f"--from-file {args.from_file!r}: not a results document (a JSON object)")
    else:  # check the command line before planning (a typo should not cost a plan)
        if not args.prometheus:
            raise InputError("give --prometheus URL (with --since) or --from-file RESULTS.json")
        prom = Prometheus(args.prometheus)
        end_s = float(args.until) if args.until is not None else (now_s if now_s is not None else time.time())
        start_s = end_s - since_seconds(args.since)
        if start_s < 0:
            raise InputError(f"--since {args.since!r}: reaches before 1970 from the window's end; give a shorter window")
    inputs = load_inputs(stack_file)
    spec = plan(inputs)
    if prom is not None:
        results = query_results(prom, spec, args.namespace or _namespace(stack_file), start_s, end_s)
        if args.save_results:
            Path(args.save_results).write_text(json.dumps(results, indent=1))
    placement = {e.name: (e.capacity.gpu_kind, e.capacity.mig_profile) for e in spec.endpoints if e.node_pools}
    try:
        cal = calibrate(inputs, results, placement, today or cli_today())
    except (KeyError, TypeError, AttributeError) as e:
        raise InputError(f"results document: missing or malformed entry ({e!r})") from None
    out = Path(args.out)
    write_inputs(out, cal, stack_file.name)
    from topology.report import diff_specs

    print(f"wrote {out} ({sum(f.changed for f in cal.figures)} figures changed, {len(cal.kept)} kept)")
    for f in cal.figures:
        if f.changed:
            print(f"  {f.path}: {figure_change(f)}")
    print("\nplan diff against the current stack:")
    print("\n".join(diff_specs(spec, plan(cal.inputs))))
    return 0
