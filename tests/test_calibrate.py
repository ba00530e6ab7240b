"""Calibrate recovers a known week: a synthetic week of what the gateway, vLLM and kube-state-metrics export is
backfilled into a real Prometheus 2.42 TSDB (`promtool tsdb create-blocks-from openmetrics`), then
`python -m topology calibrate` queries it over HTTP and writes updated inputs; the recovered figures are compared
with the week's true figures (computed from the generated requests themselves).

Tolerances: exact (1e-6 relative, after the 4-significant-digit rounding of the written figure) for the hourly
profile, means, prefix-hit share, prefill rate, busiest-hour decode rate and cold starts; the p99s are read from
vLLM's 1-2-5 histogram buckets, so they must land in the true p99's bucket (all the histogram can tell) and
within 25 % of it (achieved on this week: input p99 9 639 → within 3 %, output 1 527 → 1 830, +20 %: linear
interpolation in the (1000, 2000] bucket, where the density falls steeply).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess

import numpy as np
import pytest
import yaml

from topology.calibrate import CalibrationError, calibrate, histogram_quantile, hour_of_week, hourly_profile
from topology.cli import main as cli
from topology.loading import load_inputs
from tests.conftest import ROOT
from tests.prometheus_support import PrometheusServer, require_binary

NS = "llm-serving"
STACK = ROOT / "stacks/Pulumi.prod.yaml"
WEEK_START_S = int(dt.datetime(2026, 1, 5, 5, tzinfo=dt.timezone.utc).timestamp())  # Monday 00:00 in New York (EST)
STEP_S = 300
STEPS = 7 * 24 * 12
PRICES_DAY = dt.date(2026, 12, 2)
PODS = ("assist-vllm-0", "assist-vllm-1")
PREFILL_TOKENS_PER_S = 14_000.0
PREFIX_HIT = 0.42
FLOOR_SHARE = 0.3  # of the gateway's requests, served (and measured) by the floor's two pods
COLD = {  # pod (named as a Deployment names them: <deployment>-<template hash>-<5>): (created, started, ready) s
    "assist-vllm-7d9b5c4f6-a2b4c": (1000, 1005, 1185), "assist-vllm-7d9b5c4f6-b2b4c": (2000, 2005, 2205),
    "assist-vllm-7d9b5c4f6-c2b4c": (3000, 3005, 3215), "assist-vllm-7d9b5c4f6-d2b4c": (4000, 4005, 4235),
    # ready after 200 s, then its readiness flapped two days later (FLAPS): its Ready condition's last transition is then
    "assist-vllm-7d9b5c4f6-k2b4c": (10000, 10005, 10205),
    "assist-vllm-canary-5f6d8-e2b4c": (5000, 5300, 5490), "assist-vllm-7d9b5c4f6-f2b4c": (6000, 6300, 6550),
    # pods of another endpoint whose name starts `assist-vllm-`: never assist's (its old regex took them, and their
    # day-long starts would have moved every median)
    "assist-vllm-x-vllm-7d9b5c4f6-g2b4c": (7000, 7000 + 86_400, 7000 + 2 * 86_400),
    "assist-vllm-x-vllm-7d9b5c4f6-h2b4c": (8000, 8000 + 86_400, 8000 + 2 * 86_400),
    "assist-vllm-x-vllm-7d9b5c4f6-i2b4c": (9000, 9000 + 86_400, 9000 + 2 * 86_400),
    "assist-vllm-x-vllm-7d9b5c4f6-j2b4c": (9500, 9500 + 86_400, 9500 + 2 * 86_400),
}


FLAPS = {"assist-vllm-7d9b5c4f6-k2b4c": (10205 + 2 * 86_400, 10205 + 2 * 86_400 + 120)}  # pod: (NotReady, Ready again)


def rate_of_hour(h: int) -> float:
    """True requests/s at the gateway in local hour-of-week h: a daily rhythm, quieter weekends."""
    day, hour = divmod(h, 24)
    daily = 5 + 4 * math.sin(2 * math.pi * (hour - 9) / 24)
    return round(daily * (0.6 if day >= 5 else 1.0), 3)


def one_two_five(limit: int) -> list[int]:
    out, e = [], 0
    while True:
        for m in (1, 2, 5):
            if m * 10**e > limit:
                return out
            out.append(m * 10**e)
        e += 1


def synthetic_week(max_model_len: int, max_sequences: int):
    """OpenMetrics text of the week and the true figures it was generated from."""
    rng = np.random.default_rng(15)
    bounds = one_two_five(max_model_len)
    lines: dict[str, list[str]] = {}
    ts = [WEEK_START_S + k * STEP_S for k in range(STEPS + 1)]

    def add(family, kind, series, values):
        lines.setdefault(f"# TYPE {family} {kind}", []).extend(f"{series} {v:.10g} {t}" for t, v in zip(ts, values))

    requests = np.array([0.0] + [rate_of_hour((k // 12) % 168) * STEP_S for k in range(STEPS)])
    add("haproxy_frontend_http_requests", "counter",
        f'haproxy_frontend_http_requests_total{{namespace="{NS}",pod="gw-0",proxy="fe_assist"}}', np.cumsum(requests))
    all_in, all_out, hourly_gen = [], [], np.zeros((len(PODS), 168 * 1))
    peak_rate = max(rate_of_hour(h) for h in range(168))
    for i, pod in enumerate(PODS):
        lab = (f'namespace="{NS}",pod="{pod}",serving_llm_endpoint="assist",model_name="llama-3.3-70b-instruct",'
               'engine="0",serving_llm_track="stable"')
        n = rng.poisson(requests[1:] * FLOOR_SHARE / len(PODS))
        prompt_cum = {b: [0.0] for b in [*bounds, math.inf]}
        out_cum = {b: [0.0] for b in [*bounds, math.inf]}
        psum, osum, gen, prefill = [0.0], [0.0], [0.0], [0.0]
        for k, count in enumerate(n):
            p = np.minimum(np.round(rng.lognormal(math.log(1500), 0.8, count)), max_model_len - 2048)
            o = np.minimum(np.round(rng.lognormal(math.log(300), 0.7, count)), 2048)
            all_in.append(p)
            all_out.append(o)
            for b in prompt_cum:
                prompt_cum[b].append(prompt_cum[b][-1] + float(np.sum(p <= b)))
                out_cum[b].append(out_cum[b][-1] + float(np.sum(o <= b)))
            psum.append(psum[-1] + float(p.sum()))
            osum.append(osum[-1] + float(o.sum()))
            gen.append(gen[-1] + float(o.sum()))
            # vLLM computes the prompt tokens the prefix cache does not hold
            prefill.append(prefill[-1] + float(p.sum()) * (1 - PREFIX_HIT) / PREFILL_TOKENS_PER_S)
            hourly_gen[i, (k // 12) % 168] += float(o.sum())
        for family, cum, total in (("vllm:request_prompt_tokens", prompt_cum, psum),
                                   ("vllm:request_generation_tokens", out_cum, osum)):
            for b, values in cum.items():
                le = "+Inf" if math.isinf(b) else repr(float(b))
                add(family, "histogram", f'{family}_bucket{{{lab},le="{le}"}}', values)
            add(family, "histogram", f"{family}_sum{{{lab}}}", total)
            add(family, "histogram", f"{family}_count{{{lab}}}", cum[math.inf])
        add("vllm:request_prefill_time_seconds", "histogram",
            f'vllm:request_prefill_time_seconds_bucket{{{lab},le="+Inf"}}', prompt_cum[math.inf])
        add("vllm:request_prefill_time_seconds", "histogram", f"vllm:request_prefill_time_seconds_sum{{{lab}}}", prefill)
        add("vllm:request_prefill_time_seconds", "histogram", f"vllm:request_prefill_time_seconds_count{{{lab}}}",
            prompt_cum[math.inf])
        add("vllm:prefix_cache_queries", "counter", f"vllm:prefix_cache_queries_total{{{lab}}}", psum)
        add("vllm:prefix_cache_hits", "counter", f"vllm:prefix_cache_hits_total{{{lab}}}",
            [PREFIX_HIT * x for x in psum])
        add("vllm:generation_tokens", "counter", f"vllm:generation_tokens_total{{{lab}}}", gen)
        # near full at the peak; in the quietest hours (≤ 1.2 req/s: nights, weekend mornings) about one request at
        # a time, the hours calibrate reads the prefill rate in (requests running together share prefill seconds)
        running = [1.0 if rate_of_hour((max(k - 1, 0) // 12) % 168) <= 1.2 else
                   0.95 * max_sequences * rate_of_hour((max(k - 1, 0) // 12) % 168) / peak_rate for k in range(STEPS + 1)]
        add("vllm:num_requests_running", "gauge", f"vllm:num_requests_running{{{lab}}}", running)
    # another endpoint of the stack serving the same model name in the same namespace (a batch twin of assist):
    # one-token prompts and outputs, no prefix hits, an absurd prefill time and output rate, nothing running. Every
    # figure above would move if assist's queries counted it.
    # and assist's own rollout candidate (track canary: other engine settings, mirrored or canary users), as absurd:
    # calibrate describes the stable deployment the plan sizes
    for lab in (f'namespace="{NS}",pod="assist-batch-vllm-0",serving_llm_endpoint="assist-batch",'
                'model_name="llama-3.3-70b-instruct",engine="0",serving_llm_track="stable"',
                f'namespace="{NS}",pod="assist-vllm-canary-5f6d8-k2b4c",serving_llm_endpoint="assist",'
                'model_name="llama-3.3-70b-instruct",engine="0",serving_llm_track="canary"'):
        steps = np.arange(STEPS + 1, dtype=float)
        for family in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
            for b in [*bounds, math.inf]:
                le = "+Inf" if math.isinf(b) else repr(float(b))
                add(family, "histogram", f'{family}_bucket{{{lab},le="{le}"}}', 500 * steps)
            add(family, "histogram", f"{family}_sum{{{lab}}}", 500 * steps)
            add(family, "histogram", f"{family}_count{{{lab}}}", 500 * steps)
        add("vllm:request_prefill_time_seconds", "histogram", f'vllm:request_prefill_time_seconds_bucket{{{lab},le="+Inf"}}',
            500 * steps)
        add("vllm:request_prefill_time_seconds", "histogram", f"vllm:request_prefill_time_seconds_sum{{{lab}}}", 250 * steps)
        add("vllm:request_prefill_time_seconds", "histogram", f"vllm:request_prefill_time_seconds_count{{{lab}}}",
            500 * steps)
        add("vllm:prefix_cache_queries", "counter", f"vllm:prefix_cache_queries_total{{{lab}}}", 500 * steps)
        add("vllm:prefix_cache_hits", "counter", f"vllm:prefix_cache_hits_total{{{lab}}}", 0 * steps)
        add("vllm:generation_tokens", "counter", f"vllm:generation_tokens_total{{{lab}}}", 10**6 * steps)
        add("vllm:num_requests_running", "gauge", f"vllm:num_requests_running{{{lab}}}", 0 * steps)
    for pod, (created, started, ready) in COLD.items():
        lab = f'namespace="{NS}",pod="{pod}",uid="uid-{pod}"'
        for family, at in (("kube_pod_created", created), ("kube_pod_start_time", started)):
            add(family, "gauge", f"{family}{{{lab}}}", [WEEK_START_S + at] * (STEPS + 1))
        # as kube-state-metrics reports them: the Ready condition's last transition (False since the start, then
        # True; a flap moves it twice), and whether the pod is Ready now
        down, up = FLAPS.get(pod, (math.inf, math.inf))
        rel = [k * STEP_S for k in range(STEPS + 1)]
        add("kube_pod_status_ready_time", "gauge", f"kube_pod_status_ready_time{{{lab}}}",
            [WEEK_START_S + (started if s < ready else ready if s < down else down if s < up else up) for s in rel])
        add("kube_pod_status_ready", "gauge", f'kube_pod_status_ready{{{lab},condition="true"}}',
            [1 if ready <= s < down or s >= up else 0 for s in rel])
    text = "".join(head + "\n" + "\n".join(body) + "\n" for head, body in lines.items()) + "# EOF\n"
    prompts, outputs = np.concatenate(all_in), np.concatenate(all_out)
    per_replica_hour = hourly_gen.sum(axis=0) / len(PODS) / 3600
    truth = {
        "profile": [rate_of_hour(h) for h in range(168)],
        "input_mean": float(prompts.mean()), "input_p99": float(np.quantile(prompts, 0.99)),
        "output_mean": float(outputs.mean()), "output_p99": float(np.quantile(outputs, 0.99)),
        "decode": float(per_replica_hour.max()),
        "bounds": bounds,
    }
    return text, truth


def backfill(work, text: str, *promtool_args: str) -> PrometheusServer:
    """A real Prometheus serving `text` (OpenMetrics, ending with '# EOF'), backfilled into work/data by promtool."""
    (work / "m.om").write_text(text)
    out = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", *promtool_args, "m.om",
                          str(work / "data")], cwd=work, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    (work / "prom").mkdir()
    return PrometheusServer(work / "prom", storage=work / "data", retention="100y")


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    require_binary("promtool")
    require_binary("prometheus")
    inputs = load_inputs(STACK)
    assist = next(e for e in inputs.endpoints if e.name == "assist")
    engine = next(e for e in assist.engine if e.gpu_kind == "H100-80GB")
    work = tmp_path_factory.mktemp("calibrate")
    text, truth = synthetic_week(assist.shape.product_max_context_tokens, engine.max_concurrent_sequences)
    prom = backfill(work, text, "--max-block-duration=168h")
    yield prom, truth, work, inputs
    prom.stop()


def in_same_bucket(a: float, b: float, bounds: list[int]) -> bool:
    def bucket(x):
        return next((i for i, ub in enumerate(bounds) if x <= ub), len(bounds))
    return bucket(a) == bucket(b)


def test_calibrate_recovers_the_known_week(backfilled, capsys):
    prom, truth, work, old_inputs = backfilled
    end = WEEK_START_S + 7 * 86400
    out, saved = work / "calibrated.yaml", work / "results.json"
    assert cli(["calibrate", str(STACK), "--prometheus", prom.url, "--since", "7d", "--until", str(end),
                "--out", str(out), "--save-results", str(saved)]) == 0
    printed = capsys.readouterr().out
    new = load_inputs(out)
    a = next(e for e in new.endpoints if e.name == "assist")

    # the hour-of-week profile, in the profile's timezone (the week was written in local New York hours)
    assert a.traffic.hourly_mean_requests_per_s == pytest.approx(truth["profile"], rel=1e-4)
    assert a.traffic.rate_trace is None
    # token shape: means exact; p99s in the true p99's bucket (all a 1-2-5 histogram can tell) and within 25 %
    assert a.shape.input_tokens_mean == pytest.approx(truth["input_mean"], rel=5e-4)
    assert a.shape.output_tokens_mean == pytest.approx(truth["output_mean"], rel=5e-4)
    for got, want in ((a.shape.input_tokens_p99, truth["input_p99"]), (a.shape.output_tokens_p99, truth["output_p99"])):
        assert in_same_bucket(got, want, truth["bounds"]), (got, want)
        assert got == pytest.approx(want, rel=0.25), (got, want)
    assert a.prefix_cache_hit_fraction == pytest.approx(PREFIX_HIT, abs=1e-3)
    engine = next(e for e in a.engine if e.gpu_kind == "H100-80GB")
    assert engine.prefill_tokens_per_s == pytest.approx(PREFILL_TOKENS_PER_S, rel=5e-4)
    assert engine.decode_tokens_per_s == pytest.approx(truth["decode"], rel=5e-4)  # busiest hour ran 95 % full
    # median of 180 200 210 230 190 250 and the flapping pod's 200 (its last Ready transition, 2 days on, is not it)
    assert a.cold_starts.pod_on_warm_node_s == pytest.approx(200)
    assert a.cold_starts.new_node_and_pod_s == pytest.approx(520)  # median of 490 and 550 (waited 300 s for a node)
    # endpoints with no measurements keep their inputs
    for name in ("autocomplete", "guard"):
        assert next(e for e in new.endpoints if e.name == name) == next(e for e in old_inputs.endpoints if e.name == name)

    # the document is dated and says where each figure came from
    header = [ln for ln in out.read_text().splitlines() if ln.startswith("#")]
    assert "written" in header[0] and "2026-01-05 05:00 to 2026-01-12 05:00 UTC" in header[1]
    assert any("prefix_cache_hit_fraction: 0.3 → 0.42" in ln and "vllm:prefix_cache_hits_total" in ln for ln in header)
    assert any('haproxy_frontend_http_requests_total{namespace="llm-serving",proxy="fe_assist"}' in ln for ln in header)
    assert "# Kept as they were:" in header and "# - guard: traffic profile (no gateway request counts in the window)" in header
    # and the plan diff against the current stack is printed
    assert "plan diff against the current stack" in printed and "~ assist:" in printed

    # replaying the saved results gives the same inputs (no Prometheus needed)
    again = work / "again.yaml"
    assert cli(["calibrate", str(STACK), "--from-file", str(saved), "--out", str(again)]) == 0
    assert load_inputs(again) == new


# ── the pure part ────────────────────────────────────────────────────────────────────────────────

def test_histogram_quantile_hand_figures():
    # 100 requests: 90 at most 10 tokens, 8 in (10, 20], 2 above 20 (bounded by 50)
    buckets = {"10.0": 90, "20.0": 98, "+Inf": 100}
    assert histogram_quantile(0.5, buckets, 50) == pytest.approx(10 * 50 / 90)
    assert histogram_quantile(0.95, buckets, 50) == pytest.approx(10 + 10 * 5 / 8)
    assert histogram_quantile(0.99, buckets, 50) == pytest.approx(20 + 30 * 1 / 2)
    assert math.isnan(histogram_quantile(0.99, {"10.0": 0, "+Inf": 0}, 50))
    with pytest.raises(CalibrationError, match="Inf"):
        histogram_quantile(0.5, {"10.0": 3}, 50)


def test_hour_of_week_follows_the_profiles_timezone_through_dst():
    tz = "America/New_York"
    monday_midnight_est = dt.datetime(2026, 1, 5, 5, tzinfo=dt.timezone.utc).timestamp()
    assert hour_of_week(monday_midnight_est, tz) == 0
    monday_midnight_edt = dt.datetime(2026, 7, 6, 4, tzinfo=dt.timezone.utc).timestamp()
    assert hour_of_week(monday_midnight_edt, tz) == 0
    assert hour_of_week(monday_midnight_edt - 1, tz) == 167
    # two weeks average; the count of an hour is stamped at its end
    rows = [(monday_midnight_est + 3600, 3600.0), (monday_midnight_est + 3600 + 7 * 86400, 7200.0)]
    profile = hourly_profile(rows, tz)
    assert profile[0] == pytest.approx(1.5) and profile[1] is None


def test_bad_results_documents_are_named_errors():
    inputs = load_inputs(STACK)
    placement = {"assist": ("H100-80GB", None)}
    with pytest.raises(CalibrationError, match="window"):
        calibrate(inputs, {"endpoints": {}}, placement, PRICES_DAY)
    with pytest.raises(CalibrationError, match="endpoints the inputs do not have"):
        calibrate(inputs, {"window": {"start_s": 0, "end_s": 10}, "endpoints": {"nope": {}}}, placement, PRICES_DAY)
    with pytest.raises(CalibrationError, match="not a number"):
        calibrate(inputs, {"window": {"start_s": 0, "end_s": 10},
                           "endpoints": {"assist": {"prefix_cache": {"queries": "many", "hits": 1}}}}, placement,
                  PRICES_DAY)
    # figures the inputs' validators refuse (a p99 prompt beyond the product limit) say so, not a traceback
    bad = {"window": {"start_s": 0, "end_s": 10}, "endpoints": {"assist": {
        "prompt_tokens": {"sum": 1e9, "count": 1e5, "buckets": {"10000.0": 0, "+Inf": 1e5}}}}}
    with pytest.raises(CalibrationError, match="calibrated figures of endpoint 'assist'"):
        calibrate(inputs, bad, placement, PRICES_DAY)


def test_command_line_mistakes_are_clear_errors(tmp_path, capsys):
    from tests.gateway_harness import free_port

    out = str(tmp_path / "o.yaml")
    (tmp_path / "bad.json").write_text("{not json")
    cases = [
        (["--prometheus", "localhost:9090"], "give an http(s) URL"),
        (["--prometheus", f"http://127.0.0.1:{free_port()}", "--since", "0d"], "--since '0d'"),
        (["--prometheus", f"http://127.0.0.1:{free_port()}", "--since", "7d"], "did not answer"),
        (["--from-file", str(tmp_path / "bad.json")], "--from-file"),
        (["--from-file", str(tmp_path / "missing.json")], "--from-file"),
    ]
    for args, message in cases:
        assert cli(["calibrate", str(STACK), *args, "--out", out]) == 2, args
        err = capsys.readouterr().err
        # the prod stack's rate trace has windows with no data: a `warning:` line may come first
        lines = [x for x in err.splitlines() if not x.startswith("warning: ")]
        assert lines and lines[0].startswith("error:") and message in err and "Traceback" not in err, (args, err)


# ── within-hour burstiness from per-minute counts ────────────────────────────────────────────────

def _bursty_minutes(hours: int, per_minute: float, peak: float, tau_s: float, idle: float, seed: int) -> np.ndarray:
    """(hours, 60) request counts: each minute idle with probability `idle`, else Poisson at per_minute × a Gamma
    factor (busiest minute `peak` × the mean over the active minutes) kept from the minute before with probability
    e^(−60/τ) — the plan's own traffic model, drawn."""
    from topology.minute_factors import factor_keep, gamma_alpha_for_peak_with_idle

    rng = np.random.default_rng(seed)
    alpha = gamma_alpha_for_peak_with_idle(peak, idle)
    keep = factor_keep(tau_s)
    n = hours * 60
    g = np.empty(n)
    draw = lambda: (0.0 if rng.random() < idle else  # noqa: E731
                    (rng.gamma(alpha, 1 / alpha) if alpha is not None else 1.0) / (1 - idle))
    g[0] = draw()
    for i in range(1, n):
        g[i] = g[i - 1] if rng.random() < keep else draw()
    return rng.poisson(per_minute * g).reshape(hours, 60).astype(float)


def _minute_rows(counts: np.ndarray, start_s: int) -> list[list[float]]:
    return [[start_s + 60 * (i + 1), float(c)] for i, c in enumerate(counts.ravel())]


def test_calibrate_measures_the_within_hour_traffic_from_minute_counts():
    """Per-minute counts of 48 hours drawn from the plan's traffic model (busiest minute 3× the mean, factor kept
    for τ = 600 s, 30% idle minutes, 6 requests a minute): calibrate writes the three within-hour inputs the
    measurement functions read from those counts (topology.plan.serverless.within_hour_from_minute_counts and
    correlation_s_from_minute_counts, each checked against its generating model in tests/test_cost_model.py),
    near the truth (peak 3.0 → 2.6–3.6, τ 600 → 400–800 s, idle 0.3 → 0.2–0.4; 3.3, 0.24 here: with a factor
    that persists, 48 hours hold few independent runs), with the cluster size kept (it needs 10-second counts)
    and the source named; a minute missing leaves its hour out; fewer than 24 whole hours move nothing."""
    from topology.plan.serverless import correlation_s_from_minute_counts, within_hour_from_minute_counts

    inputs = load_inputs(STACK)
    placement = {"assist": ("H100-80GB", None)}
    start = WEEK_START_S
    counts = _bursty_minutes(48, 6.0, 3.0, 600.0, 0.3, seed=3)
    rows = _minute_rows(counts, start)
    del rows[60 * 5 + 17]  # a minute missing: hour 5 is left out
    res = {"window": {"start_s": start, "end_s": start + 48 * 3600}, "endpoints": {"assist": {"requests_by_minute": rows}}}
    cal = calibrate(inputs, res, placement, PRICES_DAY)
    a = next(e for e in cal.inputs.endpoints if e.name == "assist")
    kept_hours = np.delete(counts, 5, axis=0)
    B = a.traffic.arrival_cluster_size
    pf, idle = within_hour_from_minute_counts(kept_hours, B)
    assert a.traffic.within_hour_peak_factor == pytest.approx(pf, rel=1e-3)
    assert a.traffic.within_hour_correlation_s == pytest.approx(correlation_s_from_minute_counts(kept_hours, B), rel=1e-3)
    assert a.traffic.idle_minute_share == pytest.approx(idle, abs=1e-3)
    assert 2.6 <= a.traffic.within_hour_peak_factor <= 3.6
    assert 400 <= a.traffic.within_hour_correlation_s <= 800
    assert 0.2 <= a.traffic.idle_minute_share <= 0.4
    src = next(f.source for f in cal.figures if f.path.endswith("within_hour_peak_factor"))
    busy = int((kept_hours.mean(axis=1) >= 1).sum())  # hours with traffic (a persisting idle run empties some)
    assert 40 <= busy < 47 and f"{busy} whole hours with traffic" in src and "arrival_cluster_size" in src
    # a day's worth is needed
    short = {"window": res["window"], "endpoints": {"assist": {"requests_by_minute": _minute_rows(counts[:23], start)}}}
    cal = calibrate(inputs, short, placement, PRICES_DAY)
    a = next(e for e in cal.inputs.endpoints if e.name == "assist")
    assert a.traffic == next(e for e in inputs.endpoints if e.name == "assist").traffic
    assert any("within-hour burstiness (" in k and "fewer than 24" in k for k in cal.kept)
    # a minute sampled twice is a named error
    twice = {"window": res["window"], "endpoints": {"assist": {"requests_by_minute": rows[:3] + rows[2:3]}}}
    with pytest.raises(CalibrationError, match="requests_by_minute has two samples for the window ending at"):
        calibrate(inputs, twice, placement, PRICES_DAY)


def test_minute_counts_come_from_the_raw_counters_of_every_gateway_pod(tmp_path):
    """The I/O side against a real Prometheus: gateway pods' request counters scraped every 15 s for three hours —
    pod a restarts at 01:00 (its counter back to 0), pod b starts at 01:30:15 (its HAProxy start time exported, as
    promex does), pod c is first seen at 01:40:05 with a counter already at 1,000,000 (older than the data: no
    start time in the window), and 02:00–03:00 pod a is scraped only every 5 minutes. requests_by_window() gives
    each minute's requests summed over the pods exactly (the counts written) across the restart and the new pod, in
    range queries of at most 100 points (the chunking a week needs at 10,000); pod c's first minute is left out,
    not counted as a million requests; the coarsely scraped hour's minutes are left out, not lumped."""
    import offline.calibrate_prometheus as cp

    require_binary("promtool")
    require_binary("prometheus")
    rng = np.random.default_rng(4)
    t0 = WEEK_START_S
    minutes = 180
    want = np.zeros(minutes)
    want_15 = np.zeros(minutes * 4)
    lines = ["# TYPE haproxy_frontend_http_requests counter"]
    for pod, born, base in (("gw-a", 0, 0.0), ("gw-b", 90 * 60 + 15, 0.0), ("gw-c", 100 * 60 + 5, 1e6)):
        value = base
        for k in range(0, minutes * 60 + 1, 5):
            if k < born or (k - born) % 15:
                continue
            if pod == "gw-a" and k == 60 * 60 + 15:
                value = 0.0  # restarted right after the 01:00 scrape: the requests since then are the new counter's
            if k > born:
                n = float(rng.poisson(2.0))
                value += n
                want[min((k - 1) // 60, minutes - 1)] += n
                want_15[min((k - 1) // 15, minutes * 4 - 1)] += n
            coarse = pod == "gw-a" and 120 * 60 < k < 180 * 60 and k % 300 != 0
            if not coarse:
                lines.append(f'haproxy_frontend_http_requests_total{{namespace="{NS}",pod="{pod}",proxy="fe_assist"}} '
                             f"{value:.10g} {t0 + k}")
    server = backfill(tmp_path, "\n".join(lines) + "\n# EOF\n")
    started = {"gw-a": t0 - 86400.0, "gw-b": t0 + 90 * 60 + 12.0}  # gw-c: started before the data
    try:
        prom = cp.Prometheus(server.url)
        query = f'haproxy_frontend_http_requests_total{{namespace="{NS}",proxy="fe_assist"}}'
        old, cp.RANGE_POINTS = cp.RANGE_POINTS, 100
        try:
            rows = cp.requests_by_window(prom, query, t0, t0 + minutes * 60, started)
            quarter = cp.requests_by_window(prom, query, t0, t0 + 60 * 60, started, window_s=15)
        finally:
            cp.RANGE_POINTS = old
        scrape = cp.scrape_window_s(prom, query, t0 + 60 * 60)
    finally:
        server.stop()
    # the scrape interval, and the first hour's 15-second windows exact (arrival_cluster_size's counts)
    assert scrape == 15
    assert [n for _, n in quarter] == want_15[:240].tolist() and len(quarter) == 240
    got = {int(t - t0) // 60 - 1: n for t, n in rows}
    assert sorted(got) == [m for m in range(120) if m != 100], "every minute of two hours but pod c's first"
    assert [got[m] for m in sorted(got)] == [want[m] for m in sorted(got)]


def test_calibrate_measures_the_cluster_size_from_windows_within_minutes():
    """With the counters scraped every 15 s, calibrate also measures arrival_cluster_size: 30 hours of 15-second
    counts where requests come in bunches of 5 (5 × Poisson) at a Gamma-varying rate read 5 within 10%, the figure
    is written with its window named, and the within-hour figures take the Poisson-and-bunch noise out with it:
    the peak factor reads 2.43 for the drawn Gamma(4)'s 2.34; told B = 1, the bunches read as burstiness (2.71)."""
    rng = np.random.default_rng(8)
    hours, start = 30, WEEK_START_S
    g = rng.gamma(4.0, 0.25, hours * 60)
    bunches = rng.poisson(np.repeat(g, 4) * 2.0)  # bunches per 15 s: 8 a minute at g = 1
    quarter = 5.0 * bunches
    minute = quarter.reshape(-1, 4).sum(axis=1)
    res = {"window": {"start_s": start, "end_s": start + hours * 3600}, "endpoints": {"assist": {
        "requests_by_minute": [[start + 60 * (i + 1), float(c)] for i, c in enumerate(minute)],
        "requests_by_window": {"window_s": 15, "rows": [[start + 15 * (i + 1), float(c)] for i, c in enumerate(quarter)]},
    }}}
    inputs = load_inputs(STACK)
    cal = calibrate(inputs, res, {"assist": ("H100-80GB", None)}, PRICES_DAY)
    a = next(e for e in cal.inputs.endpoints if e.name == "assist")
    assert a.traffic.arrival_cluster_size == pytest.approx(5.0, rel=0.1)
    src = next(f.source for f in cal.figures if f.path.endswith("arrival_cluster_size"))
    assert "15-second request counts" in src and f"{hours * 60} whole minutes" in src
    from topology.plan.serverless import peak_factor_from_minute_counts, within_hour_from_minute_counts

    by_hour = minute.reshape(hours, 60).astype(float)
    assert a.traffic.within_hour_peak_factor == pytest.approx(
        min(20.0, within_hour_from_minute_counts(by_hour, a.traffic.arrival_cluster_size)[0]), rel=3e-3)  # 3 digits
    from topology.plan.serverless import peak_factor_of_alpha

    drawn = peak_factor_of_alpha(4.0)  # the Gamma(4) rate's busiest minute, 2.34
    assert a.traffic.within_hour_peak_factor == pytest.approx(drawn, rel=0.08)  # 2.43
    assert peak_factor_from_minute_counts(by_hour, 1.0) > 1.12 * drawn  # told B = 1: 2.71
    bad = {"window": res["window"], "endpoints": {"assist": {**res["endpoints"]["assist"],
                                                             "requests_by_window": {"window_s": 7, "rows": []}}}}
    with pytest.raises(CalibrationError, match="window_s is 7, not a divisor of 60"):
        calibrate(inputs, bad, {"assist": ("H100-80GB", None)}, PRICES_DAY)


def test_every_query_parses_for_endpoints_named_with_a_dash(tmp_path):
    """The kube_pod_* queries match pods by a regex of the endpoint's name; re.escape writes 'chat-batch' as
    `chat\\-batch`, which PromQL refused unescaped inside a string ("unknown escape sequence"): calibrating any
    endpoint with a '-' in its name failed. promtool parses every query as it is sent, for such names."""
    import types

    from offline.calibrate_prometheus import query_fill
    from topology.calibrate import QUERIES

    require_binary("promtool")
    rules = []
    for i, name in enumerate(("chat-batch", "a-b-c", "assist")):
        e = types.SimpleNamespace(name=name, engine=types.SimpleNamespace(served_model_name="org/llama-3.3-70b"))
        fill = query_fill(NS, e, "604800s")
        rules += [{"record": f"calibrate:{key}_{i}", "expr": q.format(**fill)} for key, q in QUERIES.items()]
        assert fill["pod_re"].startswith(name.replace("-", "\\\\-") + "-vllm")
    (tmp_path / "q.yml").write_text(yaml.safe_dump({"groups": [{"name": "calibrate", "rules": rules}]}, width=100_000))
    out = subprocess.run(["promtool", "check", "rules", "q.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout + out.stderr


def test_the_pod_regex_takes_an_endpoints_own_pods_only():
    """kube_pod_* series carry no pod labels: an endpoint's floor pods are told apart by name. With `chat` and
    `chat-vllm-batch` in one namespace, `chat`'s regex took the other's pods too (`chat-vllm-.*`)."""
    import re

    from offline.calibrate_prometheus import floor_pod_regex

    def matches(endpoint: str, pod: str) -> bool:  # PromQL anchors the whole value; RE2 reads this subset as re
        return re.fullmatch(floor_pod_regex(endpoint), pod) is not None

    for pod in ("chat-vllm-5c6d7f8b9-fghij", "chat-vllm-canary-7d9b5c4f6-x2z4k", "chat-vllm-previous-66b9c-q8wxz"):
        assert matches("chat", pod), pod
    for pod in ("chat-vllm-batch-vllm-5c6d7f8b9-fghij", "chat-vllm-x-vllm-canary-7d9b5c4f6-x2z4k",
                "chat-vllm-vllm-5c6d7f8b9-fghij", "chat-batch-vllm-5c6d7f8b9-fghij", "chat-vllm-5c6d7f8b9-fghij-x"):
        assert not matches("chat", pod), pod
    assert matches("chat-vllm-batch", "chat-vllm-batch-vllm-5c6d7f8b9-fghij")
    # a long name: the API server cuts `<replicaset>-` to 58 characters before the 5 random ones
    long = "e" * 35
    for dep in (f"{long}-vllm-canary", f"{long}-vllm-previous", f"{long}-vllm"):
        pod = f"{dep}-7d9b5c4f6b-"[:58] + "x2z4k"
        assert matches(long, pod), pod
        assert not matches("e" * 34, pod) and not matches(long + "-vllm-x", pod)
    assert matches("a.b", "a.b-vllm-5c6d7f8b9-fghij") and not matches("a.b", "axb-vllm-5c6d7f8b9-fghij")


@pytest.mark.parametrize("timezone, offset_h", [("America/New_York", -5), ("Asia/Kolkata", 5.5)])
def test_the_hourly_profile_lands_on_the_profiles_own_hours_whenever_calibrate_runs(tmp_path, timezone, offset_h):
    """Requests at 1 req/s only in one local hour (Monday 11:00–12:00 in the profile's zone), counted by a real
    Prometheus from a counter scraped every 15 s, and the hourly range calibrate asks for run at 12:59:30 local
    (and at 12:30:00): all of that hour's requests land in hour 11 of the profile, none in 10 or 12. Before, the
    range stepped from the run's own instant, so a run at 12:59:30 filed 99% of the hour under hour 10, and one at
    12:30 split it half and half; a zone half an hour off UTC split every hour."""
    import offline.calibrate_prometheus as cp

    require_binary("promtool")
    require_binary("prometheus")
    monday = dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc).timestamp() - offset_h * 3600  # Monday 00:00 local
    t0, t1 = monday + 11 * 3600, monday + 12 * 3600
    lines = ["# TYPE haproxy_frontend_http_requests counter"]
    value = 0.0
    for k in range(int(monday + 8 * 3600), int(monday + 14 * 3600) + 1, 15):
        if t0 < k <= t1:
            value += 15.0
        lines.append(f'haproxy_frontend_http_requests_total{{namespace="{NS}",pod="gw-a",proxy="fe_assist"}} {value:g} {k}')
    server = backfill(tmp_path, "\n".join(lines) + "\n# EOF\n")
    query = cp.QUERIES["requests_by_hour"].format(ns=NS, frontend="fe_assist", endpoint="assist", model="m", pod_re="x",
                                                  w="1h")
    try:
        prom = cp.Prometheus(server.url)
        for end_s in (monday + 12 * 3600 + 59 * 60 + 30, monday + 12 * 3600 + 30 * 60):
            first, last = cp.hour_aligned_range(end_s - 4 * 3600, end_s, timezone)
            rows = [[float(t), float(v)] for s in prom.range(query, first, last, 3600) for t, v in s["values"]]
            profile = hourly_profile(rows, timezone)
            assert profile[11] == pytest.approx(1.0, abs=0.01), (end_s, rows)
            assert (profile[10] or 0.0) < 0.01 and (profile[12] or 0.0) < 0.01, (end_s, rows)
    finally:
        server.stop()


def test_decode_rate_per_replica_holds_when_the_floor_scales_within_the_hour(tmp_path):
    """Two stable replicas each decode 100 tokens/s; one is gone from half past the hour (the floor scaled 2 → 1).
    Against a real Prometheus, the hour's figures calibrate reads give 100 tokens/s per replica and the running
    requests per replica weighted by each replica's time (a: 6 all hour, b: 2 for half), where dividing by the replicas alive at the hour's end read
    about 150 and averaging per pod counted the half-hour pod like a whole one."""
    import offline.calibrate_prometheus as cp
    from topology.calibrate import QUERIES
    from topology.names import ENDPOINT_METRIC_LABEL, TRACK_METRIC_LABEL, TRACK_STABLE

    require_binary("promtool")
    require_binary("prometheus")
    t0 = WEEK_START_S + 10 * 3600
    labels = f'namespace="{NS}",{ENDPOINT_METRIC_LABEL}="assist",model_name="m",{TRACK_METRIC_LABEL}="{TRACK_STABLE}"'
    lines = ["# TYPE vllm:generation_tokens counter", "# TYPE vllm:num_requests_running gauge"]
    gen, run = [], []
    for pod, until in (("a", 3600), ("b", 1800)):
        for k in range(0, until + 1, 15):
            gen.append(f'vllm:generation_tokens_total{{{labels},pod="{pod}"}} {100.0 * k:g} {t0 + k}')
            run.append(f'vllm:num_requests_running{{{labels},pod="{pod}"}} {6 if pod == "a" else 2} {t0 + k}')
    server = backfill(tmp_path, "\n".join(lines[:1] + gen + lines[1:] + run) + "\n# EOF\n")
    fill = {"ns": NS, "endpoint": "assist", "model": "m"}
    try:
        prom = cp.Prometheus(server.url)
        gen_q = prom.instant(QUERIES["generation_per_replica"].format(**fill), t0 + 3600)
        run_q = prom.instant(QUERIES["running_per_replica"].format(**fill), t0 + 3600)
    finally:
        server.stop()
    # 94–95 here: blocks written by promtool carry no staleness marker, so the gone replica still counts for the
    # 5-minute lookback after its last sample (a live Prometheus marks a vanished target's series stale at once)
    assert float(gen_q[0]["value"][1]) == pytest.approx(100.0, rel=0.07)
    # a: 6 running for the hour, b: 2 for its half: (6 × 60 + 2 × 30) / 90 replica-minutes (per pod averaged: 4)
    assert float(run_q[0]["value"][1]) == pytest.approx(420 / 90, rel=0.01)


def test_prefill_rate_comes_from_quiet_hours_and_the_tokens_the_cache_did_not_hold():
    """Hand-worked: a replica computes 10,000 uncached prompt tokens a second. Two quiet hours (one request running
    at a time): 1.0 M and 0.5 M prompt tokens of which 40% were prefix-cache hits, so 60 and 30 prefill seconds;
    two busy hours (eight running): per-request prefill times overlap, 8 × what the replica spent. Calibrate reads
    (1.5 M − 0.6 M) / 90 s = 10,000 — not 1.5 M / 90 (the cache counted twice: the plan takes the hit share off
    again) and not the busy hours' 1,250. With no quiet hour it keeps the input and says why."""
    inputs = load_inputs(STACK)
    placement = {"assist": ("H100-80GB", None)}
    t = WEEK_START_S + 3600
    rows = [[t, 1.0e6, 0.4e6, 60.0, 1.0], [t + 3600, 0.5e6, 0.2e6, 30.0, 1.2],
            [t + 7200, 2.0e6, 0.8e6, 8 * 120.0, 8.0], [t + 10800, 2.0e6, 0.8e6, 8 * 120.0, 7.5]]
    doc = {"window": {"start_s": t - 3600, "end_s": t + 10800}, "endpoints": {"assist": {"prefill_hours": rows}}}
    cal = calibrate(inputs, doc, placement, PRICES_DAY)
    engine = next(e for e in next(e for e in cal.inputs.endpoints if e.name == "assist").engine
                  if e.gpu_kind == "H100-80GB")
    assert engine.prefill_tokens_per_s == pytest.approx(10_000.0)
    busy_only = {"window": doc["window"], "endpoints": {"assist": {"prefill_hours": rows[2:]}}}
    cal = calibrate(inputs, busy_only, placement, PRICES_DAY)
    assert any("prefill throughput (0 s of prefill in hours with ≤ 1.5 running" in k for k in cal.kept), cal.kept


def test_the_bundled_example_results_replay_without_prometheus(tmp_path, capsys):
    """examples/calibrate-week.json (a saved results document, README) replays with the documented command: the
    figures it measured replace the inputs and the plan diff is printed."""
    out = tmp_path / "calibrated.yaml"
    assert cli(["calibrate", str(STACK), "--from-file", str(ROOT / "examples" / "calibrate-week.json"),
                "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "plan diff against the current stack" in printed and "endpoints[assist].prefix_cache_hit_fraction" in printed
    a = next(e for e in load_inputs(out).endpoints if e.name == "assist")
    assert a.prefix_cache_hit_fraction == pytest.approx(PREFIX_HIT, abs=1e-3)
    # every replaced figure is printed, the profile by its weekly mean (it was left out of the list)
    assert "endpoints[assist].traffic.hourly_mean_requests_per_s: mean 12 → 4.429 req/s" in printed
    # its 48 hours of per-minute counts were drawn at a busiest minute 2.0× the hour's mean, factor kept for 300 s
    # (examples/README.md): the within-hour figures are measured from them, near what was drawn
    assert 1.8 <= a.traffic.within_hour_peak_factor <= 2.2
    assert 200 <= a.traffic.within_hour_correlation_s <= 400
    assert "endpoints[assist].traffic.within_hour_peak_factor: 1.5 → 1.95" in printed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv,expect", [
    (["--from-file", "{ex}", "--out", "{tmp}"], "--out '{tmp}': is a directory"),
    (["--from-file", "{ex}", "--out", "{tmp}/no/x.yaml"], "folder '{tmp}/no' does not exist"),
    (["--prometheus", "http://127.0.0.1:9", "--out", "{tmp}/x.yaml", "--save-results", "{tmp}/no/r.json"],
     "--save-results '{tmp}/no/r.json': folder '{tmp}/no' does not exist"),
    (["--from-file", "{tmp}/fifo", "--out", "{tmp}/x.yaml"], "--from-file '{tmp}/fifo': cannot read (not a regular file)"),
    (["--prometheus", "http://127.0.0.1:9", "--since", "99999999w", "--out", "{tmp}/x.yaml"], "reaches before 1970"),
    (["--prometheus", "http://127.0.0.1:9", "--until", "nan", "--out", "{tmp}/x.yaml"], "--until nan: give the window's end"),
    (["--prometheus", "http://127.0.0.1:9", "--namespace", "Bad NS", "--out", "{tmp}/x.yaml"],
     "--namespace: 'Bad NS' is not a DNS-1123 label"),
])
def test_calibrate_refuses_a_bad_command_line_before_any_work(tmp_path, capsys, argv, expect):
    """Found by a fuzz of the CLI: a bad --out crashed only after the queries had run (IsADirectoryError,
    FileNotFoundError), a FIFO --from-file hung, --since 99999999w and --until nan crashed on the date arithmetic,
    and --namespace went unchecked into the PromQL. Each is now a one-line error, exit 2, before Prometheus is asked
    (port 9 here: nothing listens, so a query would fail differently)."""
    import os

    os.mkfifo(tmp_path / "fifo")
    fill = {"ex": str(ROOT / "examples" / "calibrate-week.json"), "tmp": str(tmp_path)}
    assert cli(["calibrate", str(STACK), *(a.format(**fill) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert expect.format(**fill) in err, err
    assert not (tmp_path / "x.yaml").exists()


def test_calibrate_takes_any_output_name_and_a_large_saved_document(tmp_path, capsys):
    """The checks above must not refuse what worked (found by this stop's review): an --out of any suffix
    (calibrated.2026-12-05), and a saved results document past the stack files' 8 MB limit (two weeks of 15-second
    request counts for three endpoints run to 11-14 MB)."""
    doc = json.loads((ROOT / "examples" / "calibrate-week.json").read_text())
    big = tmp_path / "two-weeks.json"
    big.write_text(json.dumps(doc, indent=1) + " " * (9 * 1024 * 1024))  # past 8 MB, still the same document
    out = tmp_path / "calibrated.2026-12-05"
    assert cli(["calibrate", str(STACK), "--from-file", str(big), "--out", str(out)]) == 0, capsys.readouterr().err
    assert load_inputs(out) is not None


def test_a_calibrated_output_p99_stays_within_max_tokens():
    """vLLM's 1-2-5 token buckets straddle a small max_tokens (autocomplete's 256 between le=200 and le=500): the
    p99 interpolated in that bucket read 350, above the cap every output is held to, and the inputs then refused the
    calibrated document (found by this stop's review). Clamped at max_tokens, the bucket's top bound too."""
    inputs = load_inputs(STACK)
    ac = next(e for e in inputs.endpoints if e.name == "autocomplete")
    assert ac.shape.max_tokens == 256
    doc = {"window": {"start_s": WEEK_START_S, "end_s": WEEK_START_S + 7 * 86400}, "endpoints": {"autocomplete": {
        "generation_tokens": {"sum": 100.0 * 10_000, "count": 10_000,
                              "buckets": {"100": 5000, "200": 9800, "500": 10_000, "+Inf": 10_000}}}}}
    cal = calibrate(inputs, doc, {"autocomplete": ("H100-80GB", "1g.10gb")}, PRICES_DAY)
    got = next(e for e in cal.inputs.endpoints if e.name == "autocomplete").shape.output_tokens_p99
    assert got == pytest.approx(200 + (256 - 200) * 0.5)  # 9,900 of 10,000: half way through (200, 256]


@pytest.mark.parametrize("doc,expect", [
    ({"window": {"start_s": 0, "end_s": 1e300}, "endpoints": {}}, "is not unix seconds between 0 and"),
    ({"window": {"start_s": -1e12, "end_s": 0}, "endpoints": {}}, "is not unix seconds between 0 and"),
    ({"endpoints": {"assist": {"requests_by_hour": "x"}}}, "endpoints.assist.requests_by_hour: expected a list"),
    ({"endpoints": {"assist": {"prefill_hours": [[1, 2, 3]]}}}, "endpoints.assist.prefill_hours[0]: expected 5 finite"),
    ({"endpoints": {"assist": {"requests_by_minute": [[1, float("nan")]]}}}, "requests_by_minute[0]: expected 2 finite"),
    ({"endpoints": {"assist": {"busiest_hour": "x"}}}, "endpoints.assist.busiest_hour: expected an object"),
    ({"endpoints": {"assist": {"pods": ["a"]}}}, "endpoints.assist.pods: expected a list of objects"),
    ({"endpoints": ["assist"]}, "endpoints: expected an object"),
])
def test_a_results_document_of_the_wrong_shape_names_the_entry(doc, expect):
    """A saved results document edited by hand: a string where rows belong ended in ValueError or AttributeError
    inside the arithmetic, a window of 1e300 in an OverflowError on the date."""
    doc = {"window": {"start_s": WEEK_START_S, "end_s": WEEK_START_S + 7 * 86400}, **doc}
    with pytest.raises(CalibrationError) as e:
        calibrate(load_inputs(STACK), doc, {"assist": ("H100-80GB", None)}, PRICES_DAY)
    assert expect in str(e.value), str(e.value)
