"""The simulator: queueing core against Erlang C, traffic sources, the bundled stacks against their SLO,
cost accounting, the plan comparison and the command line."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from topology import InputError
from topology.costs import WEEKS_PER_MONTH
from topology.plan import erlang_c
from simulator.drills import peak_hour
from simulator.engine import Engine, EndpointSim, Overrides
from simulator.traffic import (
    Chunk, RateTrace, RequestTrace, Spike, arrivals, lognormal_params, load_trace,
)
from topology.minute_factors import gamma_alpha_for_peak
from simulator.simulate import (
    COST_TOLERANCE_FRACTION, GOODPUT_TARGET, compare_with_plan, format_plan_check, plot_week, simulate_endpoint,
    simulate_week, summary,
)

# --------------------------------------------------------------------------------------------------
# Queueing core: M/M/c against Erlang C
# --------------------------------------------------------------------------------------------------


# a million arrivals: across seeds these stay within ±3% of Erlang C, so 5% is a real test, not a lucky seed
@pytest.mark.parametrize("servers,rho", [(1, 0.7), (4, 0.75), (8, 0.8)])
def test_mmc_mean_wait_matches_erlang_c(planned_stacks, servers, rho):
    """Poisson arrivals, exponential service, c slots on one replica: mean wait within 5% of Erlang C."""
    inputs, spec = planned_stacks["prod"]
    mean_service_s, tokens_mean = 1.0, 100.0
    gap = mean_service_s / tokens_mean  # service = output tokens × gap, tokens exponential
    eng = Engine(slots=servers, prefill_tokens_per_s=1e15, t_min=gap, k=0.0, interference=0.0,
                 kv_capacity_tokens=1e12, gpus=1.0)
    ov = Overrides(engine=eng, fixed_replicas=1, admission=False)  # the queue itself: no 429 after a bounded wait
    ep_in = next(e for e in inputs.endpoints if e.name == "guard")
    n = 1_000_000
    lam = rho * servers / mean_service_s
    sim = EndpointSim(inputs, ep_in, spec.endpoint("guard"), 0.0, n / lam * 1.2, np.random.default_rng(1), ov)
    rng = np.random.default_rng(7)
    t = np.cumsum(rng.exponential(1 / lam, n))
    out = rng.exponential(tokens_mean, n)
    next_tick = 15.0
    for i in range(0, n, 100_000):
        sl = slice(i, i + 100_000)
        next_tick = sim.feed(Chunk(t[sl], np.zeros(len(t[sl])), out[sl]), 15.0, next_tick)
    simulated = sim.floor_wait_s / sim.n_floor
    mu = 1 / mean_service_s
    expected = erlang_c(servers, lam / mu) / (servers * mu - lam)
    assert simulated == pytest.approx(expected, rel=0.05), (simulated, expected)


# --------------------------------------------------------------------------------------------------
# Traffic
# --------------------------------------------------------------------------------------------------


def test_lognormal_fit_reproduces_mean_and_p99():
    mu, sigma = lognormal_params(2000, 9000)
    x = np.random.default_rng(0).lognormal(mu, sigma, 400_000)
    assert x.mean() == pytest.approx(2000, rel=0.02)
    assert np.quantile(x, 0.99) == pytest.approx(9000, rel=0.03)


def test_gamma_burstiness_gives_the_within_hour_peak_factor():
    for pf in (1.5, 1.8):
        a = gamma_alpha_for_peak(pf)
        g = np.random.default_rng(0).gamma(a, 1 / a, size=(5000, 60))
        assert np.mean(g.max(axis=1) / g.mean(axis=1)) == pytest.approx(pf, rel=0.06)
    assert gamma_alpha_for_peak(1.0) is None


def test_synthetic_week_follows_the_profile_and_shape(planned_stacks):
    inputs, _ = planned_stacks["prod"]
    ep = next(e for e in inputs.endpoints if e.name == "autocomplete")
    chunks = list(arrivals(ep, None, 6 * 3600, 12 * 3600, np.random.default_rng(3)))
    t = np.concatenate([c.arrival_s for c in chunks])
    assert np.all(np.diff(t) >= 0) and t.min() >= 6 * 3600 and t.max() < 12 * 3600
    per_hour = np.bincount((t // 3600).astype(int) - 6, minlength=6) / 3600
    prof = np.asarray(ep.traffic.hourly_mean_requests_per_s[6:12])
    assert per_hour == pytest.approx(prof, rel=0.05)
    ins = np.concatenate([c.input_tokens for c in chunks])
    outs = np.concatenate([c.output_tokens for c in chunks])
    assert ins.mean() == pytest.approx(ep.shape.input_tokens_mean, rel=0.05)
    assert outs.mean() == pytest.approx(ep.shape.output_tokens_mean, rel=0.05)
    assert outs.max() <= ep.shape.max_tokens and (ins + outs).max() <= ep.shape.product_max_context_tokens


def test_same_seed_same_result_other_seed_other_result(planned_stacks):
    inputs, spec = planned_stacks["prod"]
    a = simulate_endpoint(inputs, spec, "assist", seed=4, start_h=18, end_h=19)
    b = simulate_endpoint(inputs, spec, "assist", seed=4, start_h=18, end_h=19)
    c = simulate_endpoint(inputs, spec, "assist", seed=5, start_h=18, end_h=19)
    assert a == b
    assert a.requests != c.requests


@pytest.mark.parametrize("name,kind", [
    ("azure2023_conv.csv", RequestTrace), ("azure2023_code.csv", RequestTrace),
    ("mooncake_synthetic.jsonl", RequestTrace), ("servegen_m-small_14d_rate.csv", RateTrace),
])
def test_traces_load(root, name, kind):
    tr = load_trace(root / "traces" / name)
    assert isinstance(tr, kind)
    if isinstance(tr, RequestTrace):
        assert len(tr.arrival_s) > 1000 and np.all(np.diff(tr.arrival_s) >= 0)
    else:
        assert len(tr.rates) == 1008  # one week of 10-minute windows


def test_request_trace_is_rescaled_to_the_endpoints_rate_and_shape(root, planned_stacks):
    """Azure conversation trace (Azure/AzurePublicDataset, CC-BY-4.0) replayed at assist's hour-of-week rate."""
    inputs, _ = planned_stacks["prod"]
    ep = next(e for e in inputs.endpoints if e.name == "assist")
    tr = load_trace(root / "traces" / "azure2023_conv.csv")
    chunks = list(arrivals(ep, tr, 18 * 3600, 22 * 3600, np.random.default_rng(0)))
    t = np.concatenate([c.arrival_s for c in chunks])
    per_hour = np.bincount((t // 3600).astype(int) - 18, minlength=4) / 3600
    assert per_hour == pytest.approx(np.asarray(ep.traffic.hourly_mean_requests_per_s[18:22]), rel=0.03)
    outs = np.concatenate([c.output_tokens for c in chunks])
    assert outs.mean() == pytest.approx(ep.shape.output_tokens_mean, rel=0.08)


def test_rate_trace_sets_the_weekly_rhythm_at_the_endpoints_mean(root, planned_stacks):
    """ServeGen m-small rate trace (alibaba/ServeGen, Apache-2.0): first week of 10-minute windows, scaled."""
    inputs, spec = planned_stacks["dev"]
    ep = next(e for e in inputs.endpoints if e.name == "guard")
    tr = load_trace(root / "traces" / "servegen_m-small_14d_rate.csv")
    t = np.concatenate([c.arrival_s for c in arrivals(ep, tr, 0, 7 * 86400, np.random.default_rng(0))])
    mean = float(np.mean(ep.traffic.hourly_mean_requests_per_s))
    assert len(t) / (7 * 86400) == pytest.approx(mean, rel=0.02)
    per_window = np.bincount((t // 600).astype(int), minlength=1008) / 600
    corr = np.corrcoef(per_window, tr.rates)[0, 1]
    assert corr > 0.9  # the replay follows the trace's rhythm, not the stack's profile
    res = simulate_week(inputs, spec, seed=0, trace=tr, endpoints=["guard"])
    assert res.endpoints[0].meets_slo and "ServeGen" in res.notes[0]


@pytest.mark.parametrize("content,fragment", [
    (None, "no such file"),
    ("a,b\n1,2\n", "unrecognised columns"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "row 2"),
    ("window_start_s,total_rate_rps\n0,1\n600,2\n", "a week needs 1008"),
])
def test_bad_trace_names_the_flag_the_problem_and_the_formats(tmp_path, content, fragment):
    p = tmp_path / "trace.csv"
    if content is not None:
        p.write_text(content)
    with pytest.raises(InputError) as e:
        load_trace(p)
    msg = str(e.value)
    assert "--trace" in msg and fragment in msg and "Mooncake JSONL" in msg


# --------------------------------------------------------------------------------------------------
# The bundled stacks against their SLO
# --------------------------------------------------------------------------------------------------

# The SLOs are p99s: an endpoint meets them when ≥ 99% of requests meet both TTFT and inter-token SLOs,
# overall and over its busiest hours. Prod runs the six hours around each endpoint's weekly peak (the rise
# into it and the peak itself: where the SLO is at risk); dev runs its whole week.

def _endpoint_cases():
    return [("prod", "assist"), ("prod", "autocomplete"), ("prod", "guard"), ("dev", None)]


def _check_slo(results):
    for r in results:
        assert r.meets_slo, (
            f"{r.endpoint}: goodput {r.goodput:.4f}, busiest hours {r.peak_hours_goodput:.4f}, "
            f"TTFT p99 {r.ttft_p99_s:.3f} s (SLO {r.ttft_slo_s}), ITL p99 {r.itl_p99_s:.3f} s (SLO {r.itl_slo_s}); "
            f"worst hours {r.worst_hours[:3]}; {r.diagnostics}"
        )
        assert r.rejected == 0


@pytest.fixture(scope="module")
def dev_week(planned_stacks):
    """dev's whole synthetic week, seed 0: one run read by the SLO test and the plan comparison (it is a result:
    neither test changes it)."""
    inputs, spec = planned_stacks["dev"]
    return simulate_week(inputs, spec, seed=0)


@pytest.mark.parametrize("stack_name,endpoint", _endpoint_cases())
def test_bundled_stacks_meet_their_slo_on_the_synthetic_week(request, planned_stacks, stack_name, endpoint):
    inputs, spec = planned_stacks[stack_name]
    if endpoint is None:
        assert stack_name == "dev"
        res = request.getfixturevalue("dev_week").endpoints
    else:
        ep_in = next(e for e in inputs.endpoints if e.name == endpoint)
        p = peak_hour(ep_in)
        res = (simulate_endpoint(inputs, spec, endpoint, seed=0, start_h=max(0, p - 4), end_h=p + 2),)
    _check_slo(res)


@pytest.mark.parametrize("stack_name,endpoint", _endpoint_cases())
def test_bundled_stacks_meet_their_slo_on_the_azure_conversation_trace(root, planned_stacks, stack_name, endpoint):
    """Azure 2023 conversation trace (Azure/AzurePublicDataset, CC-BY-4.0), time-rescaled to each endpoint's
    hour-of-week rate and its token means scaled to the endpoint's shape."""
    inputs, spec = planned_stacks[stack_name]
    tr = load_trace(root / "traces" / "azure2023_conv.csv")
    if endpoint is None:
        res = simulate_week(inputs, spec, seed=0, trace=tr).endpoints
    else:
        ep_in = next(e for e in inputs.endpoints if e.name == endpoint)
        p = peak_hour(ep_in)
        res = (simulate_endpoint(inputs, spec, endpoint, seed=0, trace=tr, start_h=max(0, p - 4), end_h=p + 2),)
    _check_slo(res)


def test_an_under_provisioned_spec_fails_its_slo(planned_stacks):
    """Guard with half its floor and no room to autoscale: the simulator must say the SLO is missed."""
    inputs, spec = planned_stacks["prod"]
    ep = spec.endpoint("guard")
    half = tuple(max(1, v // 2) for v in ep.floor.replicas_by_hour)
    small = ep.model_copy(update={
        "floor": ep.floor.model_copy(update={"replicas_by_hour": half, "base_replicas": min(half), "windows": ()}),
        "autoscaling": ep.autoscaling.model_copy(update={"min_replicas": min(half), "max_replicas": min(half)}),
    })
    bad = spec.model_copy(update={"endpoints": tuple(small if e.name == "guard" else e for e in spec.endpoints)})
    p = peak_hour(next(e for e in inputs.endpoints if e.name == "guard"))
    r = simulate_endpoint(inputs, bad, "guard", seed=0, start_h=p - 1, end_h=p + 1)
    good = simulate_endpoint(inputs, spec, "guard", seed=0, start_h=p - 1, end_h=p + 1)
    assert good.meets_slo
    assert not r.meets_slo
    assert r.goodput < GOODPUT_TARGET and r.floor_queue_peak > 0 and r.ttft_p99_s > r.ttft_slo_s


def _without_burst_backlog_trigger(spec, name):
    """The same stack with the endpoint's ScaledObject lacking its burst-backlog trigger."""
    ep = spec.endpoint(name)
    no = ep.model_copy(update={"autoscaling": ep.autoscaling.model_copy(update={"burst_backlog_threshold": None})})
    return spec.model_copy(update={"endpoints": tuple(no if e.name == name else e for e in spec.endpoints)})


@pytest.mark.parametrize("in_flight,threshold_set,replicas_after", [
    (1176, True, 8),  # exactly at the threshold: ⌈8 × 1⌉ = 8, nothing to add
    (1200, True, 9),  # ⌈8 × 1200 / 1176⌉ = ⌈8.16⌉ = 9: one more, not the step cap of two
    (1800, True, 10),  # ⌈12.2⌉ = 13, capped at two per period
    (1800, False, 8),  # no trigger: the floor's queue is empty, so nothing asks for more
])
def test_burst_backlog_trigger_asks_for_current_times_value_over_threshold(planned_stacks, in_flight, threshold_set,
                                                                           replicas_after):
    """The HPA's Value-metric rule at one poll on prod assist (8 replicas at Monday 10:00, threshold 1176 = 24
    containers (the spike headroom, at the max_containers_cap) × 49 target inputs, step cap 2)."""
    inputs, spec = planned_stacks["prod"]
    if not threshold_set:
        spec = _without_burst_backlog_trigger(spec, "assist")
    ep = spec.endpoint("assist")
    # the poll's hour and its neighbours run the floor's base, away from its one clock window (Saturday evening)
    assert ep.autoscaling.scale_up_pods_per_period == 2
    assert all(ep.floor.replicas_by_hour[h] == ep.floor.base_replicas == 8 for h in (9, 10, 11))
    if threshold_set:
        assert ep.autoscaling.burst_backlog_threshold == 1176 == ep.burst.max_containers * ep.burst.target_inputs
    ep_in = next(e for e in inputs.endpoints if e.name == "assist")
    start = 10 * 3600.0
    sim = EndpointSim(inputs, ep_in, ep, start, start + 3600.0, np.random.default_rng(0))
    assert sum(1 for s in sim.f_state if s in (1, 2)) == 8
    sim.burst_inflight = in_flight  # what Prometheus reads from the gateway at this poll
    sim.tick(start + ep.autoscaling.polling_interval_s)
    assert sum(1 for s in sim.f_state if s in (1, 2)) == replicas_after
    assert sim.backlog_replicas_added == replicas_after - 8
    assert sim.backlog_peak == (in_flight if threshold_set else 0)


@pytest.mark.parametrize("in_flight,replicas_after", [
    (0, 0),
    (1176, 0),  # at the burst's planned capacity: not past KEDA's activation threshold (the target)
    (1177, 1),  # past it: KEDA scales the Deployment from zero to one; the HPA takes over from there
    (5000, 1),
])
def test_a_floor_at_zero_wakes_only_past_the_bursts_planned_capacity(planned_stacks, in_flight, replicas_after):
    """prod assist with its floor at zero all week (a scale-to-zero floor + burst plan): the burst serves alone
    until requests in flight to it pass its planned capacity, the burst-backlog trigger's activation threshold
    (components/floor_replicas.py), as KEDA wakes a ScaledObject at zero replicas."""
    inputs, spec = planned_stacks["prod"]
    ep = spec.endpoint("assist")
    zero = ep.model_copy(update={
        "floor": ep.floor.model_copy(update={"replicas_by_hour": (0,) * 168, "base_replicas": 0, "windows": ()}),
        "autoscaling": ep.autoscaling.model_copy(update={"min_replicas": 0}),
    })
    ep_in = next(e for e in inputs.endpoints if e.name == "assist")
    start = 10 * 3600.0
    sim = EndpointSim(inputs, ep_in, zero, start, start + 3600.0, np.random.default_rng(0))
    assert sum(1 for s in sim.f_state if s in (1, 2)) == 0
    sim.burst_inflight = in_flight
    sim.tick(start + ep.autoscaling.polling_interval_s)
    assert sum(1 for s in sim.f_state if s in (1, 2)) == replicas_after


def test_floor_grows_on_a_saturated_burst_only_with_the_burst_backlog_trigger(planned_stacks):
    """prod autocomplete at 9× its peak for 10 minutes (3× the spike its burst headroom is sized for): the burst
    (8 containers × 39) saturates while the
    gateway keeps the floor's own queue short. With the trigger the floor grows and the diagnostic says by
    how much; without it the floor stays put and the diagnostic says the autoscaler never saw the backlog."""
    inputs, spec = planned_stacks["prod"]
    p = peak_hour(next(e for e in inputs.endpoints if e.name == "autocomplete"))
    at = p * 3600.0 + 600.0
    kw = dict(seed=0, start_h=p - 0.5, end_h=p + 1.0, spike=Spike(9.0, at, 10.0))
    with_t = simulate_endpoint(inputs, spec, "autocomplete", **kw)
    without = simulate_endpoint(inputs, _without_burst_backlog_trigger(spec, "autocomplete"), "autocomplete", **kw)
    threshold = spec.endpoint("autocomplete").autoscaling.burst_backlog_threshold
    assert with_t.burst_backlog_threshold == threshold and without.burst_backlog_threshold is None
    assert with_t.burst_inflight_peak > 2 * threshold  # the burst is saturated
    assert with_t.burst_backlog_polls > 0 and with_t.burst_backlog_replicas_added > 0
    assert with_t.pod_cold_starts + with_t.node_cold_starts >= with_t.burst_backlog_replicas_added
    assert max(with_t.hourly_floor_replicas) > max(without.hourly_floor_replicas)
    assert without.burst_backlog_polls == without.burst_backlog_replicas_added == 0
    assert without.pod_cold_starts + without.node_cold_starts == 0
    assert any("burst-backlog threshold" in d and f"added {with_t.burst_backlog_replicas_added} replicas" in d
               for d in with_t.diagnostics), with_t.diagnostics
    assert any("no burst-backlog trigger" in d for d in without.diagnostics), without.diagnostics
    assert not any("never saw" in d for d in with_t.diagnostics)


# --------------------------------------------------------------------------------------------------
# Tiers, cost and the comparison with the plan
# --------------------------------------------------------------------------------------------------


def test_serverless_only_scales_to_zero_and_bills_only_containers(planned_stacks):
    inputs, spec = planned_stacks["dev"]
    r = simulate_endpoint(inputs, spec, "assist", seed=0, start_h=96, end_h=168)  # Fri 00:00 → end of Sunday
    assert r.burst_share == 1.0
    assert r.cost_usd["reserved"] == r.cost_usd["on_demand"] == 0 and r.cost_usd["serverless"] > 0
    # the weekend has no traffic: containers stop after the scaledown window and stay at zero
    assert max(r.hourly_burst_containers[48 + 1:]) == 0
    assert r.container_cold_starts >= 1


def test_reserved_cost_is_the_reserved_nodes_for_every_hour(planned_stacks):
    inputs, spec = planned_stacks["prod"]
    ep = spec.endpoint("assist")
    r = simulate_endpoint(inputs, spec, "assist", seed=0, start_h=0, end_h=2)
    gpu_hour = inputs.prices.dedicated_on_demand_usd_per_gpu_hour["H100-80GB"] * (1 - inputs.prices.reserved_discount_fraction)
    nodes = math.ceil(ep.floor.reserved_replicas / 4)  # 2-GPU replicas on 8-GPU nodes
    assert r.cost_usd["reserved"] == pytest.approx(nodes * 8 * gpu_hour * 2, rel=1e-3)
    assert r.gpu_hours["dedicated"] == pytest.approx(nodes * 8 * 2, rel=1e-3)


def test_managed_api_is_billed_per_token(planned_stacks):
    inputs, spec = planned_stacks["dev"]
    r = simulate_endpoint(inputs, spec, "autocomplete", seed=0, start_h=8, end_h=12)
    api = next(e for e in inputs.endpoints if e.name == "autocomplete").managed_api
    s = next(e for e in inputs.endpoints if e.name == "autocomplete").shape
    per_req = (s.input_tokens_mean * api.usd_per_million_input_tokens + s.output_tokens_mean * api.usd_per_million_output_tokens) / 1e6
    assert r.cost_usd["api"] == pytest.approx(r.requests * per_req, rel=0.05)


def test_plan_comparison_warns_beyond_the_tolerance_and_not_within(planned_stacks, dev_week):
    inputs, spec = planned_stacks["dev"]
    res = dev_week
    rows = {r.endpoint: compare_with_plan(r, spec.endpoint(r.endpoint)) for r in res.endpoints}
    for name, row in rows.items():
        sim = res.endpoint(name)
        fixed = sum(v for k, v in next(a for a in spec.endpoint(name).alternatives
                                       if a.option == spec.endpoint(name).tier).breakdown_usd.items() if k.endswith("_fixed"))
        assert row.simulated_monthly_usd == pytest.approx(sim.cost_total_usd * WEEKS_PER_MONTH + fixed, abs=0.01)
        assert row.ok == (abs(row.cost_delta_fraction) <= COST_TOLERANCE_FRACTION and sim.meets_slo)
    # the API endpoint's cost is a per-token sum both ways: the plan and the simulation agree
    assert rows["autocomplete"].ok
    # the planner bills serverless containers while they live out the scaledown window: within tolerance
    assert rows["assist"].ok and rows["guard"].ok
    # a plan that claimed half the cost is caught
    claimed = spec.endpoint("assist").model_copy(update={"monthly_usd": spec.endpoint("assist").monthly_usd / 2})
    low = compare_with_plan(res.endpoint("assist"), claimed)
    assert not low.ok and "tolerance" in low.warnings[0] and low.cost_delta_fraction > COST_TOLERANCE_FRACTION
    rows["assist"] = low
    text = format_plan_check(list(rows.values()), markdown=True)
    assert "| assist |" in text and "⚠" in text


def test_windowed_run_makes_no_cost_claim(planned_stacks):
    inputs, spec = planned_stacks["prod"]
    r = simulate_endpoint(inputs, spec, "assist", seed=0, start_h=0, end_h=1)
    row = compare_with_plan(r, spec.endpoint("assist"))
    assert row.simulated_monthly_usd is None and row.cost_delta_fraction is None


# --------------------------------------------------------------------------------------------------
# Reports and the command line
# --------------------------------------------------------------------------------------------------


def test_summary_plot_and_markdown(planned_stacks, tmp_path):
    inputs, spec = planned_stacks["dev"]
    res = simulate_week(inputs, spec, seed=0, start_h=0, end_h=48)
    text = summary(res)
    assert "assist" in text and "goodput" in text.lower()
    md = summary(res, markdown=True)
    assert md.startswith("### ") and "| assist |" in md
    p = plot_week(res, tmp_path / "out" / "week.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 20_000


def _cli(*args, cwd, monkeypatch, capsys):
    """`python -m topology simulate ARGS` run by the CLI's `main` in this process (these tests check what it
    prints and its exit status; tests/test_fuzz.py runs real processes): (exit status, stdout, stderr)."""
    from topology.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()  # what earlier steps printed is not this command's
    try:
        status = main(["simulate", *args])
    except SystemExit as e:  # argparse's own errors
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


def test_cli_runs_a_stack_and_writes_a_plot(root, tmp_path, monkeypatch, capsys):
    png = tmp_path / "week.png"
    status, stdout, stderr = _cli("stacks/Pulumi.dev.yaml", "--plot", str(png), "--markdown", "--no-progress",
                                  cwd=root, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, stderr
    assert "| guard |" in stdout and "plan $/month" in stdout
    assert png.exists()


@pytest.mark.parametrize("args,fragment", [
    (["--drill", "earthquake"], "--drill 'earthquake': unknown drill; allowed: morning-cold-start"),
    (["--hours", "9-5"], "--hours '9-5'"),
    (["--hours", "20:10"], "START < END"),
    (["--endpoint", "chat"], "--endpoint 'chat': no such endpoint"),
    (["--trace", "nowhere.csv"], "--trace 'nowhere.csv': no such file"),
    (["--drill", "spike", "--spike-factor", "0.5"], "--spike-factor 0.5"),
])
def test_cli_bad_input_is_a_clear_error_without_traceback(root, args, fragment, monkeypatch, capsys):
    status, _stdout, stderr = _cli("stacks/Pulumi.dev.yaml", *args, cwd=root, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2
    assert fragment in stderr and "Traceback" not in stderr


def test_importing_the_simulator_stays_light():
    code = ("import sys, simulator, simulator.cli; "
            "bad = [m for m in ('matplotlib', 'tqdm', 'pulumi', 'modal') if m in sys.modules]; print(bad)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "[]", p.stdout + p.stderr


def test_a_window_with_no_requests_has_nothing_to_judge(root, monkeypatch, capsys):
    """dev's profile has no traffic late on Sunday: simulating that hour reported every endpoint at 0.00% goodput
    ✗ and exited 1, 'misses SLO', when nothing was asked of it (found by this stop's fuzz)."""
    rc, out, _ = _cli("stacks/Pulumi.dev.yaml", "--hours", "671:672", "--no-progress", cwd=root,
                      monkeypatch=monkeypatch, capsys=capsys)
    assert rc == 0, out
    assert "0.00%" not in out and "✗" not in out
    assert out.count("no requests in these hours; nothing to judge") == 3


@pytest.mark.parametrize("argv,expect", [
    (["--hours", "0:2", "--spike-factor", "0"], "--spike-factor applies to --drill spike only (no --drill given)"),
    (["--drill", "rollback", "--abandon-fraction", "2"],
     "--abandon-fraction applies to --drill disconnect only (--drill rollback given)"),
    (["--drill", "spike", "--detect-minutes", "5"], "--detect-minutes applies to --drill rollback only"),
])
def test_a_drill_option_without_its_drill_is_refused(root, monkeypatch, capsys, argv, expect):
    """A drill's option given to another run was silently ignored: `--spike-factor 0` on a plain window ran the
    window and said nothing (found by this stop's fuzz)."""
    rc, _, err = _cli("stacks/Pulumi.dev.yaml", *argv, cwd=root, monkeypatch=monkeypatch, capsys=capsys)
    assert rc == 2
    assert expect in err
