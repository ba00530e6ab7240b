"""The per-token inter-token gap the engine's ITL histogram records (topology/plan/limits.py token_gap_p99),
checked against a step-by-step replay of vLLM 0.11's scheduling (an independent model, not the formula): each
engine step carries every running decode and, from a FIFO queue of prompts, up to (token budget − running) prompt
tokens, several prompts packed into one step's budget as vLLM's V1 scheduler does (vllm/v1/core/sched/scheduler.py:
a step schedules the running requests, then waiting ones while the token budget lasts; chunked prefill on). A step
takes t(b) + its prompt tokens / prefill rate, and each running sequence's token waits that long."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from topology import GPU_KINDS
from topology.plan.limits import default_step_token_budget, token_gap_p99
from topology.plan.placement import placements
from topology.token_shape import lognormal_params


def replay_steps(ep, pl, batch: int, seconds: float, seed: int) -> tuple[float, float]:
    """(p99 of the per-token gap, share of steps with prompt tokens) over `seconds` of Poisson arrivals."""
    rng = np.random.default_rng(seed)
    h, s = ep.prefix_cache_hit_fraction, ep.shape
    mu, sig = lognormal_params(s.input_tokens_mean * (1 - h), s.input_tokens_p99 * (1 - h))
    n = rng.poisson(pl.planning_rps * seconds)
    arrive = np.sort(rng.uniform(0, seconds, n))
    prompt = np.maximum(np.exp(mu + sig * rng.standard_normal(n)), 1.0)
    t_b = pl.decode_step_floor_s + batch * pl.decode_step_s_per_sequence
    room = default_step_token_budget(pl) - batch
    queue: deque[float] = deque()
    i, t, gaps = 0, 0.0, []
    while t < seconds:
        while i < n and arrive[i] <= t:
            queue.append(float(prompt[i]))
            i += 1
        budget, chunk = room, 0.0
        while queue and budget > 0:
            take = min(queue[0], budget)
            queue[0] -= take
            budget -= take
            chunk += take
            if queue[0] <= 1e-9:
                queue.popleft()
        d = t_b + chunk / pl.prefill_tokens_per_s
        gaps.append(d)
        t += d
    g = np.asarray(gaps)
    return float(np.quantile(g, 0.99)), float(np.mean(g > t_b))


def _prod_placements(planned_stacks):
    inputs, _ = planned_stacks["prod"]
    for ep in inputs.endpoints:
        ok, _ = placements(ep, GPU_KINDS)
        for pl in ok[:2]:
            yield ep, pl


def test_the_plans_token_gap_is_a_lower_bound_tight_while_prefill_is_light(planned_stacks):
    checked = 0
    for ep, pl in _prod_placements(planned_stacks):
        b = pl.planned_inflight
        est = token_gap_p99(ep, pl, b)
        p99, share = replay_steps(ep, pl, b, seconds=3000, seed=1)
        assert est.p99_s <= p99 * 1.03, (ep.name, pl.label, est.p99_s, p99)  # never above the replay
        if share < 0.15:  # prompts rarely queue: the estimate's one-prompt-a-step holds
            assert est.p99_s == pytest.approx(p99, rel=0.06), (ep.name, pl.label)
            assert est.stalled_share == pytest.approx(share, rel=0.15)
            checked += 1
    assert checked >= 2  # prod assist on 2×H100, autocomplete on 2g.20gb


def test_without_prompts_to_prefill_the_gap_is_the_decode_step(planned_stacks):
    inputs, _ = planned_stacks["prod"]
    ep = inputs.endpoints[0]
    pl = placements(ep, GPU_KINDS)[0][0]
    cached = ep.model_copy(update={"prefix_cache_hit_fraction": 0.999999})  # a token a prompt left to prefill
    g = token_gap_p99(cached, pl, pl.planned_inflight)
    assert g.p99_s == pytest.approx(pl.decode_step_floor_s + pl.planned_inflight * pl.decode_step_s_per_sequence,
                                    rel=0.01)


def test_a_replica_that_cannot_prefill_one_prompt_a_step_is_flagged_not_bounded(planned_stacks):
    """guard on a whole H100 (prod's rejected placement): prompts arrive faster than one a step can prefill, the
    one-prompt estimate saturates (30 ms) while the replay packs them into 72 ms steps; the plan says the gap lies
    between that and a full step's budget, not that the SLO holds."""
    inputs, _ = planned_stacks["prod"]
    ep = next(e for e in inputs.endpoints if e.name == "guard")
    pl = next(p for p in placements(ep, GPU_KINDS)[0] if p.mig_profile is None)
    g = token_gap_p99(ep, pl, pl.planned_inflight)
    p99, _ = replay_steps(ep, pl, pl.planned_inflight, seconds=600, seed=2)
    assert g.saturated and g.p99_s < p99
    packed = g.step_s + (default_step_token_budget(pl) - pl.planned_inflight) / pl.prefill_tokens_per_s
    assert p99 <= packed and g.warning is not None and f"and {packed * 1000:.0f} ms" in g.warning


def test_the_plan_says_when_the_per_token_alert_will_read_the_slo_as_breached(planned_stacks):
    _, spec = planned_stacks["prod"]
    for e in spec.endpoints:
        d = next(x for x in e.derivations if x.figure == "token_gap_p99_ms")
        warned = [w for w in e.warnings if "per-token gap p99" in w]
        if "saturated" not in d.formula:  # (a saturated estimate warns on its range: the test above)
            assert bool(warned) == (d.value > e.slo_inter_token_p99_ms), e.name
        if warned:
            assert "VllmInterTokenSloBreach" in warned[0] and "lower bound" in d.formula


def test_the_engine_runs_the_step_budget_the_estimate_assumes(planned_stacks):
    """The budget is pinned (--max-num-batched-tokens): vLLM's _set_default_args rule on the memory the replica's
    engine has per GPU (the slice's on MIG, where vLLM itself would read the parent GPU's through NVML or fall back
    to 2,048), never below max_num_seqs (vLLM refuses that); the burst container's by its own GPU."""
    from tests import vllm_max_tokens as V

    seen = set()
    for name in planned_stacks:
        inputs, spec = planned_stacks[name]
        for e in spec.endpoints:
            ep = next(x for x in inputs.endpoints if x.name == e.name)
            pl = next(p for p in placements(ep, GPU_KINDS)[0]
                      if p.gpu_kind == e.capacity.gpu_kind and p.mig_profile == e.capacity.mig_profile
                      and p.gpus_per_replica == e.capacity.gpus_per_replica)
            device_bytes = int(pl.memory_gb / pl.gpus_per_replica * 1e9)
            want = max(V.default_max_num_batched_tokens(device_bytes, pl.gpu_kind), e.engine.max_num_seqs)
            args = e.engine.vllm_args("/m")
            assert int(args[args.index("--max-num-batched-tokens") + 1]) == want == e.engine.max_num_batched_tokens
            seen.add(want)
    assert seen == {2048, 8192}  # a MIG slice (prod guard) and whole H100s


def test_the_simulated_week_says_its_itl_is_a_mean_and_what_the_alert_reads(planned_stacks):
    """The simulator records each request's mean gap; its summary names the plan's per-token bound beside it."""
    from simulator.simulate import simulate_endpoint, summary, SimResult

    inputs, spec = planned_stacks["prod"]
    r = simulate_endpoint(inputs, spec, "assist", seed=0, start_h=9, end_h=9.1)
    bound = next(d.value for d in spec.endpoint("assist").derivations if d.figure == "token_gap_p99_ms") / 1000
    assert r.token_gap_p99_s == pytest.approx(bound) and r.itl_p99_s < r.itl_slo_s < bound
    text = summary(SimResult(environment="prod", source="test", seed=0, endpoints=(r,)))
    assert "assist: ITL here is each request's mean gap" in text and "VllmInterTokenSloBreach" in text


def test_a_mig_floor_and_a_whole_gpu_burst_run_their_own_step_budgets(planned_stacks):
    """The engine spec is shared by the tiers; the burst container's budget is its own GPU's (a whole H100: 8,192)
    even when the floor's is a MIG slice's (2,048)."""
    from modal_apps import settings as S

    _, spec = planned_stacks["prod"]
    e = spec.endpoint("assist")
    assert e.burst.max_num_batched_tokens == 8192
    mig_floor = e.model_copy(update={"engine": e.engine.model_copy(update={"max_num_batched_tokens": 2048})})
    settings = S.build_settings(S.BurstAppConfig.from_endpoint(mig_floor))
    floor_args = mig_floor.engine.vllm_args(settings.model_path)
    burst_args = list(settings.engine_command)
    assert floor_args[floor_args.index("--max-num-batched-tokens") + 1] == "2048"
    assert burst_args[burst_args.index("--max-num-batched-tokens") + 1] == "8192"
    # everything else on the two command lines is the same
    i, j = floor_args.index("--max-num-batched-tokens"), burst_args.index("--max-num-batched-tokens")
    assert floor_args[:i] == burst_args[:j] and floor_args[i + 2:] == burst_args[j + 2:]
