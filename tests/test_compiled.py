"""The compiled simulator (simulator/compiled.py, numba) against the pure-Python reference engine: the same
windows and seeds give the same results, field for field, with every mechanism the kernel hands back to Python
or runs itself exercised (KV preemption, admission shedding, the first-byte timeout, abandonment, burst,
non-streamed rules, rollouts, the managed API), and its queue still agrees with Erlang C."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

pytest.importorskip("numba")

from simulator.compiled import CompiledEndpointSim  # noqa: E402
from simulator.engine import Abandon, Engine, EndpointSim, Overrides, Rollout  # noqa: E402
from simulator.simulate import simulate_endpoint  # noqa: E402
from simulator.traffic import Chunk, Spike, load_trace  # noqa: E402


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _both(inputs, spec, name, make_ov=lambda: None, **kw):
    """Run the window on both engines (fresh overrides each: drills' objects collect figures)."""
    ov_p, ov_c = make_ov(), make_ov()
    ref = simulate_endpoint(inputs, spec, name, compiled=False, overrides=ov_p, **kw)
    fast = simulate_endpoint(inputs, spec, name, compiled=True, overrides=ov_c, **kw)
    a, b = dataclasses.asdict(ref), dataclasses.asdict(fast)
    diff = [k for k in a if not _same(a[k], b[k])]
    assert not diff, {k: (a[k], b[k]) for k in diff}
    if ov_p is not None:
        assert _same(dataclasses.asdict(ov_p), dataclasses.asdict(ov_c))
    return ref, ov_p


@pytest.mark.parametrize("name,seed,start_h,end_h", [
    ("guard", 0, 9.0, 9.5),  # dedicated only: least-in-flight routing over the autoscaled floor
    ("assist", 1, 116.0, 116.5),  # floor + burst at Friday's peak
    ("assist", 3, 116.75, 117.25),  # the spike's warm minimum (24) lets its containers go at 21:00
    ("autocomplete", 2, 0.0, 2.0),  # overnight: the floor's cron scale and the burst's warm minimum
])
def test_prod_windows_are_identical(planned_stacks, name, seed, start_h, end_h):
    inputs, spec = planned_stacks["prod"]
    r, _ = _both(inputs, spec, name, seed=seed, start_h=start_h, end_h=end_h)
    assert r.requests > 1000


def test_dev_stack_burst_only_and_managed_api_are_identical(planned_stacks):
    inputs, spec = planned_stacks["dev"]
    r, _ = _both(inputs, spec, "guard", seed=4, start_h=10.0, end_h=12.0)
    assert r.burst_share == 1.0 and r.container_cold_starts > 0
    api, _ = _both(inputs, spec, "autocomplete", seed=4, start_h=10.0, end_h=10.5)
    assert api.cost_usd["api"] > 0


def _assist_capped(spec):
    """prod with assist's non-streamed requests capped on burst at the tokens its plan found fit under Modal's
    150 s (the plan itself keeps them on the floor, floor_only: that fit is below the p99 output), so the windows
    here exercise the cap on both engines."""
    ep = spec.endpoint("assist")
    fit = int(next(d.value for d in ep.derivations if d.figure == "non_streamed_burst_max_tokens"))
    ep = ep.model_copy(update={"burst": ep.burst.model_copy(update={"non_streamed_rule": "cap_max_tokens",
                                                                    "non_streamed_max_tokens": fit})})
    return spec.model_copy(update={"endpoints": tuple(ep if e.name == "assist" else e for e in spec.endpoints)})


def test_kv_preemption_and_refusals_are_identical(planned_stacks, root):
    """Mooncake's own prompts at 3× Friday's peak: 413/400 refusals, KV admission waits and preemptions."""
    inputs, spec = planned_stacks["prod"]
    trace = load_trace(root / "traces" / "mooncake_synthetic.jsonl")
    r, _ = _both(inputs, _assist_capped(spec), "assist", seed=0, trace=trace, start_h=116.0, end_h=116.1, raw_tokens=True,
                 rate_scale=3.0)
    assert r.preemptions > 0 and r.too_long_413 + r.too_long_400 > 0


def test_admission_shedding_and_non_streamed_rules_are_identical(planned_stacks, prod_unwarmed):
    inputs, spec = prod_unwarmed  # burst cold at Friday's peak (no warm minimum for the spike): it fills to its cap
    r, _ = _both(inputs, _assist_capped(spec), "assist", lambda: Overrides(admission=True), seed=0, start_h=116.0, end_h=116.1,
                 rate_scale=3.0)
    assert r.non_streamed_burst > 0 and r.non_streamed_capped > 0
    assert r.shed > 0  # floor and burst full (burst at its in-flight cap): HAProxy's queue, then 429
    inputs, spec = planned_stacks["prod"]
    spiked, _ = _both(inputs, spec, "guard", lambda: Overrides(admission=True), seed=3, start_h=9.0, end_h=9.4,
                      spike=Spike(6.0, 9.1 * 3600, 10.0))
    assert spiked.shed > 0
    # serverless only (dev guard, one container of 66 inputs): past the burst cap, the burst server's own queue
    dev_in, dev = planned_stacks["dev"]
    so, _ = _both(dev_in, dev, "guard", lambda: Overrides(admission=True), seed=4, start_h=10.0, end_h=10.05,
                  rate_scale=1000.0)
    assert 0 < so.shed < so.requests


def test_first_byte_timeout_is_identical(planned_stacks):
    """One guard replica under its daytime traffic: the queue passes the gateway's first-byte timeout."""
    inputs, spec = planned_stacks["prod"]
    r, _ = _both(inputs, spec, "guard", lambda: Overrides(fixed_replicas=1), seed=5, start_h=9.0, end_h=9.1)
    assert r.timed_out > 0


@pytest.mark.parametrize("propagate", [False, True])
def test_abandonment_is_identical(planned_stacks, propagate):
    inputs, spec = planned_stacks["prod"]
    _, ov = _both(inputs, spec, "assist", lambda: Overrides(abandon=Abandon(0.2, propagate)), seed=6,
                  start_h=116.0, end_h=116.2)
    assert ov.abandon.abandoned > 0
    assert (ov.abandon.wasted_gpu_s > 0) != propagate


@pytest.mark.parametrize("warm", [False, True])
def test_rollout_and_floor_overrides_are_identical(planned_stacks, warm):
    inputs, spec = planned_stacks["prod"]
    at = 9.1 * 3600

    def ov():
        return Overrides(rollout=Rollout(at_s=at, detect_s=300.0, warm=warm), floor_by_hour=tuple([3] * 168),
                         lead_time_s=0.0, burst_min_by_hour=tuple([0] * 168))

    _, o = _both(inputs, spec, "assist", ov, seed=7, start_h=9.0, end_h=9.5)
    assert o.rollout.bad_requests > 0 and o.rollout.recovered_s is not None


@pytest.mark.parametrize("name,scale,start_h,end_h", [
    # guard at 5% of its traffic over two days: the floor scales down to its minimum at night and up on the
    # clock and the queue in the day (pod and node cold starts, on-demand nodes going after 10 idle minutes)
    ("guard", 0.05, 0.0, 48.0),
    # autocomplete over Friday and Saturday at 10%: the floor's clock window, the burst's warm minimum on the
    # clock, containers launched on demand and stopped after the scaledown window
    ("autocomplete", 0.1, 100.0, 148.0),
])
def test_autoscaler_polls_over_days_are_identical(planned_stacks, name, scale, start_h, end_h):
    """The autoscaler's polls run inside the compiled kernel: every scale-up, drain, cold start, node and
    container start and stop, and the hourly books they leave, match the reference's polls."""
    inputs, spec = planned_stacks["prod"]
    r, _ = _both(inputs, spec, name, seed=8, start_h=start_h, end_h=end_h, rate_scale=scale)
    assert r.pod_cold_starts + r.node_cold_starts > 0
    assert min(r.hourly_floor_replicas) < max(r.hourly_floor_replicas)  # the floor moved
    if name == "autocomplete":
        assert r.container_cold_starts > 0


@pytest.mark.parametrize("in_flight,threshold_set,at_zero", [
    (0, True, False), (1200, True, False), (1800, True, False), (1800, False, False),
    (1176, True, True), (1177, True, True), (5000, True, True),  # a floor at zero: KEDA's activation
])
def test_one_poll_is_identical(planned_stacks, in_flight, threshold_set, at_zero):
    """One poll from the same state on both engines (prod assist's 8 replicas at Monday 10:00, or its floor at
    zero all week, and a burst backlog set by hand, as tests/test_simulate.py's trigger tests): the same
    replicas added, the same trigger figures, the same books."""
    from tests.test_simulate import _without_burst_backlog_trigger

    inputs, spec = planned_stacks["prod"]
    if not threshold_set:
        spec = _without_burst_backlog_trigger(spec, "assist")
    ep, ep_in = spec.endpoint("assist"), next(e for e in inputs.endpoints if e.name == "assist")
    if at_zero:
        ep = ep.model_copy(update={
            "floor": ep.floor.model_copy(update={"replicas_by_hour": (0,) * 168, "base_replicas": 0, "windows": ()}),
            "autoscaling": ep.autoscaling.model_copy(update={"min_replicas": 0}),
        })
    start = 10 * 3600.0
    sims = [cls(inputs, ep_in, ep, start, start + 3600.0, np.random.default_rng(0))
            for cls in (EndpointSim, CompiledEndpointSim)]
    for sim in sims:
        sim.burst_inflight = in_flight
        for k in range(1, 4):
            sim.tick(start + k * ep.autoscaling.polling_interval_s)
    ref, fast = sims
    assert list(ref.f_state) == list(fast.f_state) and list(ref.f_ready_at) == list(fast.f_ready_at)
    for name in ("nodes_up", "pod_starts", "node_starts", "backlog_polls", "backlog_replicas_added", "backlog_peak",
                 "od_node_s", "res_node_s", "next_ready", "last_tick", "container_launches"):
        assert getattr(ref, name) == getattr(fast, name), name
    assert ref.tally.floor_replica_s.tolist() == fast.tally.floor_replica_s.tolist()
    assert (ref.backlog_replicas_added > 0) == (in_flight > 1176 and threshold_set)
    if at_zero:
        assert sum(1 for s in ref.f_state if s in (1, 2)) == (0 if in_flight <= 1176 else 1)


class _TinyArrays(CompiledEndpointSim):
    """Every array starts at its smallest, so each kind of growth (replicas, containers, completions, the KV
    check's blocks, the HPA's windows) happens mid-run."""

    initial_rows = 1
    initial_runs_depth = 1
    initial_heap_rows = 2
    initial_window_rows = 1


@pytest.mark.parametrize("name,scale,start_h,end_h", [("assist", 1.0, 116.0, 116.2), ("guard", 0.05, 0.0, 12.0)])
def test_growing_every_array_mid_run_changes_nothing(planned_stacks, monkeypatch, name, scale, start_h, end_h):
    from simulator import compiled

    inputs, spec = planned_stacks["prod"]
    ref = simulate_endpoint(inputs, spec, name, seed=9, start_h=start_h, end_h=end_h, rate_scale=scale, compiled=False)
    monkeypatch.setattr(compiled, "CompiledEndpointSim", _TinyArrays)
    fast = simulate_endpoint(inputs, spec, name, seed=9, start_h=start_h, end_h=end_h, rate_scale=scale, compiled=True)
    assert _same(dataclasses.asdict(ref), dataclasses.asdict(fast))


def test_compiled_queue_matches_erlang_c_and_the_reference_waits(planned_stacks):
    """Poisson arrivals, exponential service, 4 slots at ρ = 0.75 on one replica: the compiled engine's mean
    wait is within 5% of Erlang C over 400,000 arrivals, and the reference engine's waits are the same."""
    inputs, spec = planned_stacks["prod"]
    servers, rho, mean_service_s, tokens_mean = 4, 0.75, 1.0, 100.0
    eng = Engine(slots=servers, prefill_tokens_per_s=1e15, t_min=mean_service_s / tokens_mean, k=0.0,
                 interference=0.0, kv_capacity_tokens=1e12, gpus=1.0)
    ep_in = next(e for e in inputs.endpoints if e.name == "guard")
    n = 400_000
    lam = rho * servers / mean_service_s
    rng = np.random.default_rng(7)
    t = np.cumsum(rng.exponential(1 / lam, n))
    out = rng.exponential(tokens_mean, n)
    waits = []
    for cls in (EndpointSim, CompiledEndpointSim):
        sim = cls(inputs, ep_in, spec.endpoint("guard"), 0.0, n / lam * 1.2, np.random.default_rng(1),
                  Overrides(engine=eng, fixed_replicas=1))
        next_tick = 15.0
        for i in range(0, n, 100_000):
            sl = slice(i, i + 100_000)
            next_tick = sim.feed(Chunk(t[sl], np.zeros(len(t[sl])), out[sl]), 15.0, next_tick)
        waits.append((sim.floor_wait_s, sim.n_floor))
    assert waits[0] == waits[1]
    # Erlang C: P(wait) = (a^c / c!) / ((1 − ρ) Σ_{k<c} a^k / k! + a^c / c!), mean wait = P(wait) / (cμ − λ)
    a = lam * mean_service_s
    top = a ** servers / math.factorial(servers)
    p_wait = top / ((1 - rho) * sum(a ** k / math.factorial(k) for k in range(servers)) + top)
    expected = p_wait / (servers / mean_service_s - lam)
    assert waits[1][0] / waits[1][1] == pytest.approx(expected, rel=0.05)


def test_pure_python_switch(planned_stacks, monkeypatch):
    """SIMULATOR_PURE_PYTHON=1 runs the reference engine (what the README's fallback says)."""
    from simulator import compiled

    monkeypatch.setenv(compiled.DISABLE_ENV, "1")
    assert not compiled.available()
    monkeypatch.delenv(compiled.DISABLE_ENV)
    assert compiled.available()


def test_latency_histogram_bins_by_hand():
    """Bins are 1/300 decade from 10⁻⁵ s: 1 s is bin (0 + 5)·300 = 1500, 10 s is 1800, 2 s is
    ⌊(log10 2 + 5)·300⌋ = 1590; no latency (0) clips to the first bin, a refusal's ∞ goes to the last."""
    from simulator.engine import HIST_BINS, hist_index

    x = np.array([1.0, 10.0, 2.0, 0.0, math.inf, 1e9])
    assert hist_index(x).tolist() == [1500, 1800, 1590, 0, HIST_BINS - 1, HIST_BINS - 1]
    assert x.tolist() == [1.0, 10.0, 2.0, 0.0, math.inf, 1e9]  # the input is left as it was


def test_compiled_histogram_bins_are_the_reference_bins():
    """The compiled tally bins latencies by edges read off engine.hist_index (no log10 per request): every
    value lands where hist_index puts it — across eight decades, on each edge and the doubles either side of
    it, and the special values (no latency, ∞ for a refusal, NaN, below and above the histogram's range)."""
    from simulator.compiled import hist_bins, hist_tables
    from simulator.engine import HIST_BINS, hist_index

    tables = hist_tables()
    assert tables is not None  # this platform's log10 passed the check around every edge
    edges = tables[0][1:-1]
    assert len(edges) == HIST_BINS - 1
    x = np.concatenate([
        np.random.default_rng(0).lognormal(-2.0, 3.0, 200_000), edges, np.nextafter(edges, 0.0),
        np.nextafter(edges, np.inf), [0.0, -0.0, -1.0, 1e-13, 1e-12, 1e5, 1e6, np.inf, -np.inf, np.nan, 5e-324]])
    assert hist_bins(x).tolist() == hist_index(x).tolist()
    # the hand-worked bins of test_latency_histogram_bins_by_hand
    assert hist_bins(np.array([1.0, 10.0, 2.0, 0.0, math.inf, 1e9])).tolist() == [1500, 1800, 1590, 0, HIST_BINS - 1,
                                                                                  HIST_BINS - 1]


def test_endpoints_in_threads_give_the_same_week(planned_stacks):
    """simulate_week runs the endpoints in threads by default (each has its own random stream and state):
    the same results as one after the other."""
    from simulator.simulate import simulate_week

    inputs, spec = planned_stacks["prod"]
    one = simulate_week(inputs, spec, seed=10, start_h=9.0, end_h=9.2, workers=1)
    three = simulate_week(inputs, spec, seed=10, start_h=9.0, end_h=9.2, workers=3)
    assert len(one.endpoints) == 3
    assert _same(dataclasses.asdict(one), dataclasses.asdict(three))


# ── arrivals drawn ahead of the chunk being served (simulator/simulate.py `ahead`) ─────────────────────

def test_drawing_ahead_keeps_order_raises_the_producers_error_and_stops_with_the_consumer():
    import threading
    import time

    from simulator.simulate import ahead

    assert list(ahead(iter(range(50)), depth=2)) == list(range(50))

    def failing():
        yield 1
        yield 2
        raise ValueError("trace row 3 is not a number")

    got = []
    with pytest.raises(ValueError, match="trace row 3"):
        for x in ahead(failing()):
            got.append(x)
    assert got == [1, 2]  # the error arrives where it happened, after the items before it

    produced = []

    def endless():
        for i in range(10**9):
            produced.append(i)
            yield i

    it = ahead(endless(), depth=2)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()  # the consumer stops early: the producer stops too, a bounded number of items ahead
    time.sleep(0.3)
    n = len(produced)
    time.sleep(0.3)
    assert len(produced) == n <= 3 + 2 + 2
    assert not any(t.name == "arrivals-ahead" and t.is_alive() for t in threading.enumerate())


def test_arrivals_are_not_drawn_ahead_where_serving_draws_from_their_generator(planned_stacks, monkeypatch):
    """Abandonment draws each request's disconnect from the arrivals' generator while a chunk is served: drawn ahead,
    the next chunk's arrivals would take those numbers and the week would differ from the reference engine. The
    guard (EndpointSim.draws_while_serving) keeps them in order; without it the results differ."""
    inputs, spec = planned_stacks["prod"]
    kw = dict(seed=6, start_h=116.0, end_h=116.5)
    ref = simulate_endpoint(inputs, spec, "assist", compiled=False, overrides=Overrides(abandon=Abandon(0.2, True)),
                            **kw)
    fast = simulate_endpoint(inputs, spec, "assist", compiled=True, overrides=Overrides(abandon=Abandon(0.2, True)),
                             **kw)
    assert _same(dataclasses.asdict(ref), dataclasses.asdict(fast))
    monkeypatch.setattr(CompiledEndpointSim, "draws_while_serving", property(lambda self: False))
    unguarded = simulate_endpoint(inputs, spec, "assist", compiled=True,
                                  overrides=Overrides(abandon=Abandon(0.2, True)), **kw)
    assert not _same(dataclasses.asdict(ref), dataclasses.asdict(unguarded))


def test_an_error_while_serving_stops_the_drawing_thread_at_once(planned_stacks, monkeypatch):
    """A failure inside the engine leaves no thread drawing arrivals behind it, even while the error (and so the
    frame holding the generator) is kept, as a future of the week's thread pool keeps it."""
    import threading

    inputs, spec = planned_stacks["prod"]
    calls = []

    def failing_feed(self, chunk, tick_s, next_tick):
        calls.append(1)
        raise RuntimeError("engine state out of range")

    monkeypatch.setattr(CompiledEndpointSim, "feed", failing_feed)
    with pytest.raises(RuntimeError, match="out of range") as kept:
        simulate_endpoint(inputs, spec, "guard", seed=1, start_h=9.0, end_h=12.0, compiled=True)
    assert calls == [1] and kept.value is not None
    deadline = time.monotonic() + 2
    while any(t.name == "arrivals-ahead" and t.is_alive() for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name == "arrivals-ahead" and t.is_alive() for t in threading.enumerate())
