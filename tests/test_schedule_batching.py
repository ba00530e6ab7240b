"""The planner solves every node group's on/off schedule in one stacked DP call (issue #17): the stacked call
must give each row the answer it gets alone, the answer must be the cheapest schedule (checked against an
exhaustive search where one is possible), and planning many endpoints at once must give each endpoint the
options it gets when planned alone."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from topology import GPU_KINDS, load_inputs
from topology.plan import schedule_dp
from topology.plan.options import prepare_endpoint, prepare_endpoints
from topology.timebase import HOURS_PER_WEEK

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = 8  # 8 blocks of 21 hours: few enough schedules to try them all
BLOCK_H = HOURS_PER_WEEK // BLOCKS


def schedule_cost(run: np.ndarray, idle: np.ndarray, rise: float, on: np.ndarray) -> float:
    """What a schedule costs: run or idle each hour, one rise per start (the week starts stopped)."""
    prev = np.concatenate([[False], on[:-1]])
    return float(np.where(on, run, idle).sum() + rise * (on & ~prev).sum())


def random_rows(rng: np.random.Generator, n: int, forced_fraction: float = 0.1) -> tuple[np.ndarray, ...]:
    run = rng.uniform(1.0, 10.0, (n, HOURS_PER_WEEK))
    idle = rng.uniform(0.0, 12.0, (n, HOURS_PER_WEEK))
    idle[rng.random((n, HOURS_PER_WEEK)) < forced_fraction] = np.inf  # hours the node may not stop
    never_run = rng.random(n) < 0.2  # groups above the node cap never run, so they may always stop
    run[never_run] = np.inf
    idle[never_run] = rng.uniform(0.0, 12.0, (int(never_run.sum()), HOURS_PER_WEEK))
    return run, idle, rng.uniform(0.0, 30.0, n)


def test_stacked_rows_get_the_answer_each_gets_alone():
    rng = np.random.default_rng(17)
    run, idle, rise = random_rows(rng, 60)
    cost, running = schedule_dp(run, idle, rise)
    for i in range(run.shape[0]):
        c1, r1 = schedule_dp(run[i:i + 1], idle[i:i + 1], rise[i:i + 1])
        assert cost[i] == c1[0]  # bit for bit: the plan JSON must not move
        assert np.array_equal(running[i], r1[0])


def test_the_schedule_costs_what_the_dp_says():
    rng = np.random.default_rng(3)
    run, idle, rise = random_rows(rng, 40)
    cost, running = schedule_dp(run, idle, rise)
    for i in range(run.shape[0]):
        if np.isfinite(cost[i]):
            assert schedule_cost(run[i], idle[i], rise[i], running[i]) == pytest.approx(cost[i], rel=1e-12)
        else:  # infeasible only when some hour can neither run nor stop
            assert (np.isinf(run[i]) & np.isinf(idle[i])).any()


def test_the_dp_finds_the_cheapest_schedule_of_an_exhaustive_search():
    """Costs constant within 8 blocks: some cheapest schedule is constant within each block (switching
    inside a block adds rises and saves nothing), so the 256 block schedules contain an optimum."""
    rng = np.random.default_rng(11)
    n = 30
    run_b = rng.uniform(1.0, 10.0, (n, BLOCKS))
    idle_b = rng.uniform(0.0, 12.0, (n, BLOCKS))
    idle_b[rng.random((n, BLOCKS)) < 0.15] = np.inf
    rise = rng.uniform(0.0, 80.0, n)
    run, idle = np.repeat(run_b, BLOCK_H, axis=1), np.repeat(idle_b, BLOCK_H, axis=1)
    cost, running = schedule_dp(run, idle, rise)
    for i in range(n):
        best = min(
            schedule_cost(run[i], idle[i], rise[i], np.repeat(np.array(blocks, bool), BLOCK_H))
            for blocks in itertools.product((False, True), repeat=BLOCKS)
        )
        assert cost[i] == pytest.approx(best, rel=1e-12)
        assert schedule_cost(run[i], idle[i], rise[i], running[i]) == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("stack", ["Pulumi.prod.yaml", "Pulumi.dev.yaml"])
def test_endpoints_planned_together_get_the_options_each_gets_alone(stack):
    inp = load_inputs(ROOT / "stacks" / stack)
    together = prepare_endpoints(inp, GPU_KINDS)
    for ep, t in zip(inp.endpoints, together):
        alone = prepare_endpoint(inp, ep, GPU_KINDS)
        assert [(o.tier, o.feasible, o.reason, o.weekly_usd, o.breakdown_weekly, o.layers) for o in t.options] == \
               [(o.tier, o.feasible, o.reason, o.weekly_usd, o.breakdown_weekly, o.layers) for o in alone.options]
        for a, b in zip(t.options, alone.options):
            assert (a.floor_by_hour is None) == (b.floor_by_hour is None)
            if a.floor_by_hour is not None:
                assert np.array_equal(a.floor_by_hour, b.floor_by_hour)


def test_copies_of_an_endpoint_are_prepared_once_and_each_gets_its_own_options(monkeypatch):
    """Endpoints alike in all but their name (copies per region or tenant) are staged once; each copy gets the
    options the endpoint gets alone, in objects of its own (the platform share is added per endpoint)."""
    from topology.plan import options as options_mod

    inp = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    a, b = inp.endpoints[0], inp.endpoints[1]
    def copy(ep, name):  # a copy serves its own model name (the inputs refuse two endpoints sharing one)
        return ep.model_copy(update={"name": name, "model": ep.model.model_copy(update={"name": f"{name}-model"})})

    eps = [a, b, copy(a, "copy-a"), copy(a, "copy-a2"), copy(b, "copy-b")]
    fleet = inp.model_copy(update={"endpoints": eps})
    staged = []
    real_stage = options_mod._stage_endpoint
    monkeypatch.setattr(options_mod, "_stage_endpoint", lambda i, ep, c: staged.append(ep.name) or real_stage(i, ep, c))
    together = prepare_endpoints(fleet, GPU_KINDS)
    assert staged == [a.name, b.name]
    monkeypatch.setattr(options_mod, "_stage_endpoint", real_stage)
    for ep, t in zip(eps, together):
        alone = prepare_endpoint(inp, a if ep.model.revision == a.model.revision else b, GPU_KINDS)
        assert [(o.tier, o.feasible, o.reason, o.weekly_usd, o.breakdown_weekly, o.layers) for o in t.options] == \
               [(o.tier, o.feasible, o.reason, o.weekly_usd, o.breakdown_weekly, o.layers) for o in alone.options]
    first, copy = together[0].options, together[2].options
    assert all(x is not y and x.breakdown_weekly is not y.breakdown_weekly for x, y in zip(first, copy))
    first[0].breakdown_weekly["extra"] = 1.0
    assert "extra" not in copy[0].breakdown_weekly
