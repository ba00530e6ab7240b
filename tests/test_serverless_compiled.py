"""The compiled switching kernel (topology/plan/serverless_compiled.py) gives the numpy reference's figures."""

from pathlib import Path

import numpy as np
import pytest

from topology.plan import serverless as sv

pytest.importorskip("numba")
from topology.plan import serverless_compiled  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _both(rate, mean, Q, up, k, B, W, wg, keep=0.0):
    top = int(np.ceil((Q.max() + max(up.max(), k.max())) / B))
    got = serverless_compiled.switching(rate, mean, Q, up, k, B, W, wg, sv.log_fact_upto(top + 2), sv.EXACT_LEVELS,
                                        float(sv.SECONDS_PER_MINUTE), sv.UPPER_DIRECT_BELOW, sv.UPPER_SERIES_TERMS,
                                        sv.UPPER_SERIES_STOP, *sv.start_levels_on_and_within_reach(rate, mean, Q, up, B),
                                        sv.stop_levels_held(mean, Q, k, B), sv.REACH_SD, sv.REACH_ABOVE, keep,
                                        sv.PERSIST_NEGLIGIBLE, sv.IDLE_EXPECTED)
    return got, sv._switching_numpy(rate, mean, Q, up, k, B, W, wg, keep)


def _assert_close(got, want, rtol=1e-12, atol=1e-20):
    """Per-minute switching probabilities: 1e-12 relative, or 1e-20 absolute where the kernel, cutting levels per
    minute factor (numpy cuts per hour), takes a rate under 1e-30 per second as 0 (1e-20 of a container a minute
    is nothing any bill shows)."""
    for a, b in zip(got, want):
        assert a.shape == b.shape
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("seed", range(12))
def test_kernel_agrees_with_numpy_on_random_hours(seed):
    """Means from 1e-6 to 3000 in flight (rate 0 included), levels below and above the exact-sum limit (64),
    floors Q, cluster sizes, windows and minute factors kept from minute to minute (traffic.
    within_hour_correlation_s) as the planner passes them."""
    rng = np.random.default_rng(seed)
    H, G = int(rng.integers(1, 40)), 32
    alpha = float(rng.uniform(0.5, 20))
    g, wg = sv.gamma_quadrature(alpha)
    lam = 10 ** rng.uniform(-3, 2.5, H)
    lam[rng.random(H) < 0.1] = 0.0
    S = 10 ** rng.uniform(-1, 1.3, H)
    B = float(rng.choice([1.0, 1.0, 2.0, 3.5]))
    rate = lam[:, None, None] * g[None, None, :] / B
    mean = rate * S[:, None, None]
    Q = np.round(rng.choice([0.0, 0.0, 10.0, 80.0, 400.0]) * rng.random(H))
    K = int(rng.integers(1, 300))
    T = int(rng.integers(1, 9))
    b = int(rng.integers(0, 3))
    k, _ = sv._level_grid(K)
    up = np.where(k <= b, k, np.maximum(T * (k - 1 - b) + 1, k))
    W = float(rng.choice([2.0, 60.0, 120.0, 600.0]))
    keep = float(rng.choice([0.0, 0.4, 0.9, 0.999]))
    _assert_close(*_both(rate, mean, Q, up, k, B, W, wg, keep))


@pytest.mark.parametrize("seed", range(6))
def test_kernel_agrees_with_numpy_with_idle_minutes(seed):
    """With idle minutes (traffic.idle_minute_share): a node at factor 0 of weight p before the active minutes'
    Gamma nodes of weight (1 − p)/32 (unequal weights, a rate-0 node in every hour), kept or not."""
    rng = np.random.default_rng(100 + seed)
    H = int(rng.integers(1, 30))
    p = float(rng.uniform(0.05, 0.9))
    alpha = None if seed == 0 else float(rng.uniform(0.5, 20))
    g, wg = sv.factor_quadrature(alpha, p)
    assert g[0] == 0.0 and wg[0] == pytest.approx(p)
    lam = 10 ** rng.uniform(-3, 2.5, H)
    S = 10 ** rng.uniform(-1, 1.3, H)
    B = float(rng.choice([1.0, 2.0]))
    rate = lam[:, None, None] * g[None, None, :] / B
    mean = rate * S[:, None, None]
    Q = np.round(rng.choice([0.0, 0.0, 10.0, 80.0]) * rng.random(H))
    K = int(rng.integers(1, 200))
    T = int(rng.integers(1, 9))
    b = int(rng.integers(0, 3))
    k, _ = sv._level_grid(K)
    up = np.where(k <= b, k, np.maximum(T * (k - 1 - b) + 1, k))
    W = float(rng.choice([60.0, 120.0, 600.0]))
    keep = float(rng.choice([0.0, 0.9]))
    _assert_close(*_both(rate, mean, Q, up, k, B, W, wg, keep))


def test_kernel_agrees_where_values_underflow():
    """Levels far above and far below the mean (P(N = L − 1) below the least double, P(N < L) exactly 0 or 1):
    the kernel's shortcuts there give what numpy's full arithmetic gives."""
    g, wg = sv.gamma_quadrature(2.0)
    lam = np.array([1e-9, 0.01, 50.0, 2000.0, 9000.0])
    rate = lam[:, None, None] * g[None, None, :]
    mean = rate * 1.0
    k = np.arange(1, 200)
    Q = np.array([0.0, 0.0, 0.0, 1000.0, 0.0])
    for keep in (0.0, 0.8):
        _assert_close(*_both(rate, mean, Q, k * 7, k, 1.0, 300.0, wg, keep))


@pytest.mark.parametrize("stack", ["Pulumi.prod.yaml", "Pulumi.dev.yaml"])
def test_plans_are_the_same_byte_for_byte(stack, monkeypatch):
    from topology import load_inputs, plan

    inputs = load_inputs(ROOT / "stacks" / stack)
    specs = {}
    for compiled in (False, True):
        monkeypatch.setattr(sv, "USE_COMPILED", compiled)
        sv.clear_memos()
        specs[compiled] = plan(inputs).to_json()
    sv.clear_memos()
    assert specs[True] == specs[False]


def test_off_unless_asked_for():
    """A plan alone stays on numpy (numba's import would cost more than the kernel saves on a few endpoints)."""
    import os
    import subprocess
    import sys

    code = ("import sys; from topology import load_inputs, plan; plan(load_inputs('stacks/Pulumi.dev.yaml'));"
            "print('numba' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "PLANNER_COMPILED"}
    for flag, want in ((None, "False"), ("1", "True")):
        if flag:
            env["PLANNER_COMPILED"] = flag
        r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == want


@pytest.mark.parametrize("compiled", [False, True])
def test_memoised_hours_give_what_a_fresh_week_gives(compiled, monkeypatch):
    """The planner memoises each hour's switching probabilities per level and reuses them across calls whose level
    grids differ (a burst cap or a warm minimum moves K, and with it the geometric grid) and across the hours of a
    week alike in rate, service and floor; the start-up burst, per level too. Each call's figures must be the ones a call with no memo gives, to the
    last bit, whatever was worked out before it."""
    monkeypatch.setattr(sv, "USE_COMPILED", compiled)
    alpha = 2.5
    rng = np.random.default_rng(7)
    # a week of a few distinct hourly rates (repeated hours), a floor in some hours
    lam = rng.choice([0.0, 0.4, 3.0, 11.0, 40.0], size=168)
    floor = np.where(lam >= 11.0, rng.choice([1.0, 2.0], size=168), 0.0)
    line = (0.6, 0.05, floor, 8)
    lam[0] = 40.0  # the start-up burst (its own memo) reaches the first hour's levels
    calls = [dict(max_containers=cap, warm_min=warm, floor_inflight=q, floor_service_line=fl, startup=(25.0, 1.5))
             for cap in (3, 40, 200, 90) for warm in (0, np.where(lam > 3.0, 25, 0))
             for q, fl in ((0.0, None), (floor * 8, line))]

    def week(kw):
        ch = sv.expected_containers(lam, 2.0, target_inputs=2, scaledown_window_s=120.0, alpha=alpha, **kw)
        return ch.alive.copy(), ch.launches.copy()

    sv.clear_memos()
    fresh = []
    for kw in calls:
        sv.clear_memos()
        fresh.append(week(kw))
    sv.clear_memos()
    try:
        for _ in range(2):  # the second pass reads every hour from the memo
            for kw, want in zip(calls, fresh):
                got = week(kw)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    finally:
        sv.clear_memos()


@pytest.mark.parametrize("compiled", [False, True])
def test_a_call_differing_in_any_one_setting_is_never_served_anothers_memo(compiled, monkeypatch):
    """The memo's keys must hold every setting the figures depend on: after a base call, a call changing one
    setting (with a floor or without, correlation and idle share on, so the persisting and idle-run chains run)
    must give what it gives with the memo empty. A key missing any of T, b, B, W, alpha, keep, the hour's rate,
    floor or replicas, or the start-up burst's mean, makes one of these serve the base call's figures (a
    reviewer's mutation sweep; the grid-reuse test above caught only the floor line's key)."""
    monkeypatch.setattr(sv, "USE_COMPILED", compiled)
    rng = np.random.default_rng(3)
    lam = rng.choice([0.4, 3.0, 11.0, 40.0], size=168)
    lam[0] = 40.0
    floor = np.where(lam >= 11.0, 2.0, 0.0)
    base = dict(service_s=2.0, target_inputs=2, buffer_containers=1, scaledown_window_s=120.0, alpha=2.5,
                cluster_size=1.0, factor_correlation_s=90.0, idle_share=0.1, startup=(25.0, 1.5), max_containers=60,
                floor_inflight=floor * 8, floor_service_line=(0.6, 0.05, floor, 8))
    no_floor = dict(base, floor_inflight=0.0, floor_service_line=None)
    changes = {
        "service_s": dict(service_s=2.5), "target_inputs": dict(target_inputs=3), "buffer": dict(buffer_containers=2),
        "scaledown window": dict(scaledown_window_s=300.0), "alpha": dict(alpha=3.0), "no factor": dict(alpha=None),
        "cluster": dict(cluster_size=2.0), "correlation": dict(factor_correlation_s=600.0),
        "idle share": dict(idle_share=0.2), "startup": dict(startup=(60.0, 3.0)), "cap": dict(max_containers=200),
        "warm": dict(warm_min=5), "start hour": dict(start_hour=3), "warm lead": dict(warm_lead_s=60.0, warm_min=5),
        "line s0": dict(floor_service_line=(0.7, 0.05, floor, 8)),
        "line s1": dict(floor_service_line=(0.6, 0.06, floor, 8)),
        "line cap": dict(floor_service_line=(0.6, 0.05, floor, 12)),
        "line reps": dict(floor_service_line=(0.6, 0.05, floor * 2, 8)), "floor Q": dict(floor_inflight=floor * 9),
    }

    def week(kw):
        ch = sv.expected_containers(lam, **kw)
        return ch.alive.copy(), ch.launches.copy()

    try:
        for b in (base, no_floor):
            for name, change in changes.items():
                if b is no_floor and name.startswith(("line", "floor")):
                    continue
                kw = dict(b, **change)
                sv.clear_memos()
                want = week(kw)
                sv.clear_memos()
                week(b)
                got = week(kw)
                assert all(np.array_equal(x, y) for x, y in zip(got, want)), (name, b is base)
    finally:
        sv.clear_memos()


def test_switching_between_numpy_and_the_kernel_never_serves_the_other_modes_figures(monkeypatch):
    """The kernel agrees with numpy to 1e-12, not to the bit: a process that plans in one mode and then the other
    must get each mode's own figures (a reviewer measured numpy rows served to a compiled call: 2e-15 apart)."""
    lam = np.array([0.4, 3.0, 11.0, 40.0] * 42)
    kw = dict(target_inputs=2, scaledown_window_s=120.0, alpha=2.5, factor_correlation_s=90.0, idle_share=0.1,
              startup=(25.0, 1.5), max_containers=60)
    got = {}
    try:
        for mode in (True, False):
            monkeypatch.setattr(sv, "USE_COMPILED", mode)
            sv.clear_memos()
            got[mode] = sv.expected_containers(lam, 2.0, **kw).alive.copy()
        sv.clear_memos()
        for first, second in ((False, True), (True, False)):
            monkeypatch.setattr(sv, "USE_COMPILED", first)
            sv.expected_containers(lam, 2.0, **kw)
            monkeypatch.setattr(sv, "USE_COMPILED", second)
            assert np.array_equal(sv.expected_containers(lam, 2.0, **kw).alive, got[second])
    finally:
        sv.clear_memos()


def test_planning_from_threads_gives_what_planning_alone_gives(monkeypatch):
    """The memos are shared by the process and bounded (the oldest entries evicted): a library user planning from
    threads must neither trip over another thread's eviction nor get its figures. Small bounds force evictions."""
    import concurrent.futures as cf

    monkeypatch.setattr(sv, "MEMO_CALLS", 3)
    monkeypatch.setattr(sv, "MEMO_ROWS", 40)
    lam = np.array([0.4, 3.0, 11.0, 40.0, 7.0, 0.0] * 28)
    calls = [dict(target_inputs=2, scaledown_window_s=w, alpha=2.5, max_containers=cap, startup=(25.0, 1.5),
                  factor_correlation_s=90.0) for w in (60.0, 120.0, 300.0) for cap in (5, 40, 200)]

    def week(kw):
        ch = sv.expected_containers(lam, 2.0, **kw)
        return ch.alive.copy(), ch.launches.copy()

    try:
        sv.clear_memos()
        alone = [week(kw) for kw in calls]
        sv.clear_memos()
        with cf.ThreadPoolExecutor(4) as pool:
            together = list(pool.map(week, calls * 4))
        for got, want in zip(together, alone * 4):
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    finally:
        sv.clear_memos()
