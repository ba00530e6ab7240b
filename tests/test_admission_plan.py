"""The gateway's admission control and the queue trigger, planned together (#10 item 5): the in-flight cap that keeps
the inter-token SLO at full load, the bounded wait, and a KEDA target the bounded queue can reach."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.traffic import lognormal_params
from topology.plan.limits import p99_freed_together, p99_mean_prompt_factor


def test_guard_admission_and_queue_target_hand_worked(planned_stacks):
    """prod guard, a 1g.10gb MIG replica. Decode line: t_min = 7.164 ms, k = 0.620 ms per sequence; the
    neighbours' prefill per token gap at the mean prompt: 700 × (1 − 0.6) / 12,500 tok/s / 8 tokens = 2.80 ms.
    Prompts lognormal (mean 700, p99 3,000): σ = 0.7445, e^σ² − 1 = 0.7408. The mean of 6 neighbours:
    σ₆² = ln(1 + 0.7408/6) = 0.1164, p99 factor exp(−0.0582 + 2.3263 × 0.3412) = 2.086 → gap(7) = 7.164 + 7 ×
    0.620 + 6 × 2.80 × 2.086 = 46.5 ms ≤ 50 ms; of 7: σ₇² = 0.1006, factor 1.989 → gap(8) = 7.164 + 4.960 +
    7 × 2.80 × 1.989 = 51.1 ms > 50 ms. Cap 7 (max_num_seqs 13, the gap at the *mean* prompt).
    Bounded wait, with the prefill queue a request admitted at its end meets: each of the 7 running sequences
    ends at a given decode step with probability 1/8 (mean output 8), so the number ending together is
    Binomial(7, 1/8): P(0) = 0.8750⁷ = 0.3927, P(1) = 7 × 0.125 × 0.8750⁶ = 0.3927, P(2) = 21 × 0.125² ×
    0.8750⁵ = 0.1683, P(3) = 35 × 0.125³ × 0.8750⁴ = 0.0401: P(≤ 2) = 0.9537, P(≤ 3) = 0.9938 → 3 slots freed
    at once at the p99; HAProxy hands all 3 to the queue, and the last new prompt prefills after 2 mean prompts,
    2 × 700 × 0.4 / 12,500 = 44.8 ms. Wait: 0.300 − 0.0448 − 3,000 × 0.4 / 12,500 − 0.0465 = 0.1127 → 0.113 s
    (0.157 s before, with no prefill queue: its worst spike minute missed the bar). At 7 in flight a replica
    serves 1 / (0.0224 + 8 × (7.164 + 4.340) ms / 7) = 28.13 req/s. Little's law: waiting = admitted rate × mean
    wait ≤ 28.13 × 0.113 = 3.2 per replica; just past saturation the waits spread over [0, 0.113] s, a mean of
    1.6 waiting: target max(1, ⌊3.2 / 4⌋) = 1."""
    _, spec = planned_stacks["prod"]
    ep = spec.endpoint("guard")
    assert ep.capacity.usable_concurrency == 13
    assert ep.gateway.admission_inflight_per_floor_replica == 7
    assert ep.gateway.admission_queue_timeout_s == pytest.approx(0.113, abs=0.001)
    assert ep.autoscaling.target_waiting_per_replica == 1
    # the gateway's pick never sends a replica past its maxconn: overflow (none here: dedicated) ≤ the cap
    assert ep.gateway.overflow_inflight_per_replica <= 7


def test_assist_keeps_its_full_batch_under_admission(planned_stacks):
    """prod assist: gap(64) with 63 neighbours at their p99 mean prompt (σ = 0.7758, σ₆₃² = ln(1 + 0.8255/63)
    = 0.0130, factor 1.295): 10.85 + 64 × 0.967 + 63 × 0.125 × 1.295 = 83.0 ms ≤ 100 ms: the cap stays at 64.
    Sequences ending at one decode step: Binomial(64, 1/400), P(0) = 0.9975⁶⁴ = 0.8520, P(1) = 64 × 0.0025 ×
    0.9975⁶³ = 0.1367, P(≤ 1) = 0.9888 < 0.99, P(2) = 2,016 × 0.0025² × 0.9975⁶² = 0.0108 → 2 at the p99: one
    mean prompt ahead, 2,000 × 0.7 / 28,000 = 0.050 s. Bounded wait 2.5 − 0.050 − 9,000 × 0.7 / 28,000 − 0.083
    = 2.142 s; μ = 1.982 req/s → μ·w/4 = 1.06 → target 1."""
    _, spec = planned_stacks["prod"]
    ep = spec.endpoint("assist")
    assert ep.gateway.admission_inflight_per_floor_replica == 64
    assert ep.gateway.admission_queue_timeout_s == pytest.approx(2.142, abs=0.001)
    assert ep.autoscaling.target_waiting_per_replica == 1


@pytest.mark.parametrize("mean,p99,n", [(700, 3000, 6), (700, 3000, 12), (2000, 9000, 63), (2000, 9000, 1)])
def test_p99_of_the_neighbours_mean_prompt_matches_sampling(mean, p99, n):
    """Fenton–Wilkinson's factor against the p99 of the mean of n prompts drawn as the simulator draws them
    (simulator/traffic.py's lognormal fit), 200,000 batches: within 2% (it reads 1–1.5% low: the sum's upper
    tail is a little heavier than the lognormal it is matched to)."""
    mu, sigma = lognormal_params(mean, p99)
    rng = np.random.default_rng(7)
    means = rng.lognormal(mu, sigma, size=(200_000, n)).mean(axis=1)
    sampled = float(np.quantile(means, 0.99)) / mean
    assert p99_mean_prompt_factor(mean, p99, n) == pytest.approx(sampled, rel=0.02)


@pytest.mark.parametrize("batch,output_mean", [(7, 8.0), (43, 60.0), (64, 400.0), (13, 1.0)])
def test_p99_of_the_slots_a_full_replica_frees_at_one_step_matches_sampling(batch, output_mean):
    """The sequences of a full replica that end at the same decode step, sampled: each running sequence draws a
    geometric output of mean ō (the number of steps until it ends) — the count ending at step one, over 200,000
    replicas, has the p99 p99_freed_together names (every one of them when each output is a single token)."""
    rng = np.random.default_rng(3)
    ends_now = (rng.geometric(1.0 / output_mean, size=(200_000, batch)) == 1).sum(axis=1)
    assert p99_freed_together(batch, output_mean) == max(1, int(np.quantile(ends_now, 0.99, method="higher")))


def test_queue_target_is_reachable_by_a_saturated_replicas_bounded_queue(stack):
    """Little's law under admission: waiting per replica = admitted rate × mean wait, the wait ≤ the bounded wait
    w, the rate ≤ μ, what a replica held at the admission cap b serves: b sequences, each taking its prefill plus
    ō token gaps of t_min + b·k + (b − 1)·p̄/ō (the simulator's replica). Just past saturation the waits spread
    over [0, w]: about μ·w/2 waiting. A target above that never fires (the old guard target 3 against 2.97):
    every floor endpoint's target is at most half of it, or 1 (a single waiting request per replica)."""
    _, inputs, spec = stack
    for ep in spec.endpoints:
        if ep.autoscaling is None:
            continue
        s = next(e for e in inputs.endpoints if e.name == ep.name).shape
        c, b = ep.capacity, ep.gateway.admission_inflight_per_floor_replica
        prefill_s = s.input_tokens_mean * (1 - ep.planned_prefix_cache_hit_fraction) / c.prefill_tokens_per_s
        gap_s = c.decode_step_floor_s + b * c.decode_step_s_per_sequence + (b - 1) * prefill_s / s.output_tokens_mean
        mu = b / (prefill_s + s.output_tokens_mean * gap_s)
        mean_queue = mu * ep.gateway.admission_queue_timeout_s / 2
        assert ep.autoscaling.target_waiting_per_replica <= max(1.0, mean_queue / 2), ep.name


def test_assist_keeps_burst_warm_for_the_spike_in_its_busiest_hours_hand_worked(planned_stacks, prod_unwarmed):
    """prod assist, Fri 20:00 (its busiest hour: 19.52 req/s mean × the 1.5 within-hour peak = 29.29 req/s).
    Service times from the decode line (t_min 10.85 ms, k 0.967 ms per sequence, prefill 2,000 × 0.7 / 28,000
    = 0.050 s, so 0.125 ms of neighbours' prefill per token gap), 400 tokens out:
      floor at its overflow threshold 49: 0.050 + 400 × (10.851 + 49 × 0.9668 + 48 × 0.125) ms = 25.74 s, so
      8 replicas × 49 carry 15.23 req/s; a container at target 49 also 25.74 s, at max_inputs 64:
      0.050 + 400 × (10.851 + 64 × 0.9668 + 63 × 0.125) ms = 32.29 s.
    To burst: 29.29 − 15.23 = 14.06 req/s before, 3 × 29.29 − 15.23 = 72.63 under the spike: in flight from
    14.06 × 25.74 = 362 rising 58.57/s to 72.63 × 32.29 = 2,345. Launches (target 49, 64 places each) catch up
    only past 58.57 × 25 × 49 / 15 = 4,783 in flight, beyond 2,345: every place must be warm, ⌈2,345 / 64⌉ = 37
    containers, at most the cap 24. The 17 busiest hours (0.1 × 168, rounded up) hold it; the price is what
    the plan's own serverless bill adds over the same plan without it, and it decides nothing here."""
    inputs, spec = planned_stacks["prod"]
    ep = spec.endpoint("assist")
    b = ep.burst
    assert next(e for e in inputs.endpoints if e.name == "assist").traffic.spike_warm_hours_fraction == 0.1
    d = next(d for d in ep.derivations if d.figure == "spike_warm_containers")
    assert d.value == 24
    for figure in ("p 29.29 req/s", "carries 15.23", "14.06 → 72.63", "in flight to burst 362 rising 58.57/s to 2,345",
                   "⌈2,345 / 64⌉ = 37"):
        assert figure in d.formula, (figure, d.formula)
    assert len(b.spike_warm_hours_of_week) == 17 and 116 in b.spike_warm_hours_of_week
    # the hours are the busiest by the profile: none outside them is busier than the quietest inside
    rate = np.asarray(next(e for e in inputs.endpoints if e.name == "assist").traffic.hourly_mean_requests_per_s)
    inside = rate[list(b.spike_warm_hours_of_week)]
    outside = np.delete(rate, list(b.spike_warm_hours_of_week))
    assert outside.max() <= inside.min()
    # priced: the plan's monthly cost is the plan without the warm minimum plus its stated price (same floor)
    _, unwarmed = prod_unwarmed
    u = unwarmed.endpoint("assist")
    assert u.floor.replicas_by_hour == ep.floor.replicas_by_hour and u.tier == ep.tier == "floor_plus_burst"
    assert b.spike_warm_usd_per_month > 0
    assert ep.monthly_usd == pytest.approx(u.monthly_usd + b.spike_warm_usd_per_month, abs=1.0)
    # the decision still stands, priced: dedicated_only costs more
    ded = next(a for a in ep.alternatives if a.option == "dedicated_only")
    assert ded.monthly_usd > ep.monthly_usd


def test_level_windows_hand_worked():
    """A minimum of 1 at Mon 05:00, 24 at Mon 20:00–22:00 then 1 until 23:00, 0 elsewhere, with a 25 s restore
    (a 1-minute lead): base 0; 05:00 rises from 0 → 04:59–06:00 at 1; 20:00 rises → 19:59–22:00 at 24; 22:00
    falls to 1 → 22:00–23:00 at 1, no lead (the 24 window covers the minute before)."""
    from topology.spec import MinContainersWindow
    from topology.windows import level_windows

    levels = [0] * 168
    levels[5] = 1
    levels[20] = levels[21] = 24
    levels[22] = 1
    base, windows = level_windows(levels, 25.0)
    assert base == 0
    assert windows == (MinContainersWindow(start_minute_of_week=299, end_minute_of_week=360, min_containers=1),
                       MinContainersWindow(start_minute_of_week=1199, end_minute_of_week=1320, min_containers=24),
                       MinContainersWindow(start_minute_of_week=1320, end_minute_of_week=1380, min_containers=1))
    assert level_windows([3] * 168, 25.0) == (3, ())  # constant: min_containers alone


def test_serverless_only_keeps_its_containers_warm_for_the_spike_and_pays_for_it(planned_stacks):
    """dev assist (serverless only, no floor: everything the spike brings lands on burst) asked to keep burst warm
    in its busiest 10% of hours: the 17 busiest hours of its profile, a minimum of at least one container there
    in the deployed schedule (the derivation's figure in its busiest), and a price that is exactly what its monthly cost gains over the same plan without."""
    from topology import plan

    inputs, spec = planned_stacks["dev"]
    assert spec.endpoint("assist").tier == "serverless_only" and spec.endpoint("assist").burst.spike_warm_hours_of_week == ()
    eps = [e.model_copy(update={"traffic": e.traffic.model_copy(update={"spike_warm_hours_fraction": 0.1})})
           if e.name == "assist" else e for e in inputs.endpoints]
    warmed = plan(inputs.model_copy(update={"endpoints": eps})).endpoint("assist")
    b = warmed.burst
    assert warmed.tier == "serverless_only" and len(b.spike_warm_hours_of_week) == 17
    rate = np.asarray(next(e for e in inputs.endpoints if e.name == "assist").traffic.hourly_mean_requests_per_s)
    assert np.delete(rate, list(b.spike_warm_hours_of_week)).max() <= rate[list(b.spike_warm_hours_of_week)].min()
    minimum = []
    for h in b.spike_warm_hours_of_week:
        minute = h * 60 + 30
        held = [w.min_containers for w in b.min_containers_schedule
                if (minute - w.start_minute_of_week) % 10080 < (w.end_minute_of_week - w.start_minute_of_week) % 10080]
        minimum.append(max([b.min_containers, *held]))
    d = next(d for d in warmed.derivations if d.figure == "spike_warm_containers")
    assert min(minimum) >= 1 and max(minimum) == d.value
    assert b.spike_warm_usd_per_month > 0
    assert warmed.monthly_usd == pytest.approx(spec.endpoint("assist").monthly_usd + b.spike_warm_usd_per_month, abs=1.0)
