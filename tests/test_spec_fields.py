"""What consumers read from the spec instead of re-deriving it: each replica's physics, and the tier
properties. Figures are worked by hand from the prod stack's inputs and the catalog."""

from __future__ import annotations

import pytest


def test_assist_replica_physics_match_the_hand_worked_figures(planned_stacks):
    """assist: Llama 3.3 70B on 2 × H100-80GB (3.35 TB/s each), weights 72.7 GB, KV 0.3125 MiB/token,
    measured 880 decode tok/s at 64 sequences, nodes p5.48xlarge (8 GPUs).

    KV: (2 × 80 GB × 0.90 − 72.7 GB − 2 × 1 GB) = 69.3 GB over 0.3125 MiB = 3.2768e-4 GB per token
        → 211,486.8 tokens.
    Decode step floor: 72.7 GB / (2 × 3.35 TB/s) = 10.85 ms. Saturated step: 64 / 880 = 72.73 ms,
        so k = (72.73 − 10.85) ms / 64 = 0.9668 ms per sequence.
    Replicas per node: 8 GPUs / 2 = 4."""
    _, spec = planned_stacks["prod"]
    cap = spec.endpoint("assist").capacity
    assert (cap.gpu_kind, cap.gpus_per_replica, cap.usable_concurrency) == ("H100-80GB", 2, 64)
    assert cap.kv_capacity_tokens == pytest.approx(211_486.8, abs=0.1)
    assert cap.decode_step_floor_s == pytest.approx(0.010851, abs=1e-6)
    assert cap.decode_step_s_per_sequence == pytest.approx(0.00096682, abs=1e-8)
    assert (cap.replicas_per_node, cap.gpus_per_node) == (4, 8)
    assert cap.gpu_fraction_per_replica == 2.0
    # the burst containers run the same engine on the same GPUs: same physics
    assert spec.endpoint("assist").burst_capacity.kv_capacity_tokens == pytest.approx(211_486.8, abs=0.1)


def test_the_decode_line_reproduces_the_stated_decode_rate(stack):
    """usable / (t_min + usable·k) is the replica's decode tok/s at usable concurrency (the spec rounds it to 0.01)."""
    _, _, spec = stack
    for e in spec.endpoints:
        for cap in (e.capacity, e.burst_capacity):
            if cap is None:
                continue
            n = cap.usable_concurrency
            rate = n / (cap.decode_step_floor_s + n * cap.decode_step_s_per_sequence)
            assert rate == pytest.approx(cap.decode_tokens_per_s, abs=0.006), e.name
            # one max-context sequence always fits: the planner rejects placements where it does not
            assert cap.kv_capacity_tokens >= e.engine.max_model_len, e.name


def test_tier_properties_agree_with_what_the_spec_deploys(stack):
    """has_floor: node pools and an autoscaler; has_burst: a Modal app and its container capacity;
    gated: something of ours serves it, so the gateway routes it."""
    _, _, spec = stack
    for e in spec.endpoints:
        assert e.has_floor == bool(e.node_pools) == (e.autoscaling is not None), e.name
        assert e.has_burst == (e.burst is not None) == (e.burst_capacity is not None), e.name
        assert e.gated == (e.has_floor or e.has_burst), e.name
