"""The serverless cost model (topology/plan/serverless.py) against hand-worked cases, and the plan's bill for
every option against the simulator's on every bundled trace (a bounded horizon; the full week is in
benchmarks/bench_cost_model.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.costcheck import TOLERANCE, check, measured_burstiness, measured_traffic
from topology import load_inputs
from topology.plan.serverless import (
    cluster_size_from_counts,
    correlation_s_from_minute_counts,
    expected_containers,
    gamma_alpha_for_peak,
    gamma_quadrature,
    idle_share_from_minute_counts,
    poisson_below_and_at,
    poisson_tails,
)
from topology.plan import serverless as sv
from topology.minute_factors import gamma_alpha_for_peak_with_idle


def test_poisson_probabilities_match_the_direct_sums():
    for mean, level in [(2.0, 1), (2.0, 3), (60.0, 70), (180.0, 200), (900.0, 950)]:
        pmf = [math.exp(j * math.log(mean) - mean - math.lgamma(j + 1)) for j in range(level)]
        below, at = poisson_below_and_at(np.array([[[level]]]), np.array([[[mean]]]))
        assert below.item() == pytest.approx(sum(pmf), abs=2e-4)
        assert at.item() == pytest.approx(pmf[-1], rel=1e-9)


def _upper_tail_by_direct_sum(level: int, mean: float) -> float:
    """P(N ≥ level) for N ~ Poisson(mean) as the sum of its own terms (all positive: relative accuracy ~1e-14
    however small the tail), not as 1 − P(N < level)."""
    terms, j, total = [], level, 0.0
    while True:
        t = math.exp(j * math.log(mean) - mean - math.lgamma(j + 1))
        terms.append(t)
        total += t
        if j > mean and t <= 1e-30 * total:
            return math.fsum(terms)
        j += 1


@pytest.mark.parametrize("level,mean", [(10, 0.5), (40, 5.0), (60, 20.0), (64, 38.0), (100, 30.0), (200, 100.0),
                                        (500, 300.0), (80, 50.0), (30, 20.0), (300, 280.0)])
def test_the_upper_tail_keeps_its_digits_far_above_the_mean(level, mean):
    """P(N ≥ L) far above the mean is far below the resolution of 1 (P(N ≥ 100) at mean 30 is 7e-24): worked
    out as 1 − P(N < L) it was 0 or off by orders of magnitude; summed directly it keeps its digits, in the
    exact-sum levels (≤ 64) and the Wilson–Hilferty ones alike. Near the mean (P ≥ 1e-4) the absolute error of
    the Wilson–Hilferty levels stays as it was."""
    want = _upper_tail_by_direct_sum(level, mean)
    below, above, _ = poisson_tails(np.array([[[level]]]), np.array([[[mean]]]))
    if want < 1e-4:
        assert above.item() == pytest.approx(want, rel=1e-8)
    else:
        assert above.item() == pytest.approx(want, abs=2e-4)
        assert above.item() + below.item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("k,excursion_s", [(64, 45.01), (80, 33.15)])
def test_a_container_started_far_above_the_mean_stays_while_in_flight_stays_above_it(k, excursion_s):
    """The stop rate of a level k reached far above the mean in flight: the container stays for the excursion
    of in flight at or above k — mean P(N ≥ k) / (λ·P(N = k − 1)) by level crossing (time above over
    up-crossings) — then for the window W. λ = 0.01/s, S = 2000 s (in flight Poisson(20)), W = 10 s: the
    excursion is (1/λ)·Σ_{n≥1} Π_{i<n} 20/(k + i), at k = 64 100 × (0.3125 + 0.0962 + 0.0291 + 0.0087 + 0.0026 +
    …) = 45.01 s (an exact-sum level), at k = 80 100 × (0.25 + 0.0617 + 0.0151 + 0.0036 + 0.0009 + …) = 33.15 s
    (a Wilson–Hilferty level); so the container stops with probability 1 − e^(−60/(W + excursion)) in a minute
    (0.664, 0.751). With the tail lost (1 − P(N < k) is 0 or noise there) the old plan gave 0.409 and 0.998
    (noise, and W alone)."""
    lam, S, W = 0.01, 2000.0, 10.0
    m = lam * S
    want = _upper_tail_by_direct_sum(k, m) / (lam * math.exp((k - 1) * math.log(m) - m - math.lgamma(k)))
    assert want == pytest.approx(excursion_s, abs=0.01)
    rate = np.full((1, 1, 1), lam)
    levels = np.array([k], dtype=float)
    _, p_off, _ = sv._switching(rate, rate * S, np.zeros(1), levels, levels, 1.0, W, np.ones(1))
    assert float(p_off[0, 0]) == pytest.approx(1 - math.exp(-60 / (W + excursion_s)), rel=1e-3)


def test_minute_factor_nodes_have_mean_one_and_the_gamma_variance():
    for pf in (1.5, 2.0, 3.0):
        alpha = gamma_alpha_for_peak(pf)
        g, w = gamma_quadrature(alpha)
        assert float((g * w).sum()) == pytest.approx(1.0)
        assert float(((g - 1) ** 2 * w).sum()) == pytest.approx(1 / alpha, rel=0.08)


def test_one_request_per_container_and_no_window_is_the_mean_occupancy():
    """target 1, W → 0: a container per request in flight, gone when it finishes: E[containers] = λ·S."""
    r = expected_containers(np.array([2.0]), 5.0, target_inputs=1, scaledown_window_s=1e-6, alpha=None)
    assert float(r.alive[0]) == pytest.approx(10.0, rel=1e-3)


def test_instant_requests_keep_the_container_for_the_window():
    """Service → 0: the container is up iff a request came in the last W: 1 − e^(−λW)."""
    # two hours at the same rate: the week is billed from no container up, so the first hour carries the
    # start; the second is the steady state
    r = expected_containers(np.array([0.01, 0.01]), 1e-6, target_inputs=1, scaledown_window_s=120, alpha=None)
    assert float(r.alive[1]) == pytest.approx(1 - math.exp(-0.01 * 120), rel=1e-3)
    assert float(r.alive[0]) < float(r.alive[1])  # the first W after the start, none was up yet


def test_containers_stay_up_while_requests_spread_over_them():
    """40 in flight on average (1 req/s × 40 s), target 49 per container: the 2nd container starts when in
    flight reaches 50 (P ≈ 7% at any moment, so within minutes) and never stops, since least-in-flight routing
    keeps sending it requests unless fewer than 2 are in flight for the whole 120 s. The 3rd needs 99: never.
    So 2 containers all the time — the replaced formula gave 40/49 + (1 − 40/49)·(120·8/3600) ≈ 0.87."""
    # (the second of two equal hours: the first starts from no container up and launches the two)
    r = expected_containers(np.array([1.0, 1.0]), 40.0, target_inputs=49, scaledown_window_s=120, alpha=None)
    assert float(r.alive[1]) == pytest.approx(2.0, abs=0.02)
    assert float(r.launches[1]) < 0.01  # nothing cycles
    assert float(r.launches[0]) < 2.0 + 0.01  # at most the two starts


def _first_container_up_exactly(lam: float, alpha: float, keep: float, W: float = 120.0) -> float:
    """P(a request in the last W) for instant requests at rate λ·g, g ~ Gamma(α, 1/α) constant within each clock
    minute and kept from one minute to the next with probability `keep` (else drawn afresh). A window of 120 s
    ending u seconds into a minute covers u s of it, the whole minute before and 60 − u s of the one before
    that; the factor is one value over each run of kept minutes, and E[e^(−s·g)] = (1 + s/α)^(−α) (the Gamma's
    Laplace transform), so with the two links kept or not:
      P(none) = keep²·L(λW) + keep(1 − keep)·L(λ(W − u))·L(λu) + (1 − keep)keep·L(λ(60 − u))·L(λ(60 + u))
                + (1 − keep)²·L(λ(60 − u))·L(60λ)·L(λu),
    averaged over the phase u (midpoint rule, 6,000 points). Independent of the planner's chains."""
    assert W == 120.0

    def L(s):
        return (1.0 + s / alpha) ** -alpha

    u = (np.arange(6000) + 0.5) / 100.0
    none = (keep ** 2 * L(lam * W) + keep * (1 - keep) * L(lam * (W - u)) * L(lam * u)
            + (1 - keep) * keep * L(lam * (60 - u)) * L(lam * (60 + u))
            + (1 - keep) ** 2 * L(lam * (60 - u)) * L(lam * 60) * L(lam * u))
    return 1.0 - float(none.mean())


@pytest.mark.parametrize("tau_s", [0.0, 180.0, 600.0, 3600.0])
def test_a_persistent_minute_factor_keeps_the_container_less(tau_s):
    """Instant requests at 0.01 req/s, busiest minute 4× the mean (α = 1.05), W = 120 s: the container is up iff a
    request came in the last 120 s. With the factor kept from minute to minute (correlation time τ, kept with
    probability e^(−60/τ)) quiet minutes come together, so the window more often holds no request: exactly
    (_first_container_up_exactly) 0.626 at τ = 0, 0.574 at 180 s, 0.559 at 600 s, 0.552 at an hour. The plan
    follows within 1.5%; drawing each minute afresh whatever τ (the model before) it stays at 0.620, 11% over the
    exact figure at τ = 600 s."""
    alpha = gamma_alpha_for_peak(4.0)
    keep = math.exp(-60.0 / tau_s) if tau_s > 0 else 0.0
    want = _first_container_up_exactly(0.01, alpha, keep)
    r = expected_containers(np.full(3, 0.01), 1e-6, target_inputs=1, scaledown_window_s=120, alpha=alpha,
                            factor_correlation_s=tau_s)
    assert float(r.alive[2]) == pytest.approx(want, rel=0.015)
    if tau_s >= 600:
        independent = expected_containers(np.full(3, 0.01), 1e-6, target_inputs=1, scaledown_window_s=120,
                                          alpha=alpha)
        assert float(independent.alive[2]) > want * 1.1


@pytest.mark.parametrize("lam", [0.003, 0.01])
def test_a_minute_with_no_request_lets_the_container_go(lam):
    """Very bursty traffic (busiest minute 7.3× the mean, α = 0.29: five of the 32 minute-factor nodes are 0, 16%
    of minutes with no request at all). Instant requests, W = 120 s: the container is up iff a request came in
    the last 120 s. Exactly, for the plan's own factor nodes drawn afresh each minute: 1 − E_u[M(λu)·M(60λ)·
    M(λ(60 − u))], M(s) = Σ w·e^(−s·g) — 0.257 at λ = 0.003/s, 0.515 at 0.01/s. The plan: 0.263 and 0.499. It gave
    0.305 and 0.565: at a factor of 0 the stop rate came out 0 (a tail of 1e-300 over no down-crossings), so the
    container was held through every quiet minute."""
    alpha = gamma_alpha_for_peak(7.3)
    g, w = gamma_quadrature(alpha)
    assert int((g == 0).sum()) == 5

    def M(s):
        return float((w * np.exp(-s * g)).sum())

    u = (np.arange(600) + 0.5) / 10.0
    want = 1.0 - float(np.mean([M(lam * x) * M(lam * 60) * M(lam * (60 - x)) for x in u]))
    r = expected_containers(np.full(3, lam), 1e-6, target_inputs=1, scaledown_window_s=120, alpha=alpha)
    assert float(r.alive[2]) == pytest.approx(want, rel=0.04)
    # and the switching arithmetic itself: no request in the minute, on at its start: stops with 1 − e^(−60/W)
    zero = np.zeros((1, 1, 1))
    _, p_off, _ = sv._switching(zero, zero, np.zeros(1), np.array([1.0]), np.array([1.0]), 1.0, 120.0, np.ones(1))
    assert float(p_off[0, 0]) == pytest.approx(1 - math.exp(-0.5), rel=1e-12)


def _on_off_up_exactly(lam: float, p: float, keep: float, W: float = 120.0) -> float:
    """P(a request in the last W = 120 s) for an on/off source: each minute idle (rate 0) with probability p, else at
    the constant rate λ/(1 − p) (mean λ), the state kept from one minute to the next with probability `keep` (else
    drawn afresh). The window ending u s into a minute covers u s of it, the minute before and 60 − u s of the one
    before that; a run of kept minutes is one state, and a stretch of s seconds in one state holds no request
    with probability M(s) = p + (1 − p)·e^(−λs/(1 − p)). With the two links kept or not, averaged over u (as
    _first_container_up_exactly, the on/off source's M in place of the Gamma's transform)."""
    assert W == 120.0
    r = lam / (1.0 - p)

    def M(s):
        return p + (1.0 - p) * np.exp(-r * s)

    u = (np.arange(6000) + 0.5) / 100.0
    none = (keep ** 2 * M(W) + keep * (1 - keep) * M(W - u) * M(u) + (1 - keep) * keep * M(60 - u) * M(60 + u)
            + (1 - keep) ** 2 * M(60 - u) * M(60) * M(u))
    return 1.0 - float(none.mean())


@pytest.mark.parametrize("lam,tau_s,want_exact", [(0.003, 0.0, 0.274), (0.01, 0.0, 0.556), (0.01, 600.0, 0.399),
                                                   (0.03, 0.0, 0.718), (0.03, 600.0, 0.435), (0.1, 0.0, 0.765),
                                                   (0.1, 600.0, 0.442)])
def test_idle_minutes_let_the_container_go(lam, tau_s, want_exact):
    """An on/off source (clients that come and go): no request in 60% of minutes, a constant λ/0.4 req/s in the
    others (the busiest minute 2.5× the mean), instant requests, W = 120 s: the container is up iff a request came
    in the last 120 s — exactly (_on_off_up_exactly) 0.274, 0.556, 0.718 and 0.765 at λ = 0.003, 0.01, 0.03 and
    0.1 req/s with minutes drawn afresh; 0.399, 0.435 and 0.442 with the state kept for τ = 600 s. Told the idle
    share 0.6 and the peak factor 2.5 (which then leaves the active minutes flat), the plan gives 0.273, 0.599,
    0.749, 0.774 and 0.405, 0.440, 0.443 (within 8%; within 2% where the state persists). The idle minutes
    stopping a level at the rate 1/W a minute (the model before: an isolated idle minute stopped it 39% of the
    time, where it never can) gave 0.626 and 0.629 at 0.03 and 0.1 req/s (−13%, −18%); told the peak factor
    alone, the Gamma it sets has few quiet minutes and the plan gave 0.670 and 0.647 at 0.01 req/s (+20%, +62%)."""
    p = 0.6
    keep = math.exp(-60.0 / tau_s) if tau_s > 0 else 0.0
    want = _on_off_up_exactly(lam, p, keep)
    assert want == pytest.approx(want_exact, abs=0.001)
    alpha = gamma_alpha_for_peak_with_idle(2.5, p)
    assert alpha is None  # the busiest of the active minutes is their constant rate
    r = expected_containers(np.full(3, lam), 1e-6, target_inputs=1, scaledown_window_s=120, alpha=alpha,
                            idle_share=p, factor_correlation_s=tau_s)
    assert float(r.alive[2]) == pytest.approx(want, rel=0.08 if tau_s == 0 else 0.02)
    if lam == 0.01:
        old = expected_containers(np.full(3, lam), 1e-6, target_inputs=1, scaledown_window_s=120,
                                  alpha=gamma_alpha_for_peak(2.5), factor_correlation_s=tau_s)
        assert float(old.alive[2]) > want * 1.15


@pytest.mark.parametrize("W,p,peak", [(120, 0.3, None), (60, 0.1, None), (60, 0.0, 5.0)])
def test_idle_runs_keep_the_chain_a_probability(W, p, peak):
    """Where a level is on at every active node and a run of idle minutes stops it (κ = 0, W a whole number of
    minutes), the stopping minute's time on must not enter the two-state chain's probabilities: read into P(on),
    it made p_on = (1 − p)/p (9 at p = 0.1), ρ = 1 − p_on − p_off fell below −1 and the hour's ρ⁶⁰ blew up —
    2.3e30 containers alive at 3 req/s, idle share 0.3, W = 120 s; 3.5e41 with no idle share at all, peak factor 5
    (a Gamma node at 0) and W = 60 s. The chain now reads P(on) at minute ends and the stopping minute's time is
    added to the containers alive: every switching probability in [0, 1], containers alive finite and at most the
    cap, launches ≥ 0."""
    alpha = gamma_alpha_for_peak(peak) if peak else 2.0
    g, w = sv.factor_quadrature(alpha, p)
    rate = 3.0 * g[None, None, :]
    levels = np.arange(1.0, 61.0)
    p_on, p_off, extra = sv._switching(rate, rate * 5.0, np.zeros(1), levels, levels, 1.0, float(W), w)
    assert np.all((p_on >= 0) & (p_on <= 1) & (p_off >= 0) & (p_off <= 1) & (extra >= 0))
    r = expected_containers(np.full(6, 3.0), 5.0, target_inputs=1, scaledown_window_s=W, alpha=alpha, idle_share=p,
                            max_containers=60)
    assert np.all(np.isfinite(r.alive)) and float(r.alive.max()) <= 60.0
    assert float(r.alive[3]) > 20.0  # 15 in flight on average, bursty minutes and a window: more kept alive
    assert np.all(r.launches >= 0)


def test_an_idle_run_stops_a_level_once_it_lasts_the_window():
    """The run arithmetic alone (idle_run_on), hand-worked. W = 150 s, runs going on with probability s = 0.5 a
    minute. A level at or above (no quiet before the run) is on through the run's first two minutes and half its
    third: it returns on after minute 1 with weight 1 and after minute 2 with s, so 1.5, and is on
    1 + 0.5 + 0.25·0.5 = 1.625 minutes. One below its level since a uniform time before the run (h → 0: q₀ uniform on
    [0, 150)): T = 150 − q₀ is in (0, 60] with probability 0.4, (60, 120] 0.4, (120, 150] 0.2; it returns 0, 1 and
    1.5 there and is on T/60, 1 + s·(T/60 − 1) and 1.5 + s²·(T/60 − 2), at the intervals' mean T (30, 90, 135 s)
    0.5, 1.25 and 1.5625: ret = 0.4·1 + 0.2·1.5 = 0.7, ont = 0.4·0.5 + 0.4·1.25 + 0.2·1.5625 = 1.0125."""
    ret, ont = sv.idle_run_on(np.array([1.0, 0.0]), np.array([0.0, 0.0]), 0.5, 150.0)
    assert ret[0] == pytest.approx(1.5, rel=1e-12)
    assert ont[0] == pytest.approx(1.625, rel=1e-12)
    assert ret[1] == pytest.approx(0.7, rel=1e-9)
    assert ont[1] == pytest.approx(1.0125, rel=1e-9)


@pytest.mark.parametrize("peak,p,want_peak", [(3.0, 0.3, (2.8, 3.3)), (5.0, 0.2, (4.5, 5.5)), (7.3, 0.6, (6.8, 7.8)),
                                              (3.0, 0.0, (2.8, 3.2))])
def test_peak_factor_and_idle_share_are_measured_together(peak, p, want_peak):
    """Minute counts drawn from the plan's own factor (idle with probability p, else Poisson at 6 a minute × a Gamma
    whose busiest active minute is `peak` × the mean; 300 hours): the peak factor and idle share measured together
    (within_hour_from_minute_counts) give the peak back (3.03, 4.91, 7.25, 2.97) and the share within 0.015, and the
    plan's factor then has the counts' own excess variance (within 2%). Read one after the other — the peak from all
    of the dispersion as a Gamma's, then the share for that peak — the idle minutes' part of the variance counted
    twice: peak 3.0 at 30% idle read 3.58 and the plan's factor had a variance 21% over the counts'."""
    rng = np.random.default_rng(11)
    alpha = gamma_alpha_for_peak_with_idle(peak, p)
    g = np.where(rng.random(300 * 60) < p, 0.0, rng.gamma(alpha, 1 / alpha, 300 * 60) / (1 - p))
    counts = rng.poisson(6.0 * g).reshape(300, 60).astype(float)
    pf, share = sv.within_hour_from_minute_counts(counts)
    assert want_peak[0] <= pf <= want_peak[1]
    assert share == pytest.approx(p, abs=0.015)
    m = counts.mean(axis=1)
    V = float(np.mean((counts.var(axis=1, ddof=1) - m) / m ** 2))
    a = gamma_alpha_for_peak_with_idle(pf, share)  # the plan's factor: E g² = (1 + 1/α)/(1 − p)
    assert (1 + (1 / a if a else 0.0)) / (1 - share) - 1 == pytest.approx(V, rel=0.02)
    if p > 0.25 and peak == 3.0:
        seq = sv.peak_factor_from_minute_counts(counts)
        assert seq > want_peak[1]


def test_a_burstier_log_never_reads_a_calmer_peak():
    """Each hour 59 minutes at Poisson(100) and one at k × that: the busiest minute over the mean grows with k, and so
    must the peak factor read from the counts. Wilson–Hilferty's transform peaks at α = 4/(9z²) and falls below it,
    so the reading ran backwards — 4.1, 9.7, 6.2 and 2.15 at k = 10, 40, 100, 200 (the log's own busiest/mean 46 at
    200); it now saturates at the model's most bursty figure, 9.72."""
    rng = np.random.default_rng(5)
    read = []
    for k in (10, 40, 100, 200):
        counts = rng.poisson(100.0, (200, 60)).astype(float)
        counts[:, 0] = rng.poisson(100.0 * k, 200)
        read.append(sv.peak_factor_from_minute_counts(counts))
        assert sv.within_hour_from_minute_counts(counts)[0] == pytest.approx(read[-1])
    assert read == sorted(read)
    assert read[-1] == pytest.approx(9.72, abs=0.01)


def test_idle_share_keeps_the_mean_and_the_busiest_minute():
    """The factor with idle minutes: mean 1 (the hour's mean rate is the input's), a node at 0 of weight p, and the
    busiest of the 60·(1 − p) active minutes — their factor's n/(n + 1) quantile (Wilson–Hilferty, as the largest
    of 60 at 60/61) — still the peak factor. Peak 7.3 with 61% of minutes idle: active minutes Gamma(1.35) over
    0.39; with none idle the factor is Gamma(0.29), and share 0 gives exactly that."""
    from statistics import NormalDist

    g, w = sv.factor_quadrature(gamma_alpha_for_peak_with_idle(7.3, 0.61), 0.61)
    assert float((w * g).sum()) == pytest.approx(1.0, rel=1e-12)
    assert float(w.sum()) == pytest.approx(1.0, rel=1e-12)
    assert float(w[g == 0].sum()) == pytest.approx(0.61, rel=1e-9)
    a = gamma_alpha_for_peak_with_idle(7.3, 0.61)
    n = 60 * 0.39
    z = NormalDist().inv_cdf(n / (n + 1))
    assert (1 - 1 / (9 * a) + z / (3 * math.sqrt(a))) ** 3 / 0.39 == pytest.approx(7.3, rel=1e-6)
    assert a == pytest.approx(1.35, abs=0.01)
    assert gamma_alpha_for_peak_with_idle(7.3, 0.0) == gamma_alpha_for_peak(7.3)
    g0, w0 = sv.factor_quadrature(gamma_alpha_for_peak(7.3), 0.0)
    g1, w1 = gamma_quadrature(gamma_alpha_for_peak(7.3))
    assert np.array_equal(g0, g1) and np.array_equal(w0, w1)


@pytest.mark.parametrize("p,per_minute", [(0.0, 3.0), (0.3, 5.0), (0.6, 18.0), (0.6, 3.0)])
def test_idle_share_measured_from_minute_counts_recovers_the_input(p, per_minute):
    """The input is measurable from a request log's per-minute counts: minutes idle with probability p, otherwise
    Poisson at a Gamma(2)-varying rate per_minute·g/(1 − p); with the peak factor measured from the same counts,
    the share of empty minutes the plan's factor would leave gives p back (0.000–0.002, 0.276–0.279, 0.591–0.598,
    0.582–0.587 over two seeds). Counting only the excess over Poisson at each hour's mean would read the Gamma's
    own empty minutes as idle ones: 0.109 with none idle at 3 a minute, 0.32 at p = 0.3."""
    rng = np.random.default_rng(int(p * 10) + int(per_minute))
    n = 500 * 60
    g = rng.gamma(2.0, 0.5, n) / (1.0 - p) * (rng.random(n) >= p)
    counts = rng.poisson(per_minute * g).reshape(500, 60).astype(float)
    pf = sv.peak_factor_from_minute_counts(counts)
    got = idle_share_from_minute_counts(counts, 1.0, pf)
    assert got == pytest.approx(p, abs=0.025)
    if p == 0.0:
        assert got == 0.0  # the empty minutes beyond the Gamma's are within its count's noise
        poisson_excess = np.maximum((counts == 0).mean(axis=1) - np.exp(-counts.mean(axis=1)), 0.0).mean()
        assert poisson_excess > 0.08


def test_idle_share_is_checked_as_an_input(root):
    """Out of range or not a number: a one-line error naming the field, the value and what is allowed."""
    import datetime as dt
    import sys

    sys.path.insert(0, str(root / "tests"))
    from inputs_factory import INPUTS, set_path
    from topology.errors import InputError
    from topology.loading import inputs_from_document

    for value, allowed in ((-0.1, "greater than or equal to 0"), (1.0, "less than 1"), ("most", "valid number")):
        with pytest.raises(InputError) as e:
            inputs_from_document(set_path(INPUTS, "endpoints.0.traffic.idle_minute_share", value), "in.yaml",
                                 root, dt.date(2026, 12, 2))
        msg = str(e.value)
        assert f"endpoints.0.traffic.idle_minute_share = {value!r}" in msg and allowed in msg


def _persistent_counts(keep: float, alpha: float, hours: int, per_minute: float, bunch: int, seed: int) -> np.ndarray:
    """Minute counts of a log: factor g ~ Gamma(α, 1/α) kept from minute to minute with probability `keep`,
    bunches of `bunch` requests arriving as Poisson(per_minute·g / bunch)."""
    rng = np.random.default_rng(seed)
    n = hours * 60
    fresh = rng.gamma(alpha, 1.0 / alpha, n)
    kept = rng.random(n) < keep
    g = np.empty(n)
    g[0] = fresh[0]
    for i in range(1, n):
        g[i] = g[i - 1] if kept[i] else fresh[i]
    return (bunch * rng.poisson(per_minute * g / bunch)).reshape(hours, 60).astype(float)


@pytest.mark.parametrize("tau_s,bunch", [(300.0, 1), (300.0, 8), (120.0, 1), (0.0, 1)])
def test_correlation_time_measured_from_minute_counts_recovers_the_input(tau_s, bunch):
    """The input is measurable from a request log's per-minute counts: a factor kept with probability
    e^(−60/τ) and Poisson (or bunched) arrivals on top; the counts' Poisson noise does not correlate from one
    minute to the next, so the lag-1 autocovariance over the excess variance gives the factor's own
    autocorrelation back (the raw counts' is lower: at 20 requests a minute and α = 2 the noise is half the
    variance). 1,000 hours of minutes (over seeds the figure spreads by 2% (Poisson) to 6% (bunches of 8))."""
    keep = math.exp(-60.0 / tau_s) if tau_s > 0 else 0.0
    counts = _persistent_counts(keep, 2.0, 1000, 20.0, bunch, seed=int(tau_s) + bunch)
    got = correlation_s_from_minute_counts(counts, float(bunch))
    if tau_s == 0:
        assert got < 20.0  # independent minutes: e^(−60/20) = 0.05 of the factor kept at most
    else:
        assert got == pytest.approx(tau_s, rel=0.15)
        raw = np.mean([np.corrcoef(h[1:], h[:-1])[0, 1] for h in counts])
        assert raw < keep - 0.1  # the noise hides it in the raw counts


def test_correlation_time_is_checked_as_an_input(root):
    """Out of range or not a number: a one-line error naming the field, the value and what is allowed."""
    import datetime as dt
    import sys

    sys.path.insert(0, str(root / "tests"))
    from inputs_factory import INPUTS, set_path
    from topology.errors import InputError
    from topology.loading import inputs_from_document

    for value, allowed in ((-5, "greater than or equal to 0"), (5000, "less than or equal to 3600"),
                           ("soon", "valid number")):
        with pytest.raises(InputError) as e:
            inputs_from_document(set_path(INPUTS, "endpoints.0.traffic.within_hour_correlation_s", value), "in.yaml",
                                 root, dt.date(2026, 12, 2))
        msg = str(e.value)
        assert f"endpoints.0.traffic.within_hour_correlation_s = {value!r}" in msg and allowed in msg


def test_a_warm_window_bills_its_lead_and_the_scaledown_after_it():
    """A warm minimum of 3 in one hour of a week with no traffic, deployed as the burst schedule deploys it: the
    window starts its 60-s lead before the hour (burst.burst_spec, topology/windows.py), Modal launches the 3
    then, holds them the hour and, once the minimum lets them go, stops each after the scaledown window without
    a request (120 s). Hand-worked: 3 × 60 s = 0.05 container-hours in the hour before, 3 in the hour, 3 × 120 s
    = 0.1 in the hour after, nothing else and no launch inside the hour. The plan billed 0 for the lead and
    7e-5 after (a container in an hour with no traffic stopped within its first minute)."""
    warm = np.zeros(8, int)
    warm[4] = 3
    ch = expected_containers(np.zeros(8), 5.0, target_inputs=10, scaledown_window_s=120.0, alpha=None, warm_min=warm,
                             max_containers=3, warm_lead_s=60.0)
    assert ch.alive == pytest.approx([0, 0, 0, 0.05, 3.0, 0.1, 0, 0], abs=1e-9)
    # a minimum already held the hour before is not launched again: no lead for the part below it
    warm[3] = 2
    ch = expected_containers(np.zeros(8), 5.0, target_inputs=10, scaledown_window_s=120.0, alpha=None, warm_min=warm,
                             max_containers=3, warm_lead_s=60.0)
    assert ch.alive[2:6] == pytest.approx([2 * 60 / 3600, 2 + 1 * 60 / 3600, 3.0, 0.1], abs=1e-9)


def test_a_long_window_keeps_the_busiest_hours_containers():
    """W → ∞: containers stay at the most ever needed; after a busy hour a quiet one still bills them."""
    lam = np.array([10.0, 0.5])
    r = expected_containers(lam, 1.0, target_inputs=1, scaledown_window_s=1e7, alpha=None, start_hour=0)
    short = expected_containers(lam, 1.0, target_inputs=1, scaledown_window_s=1e-6, alpha=None, start_hour=0)
    assert r.alive[1] >= r.alive[0] > 10.0
    assert short.alive[1] == pytest.approx(0.5, rel=1e-2)


def test_a_start_from_no_container_launches_for_everything_in_flight_before_the_first_completion():
    """10 req/s, a request alone takes S₁ = 1 s, a cold start c = 9 s, one request per container: from no
    container nothing completes for c + S₁ = 10 s, so all of those requests are in flight at once —
    Poisson(100) — and each has launched its container: E = λ·(c + S₁) = 100 launches, and with a window that
    never ends all 100 stay billed in the first hour (the hour's own in flight, Poisson(10), never comes close)."""
    lam = np.array([10.0, 10.0])
    r = expected_containers(lam, 1.0, target_inputs=1, scaledown_window_s=1e7, alpha=None, start_hour=0,
                            startup=(9.0, 1.0))
    assert float(r.alive[0]) == pytest.approx(100.0, rel=0.05)
    assert float(r.launches[0]) == pytest.approx(100.0, rel=0.05)
    # without a cold start the busiest moment of the hour sets it: far fewer
    quick = expected_containers(lam, 1.0, target_inputs=1, scaledown_window_s=1e7, alpha=None, start_hour=0)
    assert float(quick.alive[0]) < 40.0


def test_peak_factor_measured_from_a_synthetic_week_recovers_the_input(root):
    """The input is measurable: the simulator's synthetic arrivals at peak factor 2.0, measured from their
    per-minute counts (Poisson noise removed), give 2.0 back; their minutes are drawn independently, and the
    correlation time measures near 0 (0–21 s over seeds: a factor kept with probability e^(−60/21) = 0.06)."""
    inputs = load_inputs(root / "stacks/Pulumi.dev.yaml")
    ep = inputs.endpoints[0]
    prof = [20.0] * 168
    ep = ep.model_copy(update={"traffic": ep.traffic.model_copy(update={
        "hourly_mean_requests_per_s": prof, "within_hour_peak_factor": 2.0})})
    pf, cluster = measured_burstiness(inputs.model_copy(update={"endpoints": [ep]}), None, 0.0, 12.0, seed=3)
    assert pf == pytest.approx(2.0, abs=0.15)
    assert cluster == pytest.approx(1.0, abs=0.1)
    tau = measured_traffic(inputs.model_copy(update={"endpoints": [ep]}), None, 0.0, 12.0, seed=4).correlation_s
    assert tau < 30.0


def test_a_synthetic_week_keeps_its_minute_factor_when_told(root):
    """`traffic.within_hour_correlation_s` reaches the simulator's synthetic week: drawn with 600 s, its minute
    counts measure a persisting factor (346–595 s over seeds 3–6 in 12 hours: each hour's factors are scaled to
    mean 1, which takes part of a persistence that long), where independent minutes measure 0–21 s."""
    inputs = load_inputs(root / "stacks/Pulumi.dev.yaml")
    ep = inputs.endpoints[0]
    ep = ep.model_copy(update={"traffic": ep.traffic.model_copy(update={
        "hourly_mean_requests_per_s": [20.0] * 168, "within_hour_peak_factor": 2.0,
        "within_hour_correlation_s": 600.0})})
    tau = measured_traffic(inputs.model_copy(update={"endpoints": [ep]}), None, 0.0, 12.0, seed=4).correlation_s
    assert 200.0 < tau < 900.0


@pytest.mark.parametrize("share,peak", [(0.4, 3.0), (0.6, 2.0)])
def test_a_synthetic_week_has_the_idle_minutes_it_is_told(root, share, peak):
    """`traffic.idle_minute_share` reaches the simulator's synthetic week as the planner reads it: at 10 req/s
    (600 requests a minute: Poisson noise and the Gamma leave no minute empty) the share of empty minutes is the
    input, each hour keeps its mean (its factors scaled to mean 1), and the minutes with traffic spread as the
    planner's Gamma for them (topology/minute_factors.gamma_alpha_for_peak_with_idle; at 0.6 idle the minutes with
    traffic, at 2.5× the mean, already exceed a peak of 2: flat). 24 hours, 1,440 minutes: the share's binomial
    spread is ±0.013."""
    from simulator.traffic import arrivals

    inputs = load_inputs(root / "stacks/Pulumi.dev.yaml")
    ep = inputs.endpoints[0]
    ep = ep.model_copy(update={"traffic": ep.traffic.model_copy(update={
        "hourly_mean_requests_per_s": [10.0] * 168, "within_hour_peak_factor": peak, "idle_minute_share": share})})
    counts = np.zeros(24 * 60)
    for ch in arrivals(ep, None, 0.0, 24 * 3600.0, np.random.default_rng(7)):
        counts += np.bincount((ch.arrival_s // 60).astype(int), minlength=24 * 60)[: 24 * 60]
    assert np.mean(counts == 0) == pytest.approx(share, abs=0.04)
    by_hour = counts.reshape(24, 60)
    assert by_hour.sum(axis=1) == pytest.approx(np.full(24, 36_000.0), rel=0.02)
    # the minutes with traffic spread as the planner's Gamma for them: (Var − mean) / mean² = 1/α, Poisson removed
    alpha = gamma_alpha_for_peak_with_idle(peak, share)
    excess = [(h[h > 0].var(ddof=1) - h[h > 0].mean()) / h[h > 0].mean() ** 2 for h in by_hour]
    if alpha is None:  # 0.6 idle: the minutes with traffic all at 2.5× the mean, Poisson noise alone
        assert abs(float(np.mean(excess))) < 0.01
    else:
        assert float(np.mean(excess)) == pytest.approx(1 / alpha, rel=0.25)


def test_cluster_size_of_bunched_arrivals():
    rng = np.random.default_rng(0)
    bunches = rng.poisson(2.0, size=(600, 6))  # bunches per 10-second window, rate constant in each minute
    # 5 requests a bunch: counts 5·X, X ~ Poisson(2): Var / mean = 25·2 / (5·2) = 5
    assert cluster_size_from_counts(bunches * 5) == pytest.approx(5.0, rel=0.1)
    assert cluster_size_from_counts(bunches) == pytest.approx(1.0, rel=0.1)


# --------------------------------------------------------------------------------------------------
# planned vs simulated, every option, every bundled trace
# --------------------------------------------------------------------------------------------------

# A few representative cells on bounded horizons (start Tuesday 09:00, a busy morning; whole hours: the plan bills
# by the hour): every bundled trace at 3 req/s (where the issue found serverless-only planned 30–138% under and
# chosen over a cheaper floor + burst), the batch-submitting Azure code trace at 0.3 req/s, and 30 req/s on two
# traces. The full table (every trace at 0.3, 3, 30 and 150 req/s, whole days and weeks) is
# benchmarks/bench_cost_model.py; README "Serverless cost" has it with the gaps measured there.
START_H = 33.0
CELLS = [  # (trace, mean req/s, hours)
    ("azure2023_code.csv", 3.0, 3.0), ("azure2023_conv.csv", 3.0, 3.0), ("servegen_m-small_14d_rate.csv", 3.0, 3.0),
    ("mooncake_synthetic.jsonl", 3.0, 3.0), ("azure2023_code.csv", 0.3, 8.0), ("azure2023_conv.csv", 30.0, 1.0),
    ("servegen_m-small_14d_rate.csv", 30.0, 1.0),
]
# Cells the model misses by more than the tolerance at these horizons, as measured (simulated vs planned option
# cost), with the bound they must stay within (so a regression still fails) and the reason; README lists them.
KNOWN_GAPS: dict[tuple[str, float, str], tuple[float, str]] = {
    # batch-submitting clients (README "Serverless cost", measured with benchmarks/cost_gaps.py). At 0.3 req/s the
    # one-hour trace is replayed stretched over 8 hours, so its minute rates run in streaks and most minutes have no
    # request: with the correlation time (123 s), the fix at a minute factor of 0 and the measured share of idle
    # minutes (0.50, traffic.idle_minute_share) the cell went −19.6% → −12.6% → −6.0%, inside the tolerance.
    # at 3 req/s bunches larger than the live containers' slots wait for a cold start (526 requests in these 3 h,
    # up to 144 at once), holding their places c + S₁, not S: a start-up burst at every overflowing bunch, which
    # the model lacks; shuffling minutes changes nothing here (+18.0%)
    # (the idle-minute share reads 0 in these 3 hours: within its count's noise; 0.03 over the week)
    ("azure2023_code.csv", 3.0, "serverless_only"): (0.25, "+14.8%: overflowing bunches wait on cold starts"),
    # the plan's start-up burst (serverless.py step 5) is at the hour's mean rate; ServeGen's rate trace runs
    # the first minutes of 09:00 about a quarter below its hour's mean (21.7 vs 28.7 req/s in the first 30 s),
    # and in a one-hour run from no container that start is most of the bill
    ("servegen_m-small_14d_rate.csv", 30.0, "serverless_only"): (0.25, "−13.7%: start-up burst at the hour's mean rate, the trace's start runs below it"),
}


@pytest.mark.parametrize("trace,rate,hours", CELLS)
def test_planned_bill_matches_the_simulated_one(root, trace, rate, hours):
    # without prod assist's warm minimum for the spike (traffic.spike_warm_hours_fraction): it is held in the
    # profile's busiest hours, outside these windows, yet its price moves the week's decision (at 30 req/s to
    # dedicated_only, which sheds a spike instead); the cells compare the cost model's options on one footing
    from topology import load_inputs

    base = load_inputs(root / "stacks/Pulumi.prod.yaml")
    base = base.model_copy(update={"endpoints": [
        e.model_copy(update={"traffic": e.traffic.model_copy(update={"spike_warm_hours_fraction": 0.0})})
        for e in base.endpoints]})
    rows = check(root / "stacks/Pulumi.prod.yaml", "assist", trace, rate, START_H, START_H + hours, base=base)
    assert rows
    report = "\n".join(
        f"{r.option}: planned ${r.planned_variable_usd:,.0f} simulated ${r.simulated_variable_usd:,.0f} "
        f"({r.variable_error:+.1%}); serverless {r.planned_serverless_usd:,.0f} vs {r.simulated_serverless_usd:,.0f}"
        for r in rows)
    for r in rows:
        tol = KNOWN_GAPS[(trace, rate, r.option)][0] if (trace, rate, r.option) in KNOWN_GAPS else TOLERANCE
        assert abs(r.variable_error) <= tol, report
        # the bill hour by hour (where a gap arises: benchmarks/cost_gaps.py hours) adds up to the span's
        if r.planned_serverless_usd > 0:
            assert len(r.simulated_serverless_usd_by_hour) == len(r.planned_serverless_usd_by_hour) == hours
            assert sum(r.planned_serverless_usd_by_hour) == pytest.approx(r.planned_serverless_usd, rel=1e-9)
            assert sum(r.simulated_serverless_usd_by_hour) == pytest.approx(r.simulated_serverless_usd, abs=0.01)
    # the chosen option is never dearer in simulation than a rejected one by more than the tolerance
    chosen = next(r for r in rows if r.chosen)
    for r in rows:
        assert chosen.simulated_total_usd <= r.simulated_total_usd * (1 + TOLERANCE), report


@pytest.mark.parametrize("mean_inflight", [200.0, 800.0, 3000.0])
def test_a_level_far_below_the_mean_is_switched_on_within_the_minute(mean_inflight):
    """10 req/s, each request in flight mean/10 s, so Poisson(mean) in flight: the first container (level 1) is
    needed unless nothing at all is in flight (P = e^(−mean)), so from off it is switched on by the first arrival,
    within 0.1 s — p_on = 1 − e^(−60 × 10) = 1 a minute — and, held by the hundreds in flight, never stops.
    (Above a mean of 745 both P(N = 0) and P(N < 1) underflow to 0 and the ratio that gives the rate was lost:
    the model took the level as never switching on, p_on = 0.)"""
    rate = np.full((1, 1, 1), 10.0)
    levels = np.array([1.0])
    p_on, p_off, _ = sv._switching(rate, rate * (mean_inflight / 10.0), np.zeros(1), levels, levels, 1.0, 120.0,
                                np.ones(1))
    assert float(p_on[0, 0]) == pytest.approx(1.0, abs=1e-12)
    assert float(p_off[0, 0]) == pytest.approx(0.0, abs=1e-12)
