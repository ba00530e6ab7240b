"""The doctrine's worked example, reproduced to two significant figures by the GPU-time-per-request method."""

import pytest

from topology import costs


def sig2(x: float) -> float:
    return float(f"{x:.2g}")


def test_worked_example_gpu_seconds_and_dollars_per_request():
    # 70B FP8, 2,000 in / 400 out, 460 decode tok/s, 15,000 prefill tok/s, $2.50/GPU-h, API $0.90/M flat
    gpu_s = costs.gpu_seconds_per_request(2000, 400, 460, 15000)
    assert sig2(gpu_s) == 1.0
    dedicated = costs.dedicated_usd_per_request(gpu_s, 2.50)
    assert sig2(dedicated) == 0.00070  # $0.00069..0.00070 — the doctrine rounds GPU-s to 1.0 first
    assert dedicated == pytest.approx(0.00069, rel=0.02)
    api = costs.api_usd_per_request(2000, 400, 0.90, 0.90)
    assert sig2(api) == 0.0022 and api == pytest.approx(0.00216)
    assert sig2(costs.break_even_duty_cycle(dedicated, api)) == 0.32


def test_serverless_break_even_busy_hours():
    # 2× premium → 12 busy h/day, 3× → 8
    on_demand = 2.50
    for premium, hours in ((2, 12), (3, 8)):
        per_s = on_demand * premium / 3600
        p = costs.serverless_premium(per_s, on_demand)
        assert p == pytest.approx(premium)
        assert costs.serverless_break_even_busy_hours_per_day(p) == pytest.approx(hours)


def test_output_heavy_shapes_push_break_even_up_and_prefix_hits_push_it_down():
    api = lambda i, o: costs.api_usd_per_request(i, o, 0.9, 0.9)  # noqa: E731
    base = costs.break_even_duty_cycle(costs.dedicated_usd_per_request(costs.gpu_seconds_per_request(2000, 400, 460, 15000), 2.5), api(2000, 400))
    heavy = costs.break_even_duty_cycle(costs.dedicated_usd_per_request(costs.gpu_seconds_per_request(400, 2000, 460, 15000), 2.5), api(400, 2000))
    cached = costs.break_even_duty_cycle(
        costs.dedicated_usd_per_request(costs.gpu_seconds_per_request(2000, 400, 460, 15000, prefix_cache_hit_fraction=0.5), 2.5),
        api(2000, 400),
    )
    reserved = costs.break_even_duty_cycle(costs.dedicated_usd_per_request(costs.gpu_seconds_per_request(2000, 400, 460, 15000), 2.5 * 0.65), api(2000, 400))
    assert heavy > base > cached
    assert reserved < base


def test_tensor_parallel_replica_costs_all_its_gpus():
    one = costs.gpu_seconds_per_request(2000, 400, 460, 15000, gpus_per_replica=1)
    two = costs.gpu_seconds_per_request(2000, 400, 920, 30000, gpus_per_replica=2)
    assert two == pytest.approx(one)


def test_cyclic_runs_join_across_the_week_boundary():
    active = [False] * 168
    for h in list(range(160, 168)) + list(range(0, 4)):
        active[h] = True
    assert costs.cyclic_runs(active) == [(160, 12)]
    assert costs.cyclic_runs([True] * 168) == [(0, 168)]
    assert costs.cyclic_runs([False] * 168) == []


def test_monthly_is_730_hours():
    """A month is 8,760 h / 12 = 730 h: an H100 on demand all week at $2.69/h ($451.92/week) is
    2.69 × 730 = $1,963.70/month, and a week is 730 / 168 = 4.3452 of a month."""
    assert costs.monthly_from_weekly(168.0) == pytest.approx(730.0)
    assert costs.monthly_from_weekly(2.69 * 168) == pytest.approx(1963.70, abs=0.005)
    assert costs.WEEKS_PER_MONTH == pytest.approx(4.3452, abs=1e-4)
