"""Long prompts, the KV cache, spike admission and Modal's web-request cap (#10 items 2, 5; #12 item 5)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.drills import spike
from simulator.engine import Engine, EndpointSim, Overrides
from simulator.simulate import simulate_endpoint
from simulator.traffic import Chunk, Spike, load_trace
from topology.plan.limits import MODAL_WEB_REQUEST_CAP_S, non_streamed_burst_rule
from topology.plan.placement import Placement


def _one_replica(planned_stacks, cap_tokens: float):
    inputs, spec = planned_stacks["prod"]
    eng = Engine(slots=8, prefill_tokens_per_s=1e9, t_min=0.01, k=0.0, interference=0.0,
                 kv_capacity_tokens=cap_tokens, gpus=1.0)
    ep_in = next(e for e in inputs.endpoints if e.name == "guard")
    return EndpointSim(inputs, ep_in, spec.endpoint("guard"), 0.0, 3600.0, np.random.default_rng(0),
                       Overrides(engine=eng, fixed_replicas=1))


def test_kv_overflow_preempts_the_newest_and_it_recomputes_hand_worked(planned_stacks):
    """Four 900-token prompts × 300 tokens out on one replica with a 4,000-token KV cache, a 10 ms step at any
    batch, prefill instant. By hand (vLLM v1 FCFS): all four fit at admission (3,600); each step adds 4 tokens,
    so after 100 steps (1.0 s) the cache is full and the newest is preempted with 100 tokens generated. The
    other three finish at 3.0 s; it comes back, recomputes 900 + 100 tokens and decodes its last 200 alone:
    done at 3.0 + 200 × 0.01 = 5.0 s."""
    sim = _one_replica(planned_stacks, 4_000)
    t = np.array([0.0, 1e-6, 2e-6, 3e-6])
    sim.feed(Chunk(t, np.full(4, 900.0), np.full(4, 300.0)), 15.0, 15.0)
    assert sim.preemptions == 1
    assert sim.recomputed_tokens == pytest.approx(1000, abs=2)
    last = max(f for f, *_ in sim.done)
    assert last == pytest.approx(5.0, abs=0.02)
    # the same four with 50 tokens out fit at full length (4 × 950 ≤ 4,000): nothing is preempted
    fits = _one_replica(planned_stacks, 4_000)
    fits.feed(Chunk(t, np.full(4, 900.0), np.full(4, 50.0)), 15.0, 15.0)
    assert fits.preemptions == 0


def test_a_prompt_waits_for_kv_blocks_when_the_cache_is_full(planned_stacks):
    """Two 3,000-token prompts, 100 tokens out, 4,000-token cache: the second does not fit beside the first
    (3,000 + 3,000 > 4,000) though a slot is free, so it starts when the first finishes at 1.0 s."""
    sim = _one_replica(planned_stacks, 4_000)
    sim.feed(Chunk(np.array([0.0, 1e-6]), np.full(2, 3000.0), np.full(2, 100.0)), 15.0, 15.0)
    assert sim.kv_admission_waits == 1 and sim.preemptions == 0
    assert max(f for f, *_ in sim.done) == pytest.approx(2.0, abs=0.02)


def test_mooncake_replay_with_raw_tokens_reports_rejections_and_preemptions(planned_stacks, root):
    """prod assist at its planned 3× spike for 15 minutes of Friday's peak, Mooncake prompts as they are: the
    prompts of 16,384 tokens (the product limit) or more are refused (413/400) and counted, as vLLM does; the rest
    overflow replicas' KV caches and are preempted; nothing is silently served."""
    inputs, spec = planned_stacks["prod"]
    trace = load_trace(root / "traces" / "mooncake_synthetic.jsonl")
    r = simulate_endpoint(inputs, spec, "assist", seed=0, trace=trace, start_h=116.0, end_h=116.25,
                          raw_tokens=True, rate_scale=3.0)
    refused = r.too_long_413 + r.too_long_400
    # the trace's share at or over the limit (vLLM refuses a prompt of max_model_len tokens or more), counted
    # independently of the simulator
    share = float(np.mean(trace.input_tokens >= 16384))
    assert refused / r.requests == pytest.approx(share, abs=0.03)
    assert r.too_long_413 > 0 and r.too_long_400 > 0
    assert r.preemptions > 0 and r.recomputed_tokens > 0
    assert r.goodput <= 1 - refused / r.requests  # refused requests are misses, not silently served
    scaled = simulate_endpoint(inputs, spec, "assist", seed=0, trace=trace, start_h=116.0, end_h=116.25,
                               raw_tokens=False, rate_scale=3.0)
    assert scaled.too_long_413 + scaled.too_long_400 == 0  # scaled to the shape: nothing over the limit


def test_what_the_replay_refuses_or_clips_is_what_vllm_does(planned_stacks):
    """Prompts and outputs around prod assist's 16,384-token limit, without a client max_tokens (the gateway leaves
    the cap to the engine): refused exactly where vLLM 0.11.0's own check refuses, and each served output the
    tokens vLLM lets it generate (tests/vllm_max_tokens.py, copied from its source)."""
    from simulator.traffic import over_limit_status
    from tests import vllm_max_tokens as V

    inputs, spec = planned_stacks["prod"]
    ep = next(e for e in inputs.endpoints if e.name == "assist")
    limit, cap = ep.shape.product_max_context_tokens, ep.shape.max_tokens
    rng = np.random.default_rng(5)
    ins = np.concatenate([rng.integers(1, limit + 600, 4000), [limit - 1, limit, limit + 1, limit - cap, limit - cap + 1]])
    outs = np.minimum(rng.integers(1, 3 * cap, ins.size), cap)  # generation stops at the cap or on its own
    status, fitted = over_limit_status(ep, None, ins.astype(float), outs.astype(float))
    for i, o, st, f in zip(ins.tolist(), outs.tolist(), status.tolist(), fitted.tolist()):
        try:
            V.validate_input(i, None, limit)
        except ValueError:
            assert st == 400, (i, o)
            continue
        assert st == 0 and f == min(o, V.get_max_tokens(limit, None, i, cap)), (i, o, f)
    assert (status == 400).sum() > 0 and ((status == 0) & (fitted < outs)).sum() > 0  # both cases exercised


def _guard_sim(planned_stacks, replicas: int, engine: Engine | None = None) -> EndpointSim:
    inputs, spec = planned_stacks["prod"]
    ep_in = next(e for e in inputs.endpoints if e.name == "guard")
    return EndpointSim(inputs, ep_in, spec.endpoint("guard"), 0.0, 3600.0, np.random.default_rng(0),
                       Overrides(admission=True, engine=engine, fixed_replicas=replicas))


def test_a_floor_replica_holds_the_gateways_admission_cap_hand_worked(planned_stacks):
    """prod guard: the gateway holds a replica at admission_inflight_per_floor_replica (7, HAProxy's per-server
    maxconn) though vLLM runs 13 (max_num_seqs). Thirteen requests at once on one replica, 2,000 tokens out
    (seconds each): 7 start, the other 6 would wait seconds for a slot, past the 0.113 s bounded wait, so each
    gets 429. With the replica's 13 sequence slots (the engine before) all 13 started and none was shed."""
    inputs, spec = planned_stacks["prod"]
    g = spec.endpoint("guard").gateway
    assert (g.admission_inflight_per_floor_replica, spec.endpoint("guard").capacity.usable_concurrency) == (7, 13)
    sim = _guard_sim(planned_stacks, 1)
    t = np.arange(13) * 1e-6
    sim.feed(Chunk(t, np.full(13, 100.0), np.full(13, 2000.0)), 15.0, 15.0)
    assert sim.n_shed == 6 and sim.n_floor == 7
    assert max(sim.f_inflight) == 7


def test_a_full_replica_hands_the_request_to_the_first_slot_to_free_on_any_replica(planned_stacks):
    """HAProxy's backend queue gives a waiting request to the first server with a free connection, not to the
    one the pick tried. Two replicas held at 7 (a 10 ms token step at any batch, instant prefill): 14 requests
    alternate between them, replica 1's with 5 tokens out (done at 0.05 s), replica 0's with 1,000 (10 s).
    A 15th at 0.01 s finds both full; replica 1's first slot frees at 0.05 s, within the 0.113 s bounded wait:
    served with TTFT 0.04 s wait + one 10 ms step = 0.05 s. Waiting on replica 0 (the least-loaded pick, first
    in order) it would have waited 10 s and been shed."""
    eng = Engine(slots=7, prefill_tokens_per_s=1e9, t_min=0.01, k=0.0, interference=0.0,
                 kv_capacity_tokens=1e9, gpus=1.0)
    sim = _guard_sim(planned_stacks, 2, eng)
    out = np.array([1000.0, 5.0] * 7 + [5.0])
    t = np.r_[np.arange(14) * 1e-6, 0.01]
    ttft = []
    orig = sim._record
    sim._record = lambda a, tt, itl, fl: (ttft.append(tt.copy()), orig(a, tt, itl, fl))
    sim.feed(Chunk(t, np.full(15, 10.0), out), 15.0, 15.0)
    assert sim.n_shed == 0
    assert ttft[0][14] == pytest.approx(0.05, abs=1e-3)


def _assist_at_burst_cap(stack, burst_inflight: int):
    """prod (inputs, spec) with assist's burst cap (admission_burst_inflight) replaced: 0 = no cap (no burst_full acl)."""
    inputs, spec = stack
    eps = tuple(e.model_copy(update={"gateway": e.gateway.model_copy(update={"admission_burst_inflight": burst_inflight})})
                if e.name == "assist" else e for e in spec.endpoints)
    return inputs, spec.model_copy(update={"endpoints": eps})


def test_burst_below_its_cap_waits_for_restoring_containers_and_is_not_shed(prod_unwarmed):
    """The gateway cannot see Modal's containers: below its in-flight cap to burst it sends every request there,
    and one that lands on a restoring container waits at Modal for the 25 s restore, past the gateway's 2.142 s
    bounded wait, and is served, not shed. prod assist's first 6 minutes at Friday's peak (burst cold, in flight
    to burst ≤ 243 against its cap of 1,536): requests wait on starting containers, TTFT passes the bounded
    wait, nothing is shed. (The engine before shed them at Modal when their slot wait passed the bounded wait.)
    Planned with no burst kept warm for the spike: prod keeps Friday 20:00 warm (tests/test_drills.py)."""
    inputs, spec = prod_unwarmed
    g = spec.endpoint("assist").gateway
    ov = Overrides(admission=True, focus=(116.0 * 3600, 116.1 * 3600))
    r = simulate_endpoint(inputs, spec, "assist", seed=0, start_h=116.0, end_h=116.1, overrides=ov)
    assert r.requests_waiting_on_cold_container > 0
    assert r.focus_ttft_max_s > g.admission_queue_timeout_s
    assert r.shed == 0


def test_floor_and_burst_full_wait_in_the_gateways_queue_then_429(prod_unwarmed):
    """At 3× Friday's peak, in flight to burst reaches its cap (24 containers × 64 inputs): from there a request
    the floor pick cannot place waits in HAProxy's queue for a floor slot and gets 429 past the bounded wait.
    With no burst cap (admission_burst_inflight 0: no burst_full acl) the gateway sends all of them to burst and
    sheds nothing: every 429 is the burst cap's. (Planned with no burst kept warm for the spike; non-streamed
    requests capped on burst at the plan's fit, so every request may go there: under the plan's floor_only
    they wait for the floor whatever the burst cap.)"""
    kw = dict(seed=0, start_h=116.0, end_h=116.1, rate_scale=3.0)
    inputs, spec = prod_unwarmed
    spec = _with_rule(spec, "cap_max_tokens", _planned_fit(spec))
    capped = simulate_endpoint(inputs, spec, "assist", overrides=Overrides(admission=True), **kw)
    i2, s2 = _assist_at_burst_cap((inputs, spec), 0)
    uncapped = simulate_endpoint(i2, s2, "assist", overrides=Overrides(admission=True), **kw)
    assert capped.shed > 0 and uncapped.shed == 0
    assert uncapped.burst_queue_peak > capped.burst_queue_peak


def test_spike_drill_states_the_shed_share_and_where_admitted_requests_miss(prod_unwarmed):
    """prod assist, 3× for 10 minutes at the peak, planned with no burst kept warm for the spike: nothing is shed
    (past the burst cap the floor's spare connections take the rest within the bounded wait), so goodput of all
    requests is the admitted goodput; it misses the 99% bar only in spike minute 1, on burst restores (the plan
    keeps that hour warm: tests/test_drills.py)."""
    inputs, spec = prod_unwarmed
    r = spike(inputs, spec, "assist", factor=3.0, minutes=10.0)
    adm_base, adm_spike = r.values["admitted goodput (window)"]
    shed_base, shed_spike = r.values["shed with 429 (window)"]
    assert shed_base == shed_spike == 0 and "0.00% shed" in r.finding
    assert r.values["goodput (window)"][1] == adm_spike < adm_base
    assert "minute 1, while burst containers restore" in r.finding


def _placement(decode_tok_s: float, seqs: int) -> Placement:
    return Placement(gpu_kind="H100", mig_profile=None, gpus_per_replica=4, replicas_per_gpu=1,
                     decode_tokens_per_s=decode_tok_s, prefill_tokens_per_s=28_000, measured_max_seqs=seqs,
                     usable_concurrency=seqs, memory_gb=320, kv_capacity_tokens=2e5, decode_step_floor_s=0.02,
                     saturated_rps=1.0, slo_utilisation=0.8, planning_utilisation=0.75, planning_rps=1.0,
                     gpu_s_per_request=1.0, estimated=False, instance_type="p5.48xlarge", gpus_per_node=8,
                     local_nvme_gb=0)


def test_non_streamed_burst_rule_hand_worked(planned_stacks):
    """prod assist's burst container at its 64 sequences: decode step 64 / 880 tok/s = 72.73 ms, plus the other
    63 sequences' prefill amortised over their output, 63 × 2,000 × (1 − 0.3) / 28,000 tok/s / 400 = 7.875 ms:
    a token every 80.60 ms. Before its first token a request waits up to the 2.5 s TTFT budget on a ready
    container, or — landing on one still restoring — the 25 s restore, then the restored container's first
    intake: 63 mean prompts ahead and its own p99 prompt, (63 × 2,000 + 9,000) × 0.7 / 28,000 = 3.375 s, and one
    gap: 28.456 s, the longer. Modal's 150 s cap less 5 s margin less 28.456 s leaves 116.544 s → ⌊116.544 /
    0.080602⌋ = 1,445 tokens (1,767 when only the TTFT budget was left out, which let a request that waited on a
    restore decode past 150 s). max_tokens 2,048 does not fit, nor the p99 output 1,600: with a floor, keep
    non-streamed requests there (floor_only); serverless only, cap at 1,445 (≥ the 400-token mean)."""
    inputs, spec = planned_stacks["prod"]
    ep_in = next(e for e in inputs.endpoints if e.name == "assist")
    assert spec.endpoint("assist").serverless_cold_start_s == 25
    rule = non_streamed_burst_rule(ep_in, _placement(880.0, 64), has_floor=True, cold_start_s=25.0)
    assert MODAL_WEB_REQUEST_CAP_S == 150
    assert (rule.rule, rule.max_tokens, rule.derivation.value) == ("floor_only", None, 1445)
    so = non_streamed_burst_rule(ep_in, _placement(880.0, 64), has_floor=False, cold_start_s=25.0)
    assert (so.rule, so.max_tokens) == ("cap_max_tokens", 1445)
    b = spec.endpoint("assist").burst
    assert (b.non_streamed_rule, b.non_streamed_max_tokens, b.web_request_cap_s) == ("floor_only", None, 150)
    # an instant restore: 3.456 s of intake beats the 2.5 s budget → ⌊141.544 / 0.080602⌋ = 1,756 ≥ the p99: cap
    instant = non_streamed_burst_rule(ep_in, _placement(880.0, 64), has_floor=True, cold_start_s=0.0)
    assert (instant.rule, instant.max_tokens) == ("cap_max_tokens", 1756)
    # half the decode rate: 145.45 + 7.875 = 153.33 ms/token, 25 + 3.375 + 0.153 = 28.528 s first →
    # ⌊116.472 / 0.15333⌋ = 759 < the p99: serverless only, cap at 759 (≥ the mean); an eighth: 589.7 ms/token,
    # 28.965 s first → 196 < 400, streaming required
    assert non_streamed_burst_rule(ep_in, _placement(440.0, 64), has_floor=True, cold_start_s=25.0).rule == "floor_only"
    slow = non_streamed_burst_rule(ep_in, _placement(440.0, 64), has_floor=False, cold_start_s=25.0)
    assert (slow.rule, slow.max_tokens) == ("cap_max_tokens", 759)
    assert non_streamed_burst_rule(ep_in, _placement(110.0, 64), has_floor=False, cold_start_s=25.0).rule == \
        "require_streaming"


def _with_rule(spec, rule: str, max_tokens: int | None = None):
    ep = spec.endpoint("assist")
    ep2 = ep.model_copy(update={"burst": ep.burst.model_copy(update={"non_streamed_rule": rule,
                                                                      "non_streamed_max_tokens": max_tokens})})
    return spec.model_copy(update={"endpoints": tuple(ep2 if e.name == "assist" else e for e in spec.endpoints)})


def _planned_fit(spec) -> int:
    """The tokens the plan found fit within Modal's cap (its derivation), whatever rule it then chose."""
    return int(next(d.value for d in spec.endpoint("assist").derivations if d.figure == "non_streamed_burst_max_tokens"))


def test_non_streamed_burst_requests_past_modals_cap_fail_only_without_the_rule(prod_unwarmed):
    """prod assist at 3× its Friday-peak rate for 15 minutes, a quarter of requests non-streamed: thousands of
    them overflow to burst. Capped at the tokens the plan found fit (1,445) none passes Modal's 150 s, a few are
    truncated; with no rule ('fits') many pass it and get the 303 the client does not follow; 'floor_only' (the
    plan's choice: 1,445 < the p99 output) sends none to burst. (Planned with no burst kept warm for the spike.)"""
    inputs, spec = prod_unwarmed
    assert spec.endpoint("assist").burst.timeout_s > 150  # the burst function itself would run them to 471 s
    kw = dict(seed=0, start_h=116.0, end_h=116.25, rate_scale=3.0, overrides=Overrides(admission=True))
    capped = simulate_endpoint(inputs, _with_rule(spec, "cap_max_tokens", _planned_fit(spec)), "assist", **kw)
    assert capped.non_streamed_burst > 1000 and capped.non_streamed_capped > 0
    unruled = simulate_endpoint(inputs, _with_rule(spec, "fits"), "assist", **kw)
    assert unruled.non_streamed_capped == 0 and unruled.non_streamed_redirected > 10 * max(1, capped.non_streamed_redirected)
    floor_only = simulate_endpoint(inputs, spec, "assist", **kw)
    assert spec.endpoint("assist").burst.non_streamed_rule == "floor_only"
    assert floor_only.non_streamed_burst == 0 and floor_only.non_streamed_redirected == 0


def test_non_streamed_burst_requests_under_the_rule_never_pass_modals_cap(prod_unwarmed):
    """The same 15 minutes at 3×: burst containers restore (25 s) while it fills, and the gateway, blind to them,
    sends non-streamed requests there. A cap that budgets only the TTFT before decoding (1,767 tokens) lets 2
    that waited on a restore pass Modal's 150 s and get the 303; the plan's cap budgets that wait and the
    restored container's first intake (1,445): none passes, at the cost of truncating the answers past it
    (the 1.4% of a 400-mean, 1,600-p99 output above 1,445: over 100 here)."""
    inputs, spec = prod_unwarmed
    kw = dict(seed=0, start_h=116.0, end_h=116.25, rate_scale=3.0, overrides=Overrides(admission=True))
    fit = _planned_fit(spec)
    assert fit == 1445
    new = simulate_endpoint(inputs, _with_rule(spec, "cap_max_tokens", fit), "assist", **kw)
    assert new.non_streamed_burst > 1000 and new.non_streamed_redirected == 0
    assert 0.005 * new.non_streamed_burst < new.non_streamed_capped < 0.03 * new.non_streamed_burst
    old = simulate_endpoint(inputs, _with_rule(spec, "cap_max_tokens", 1767), "assist", **kw)
    assert old.non_streamed_redirected > 0  # the old cap: the ones that waited on a restore pass 150 s


def test_long_prompt_drill_replays_a_trace_with_its_own_prompts(planned_stacks, root):
    """`--drill long-prompt --trace mooncake --raw-tokens`: the replay through the planned spike reports the
    refusals over the product limit and the preemptions next to the paste worst case."""
    from simulator.drills import long_prompt

    inputs, spec = planned_stacks["prod"]
    r = long_prompt(inputs, spec, "assist", trace=load_trace(root / "traces" / "mooncake_synthetic.jsonl"))
    refused = r.values["replay: refused over the product limit (413/400)"][1]
    assert refused > 0.2 * r.values["replay: requests"][1]
    assert r.values["replay: preemptions"][1] > 0
    assert r.values["replay: goodput"][1] < r.values["replay: admitted goodput"][1]
    assert "refused over the product limit" in r.finding and "preemptions" in r.finding


@pytest.mark.parametrize("compiled", [False, True])
def test_a_container_the_warm_minimum_held_bills_until_the_minimum_lets_it_go(planned_stacks, compiled):
    """prod assist with no traffic for two hours and a warm minimum of 2 containers in hour 0 only. Both start warm
    at 0 and stay idle: the minimum holds them (and Modal bills them) through 01:00; from then their idle time
    counts and they stop one scaledown window (120 s) after the last 15 s autoscaler tick that saw them held,
    01:01:45 = 3,705 s: 2 × 3,705 s = 2.058 container-hours, 4.117 GPU-hours on H100:2. The engine before
    backdated the stop to the last request (none: ready at 0) + 120 s and billed 2 × 120 s (0.133 GPU-h)."""
    if compiled:
        pytest.importorskip("numba")
    inputs, spec = planned_stacks["prod"]
    b = spec.endpoint("assist").burst
    assert (b.scaledown_window_s, b.gpus_per_container) == (120, 2)
    assert spec.endpoint("assist").autoscaling.polling_interval_s == 15
    warm = (2,) + (0,) * 167
    r = simulate_endpoint(inputs, spec, "assist", start_h=0.0, end_h=2.0, spike=Spike(0.0, 0.0, 120.0),
                          overrides=Overrides(burst_min_by_hour=warm), compiled=compiled)
    assert r.requests == 0
    assert r.gpu_hours["serverless"] == pytest.approx(2 * 3705 * 2 / 3600, abs=0.005)  # reported to 0.01 GPU-h
