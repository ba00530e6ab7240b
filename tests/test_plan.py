"""Planner behaviour: decisions, floors that follow the clock, MIG, autoscaling and engine settings."""

from __future__ import annotations

import numpy as np
import pytest

from inputs_factory import inputs_dict, office_profile, set_path
from topology import CostInputs, plan
from topology.plan import erlang_c, floor_windows, placements
from topology.spec import TopologySpec


def planned(d):
    return plan(CostInputs.model_validate(d))


def test_low_traffic_does_not_get_a_cluster_it_cannot_pay_for():
    # 40k requests/day ≈ 2–3 req/s in business hours: a 1–3 GPU problem, and here the API is cheaper
    spec = planned(inputs_dict(traffic={"hourly_mean_requests_per_s": office_profile(2.5, 0.05, 0.2)}))
    e = spec.endpoints[0]
    assert e.tier == "managed_api"
    assert not spec.node_pools
    ded = next(a for a in e.alternatives if a.option == "dedicated_only")
    assert ded.breakdown_usd["platform_fixed"] == pytest.approx(1500, rel=1e-3)
    assert ded.monthly_usd > e.monthly_usd


def test_office_traffic_without_api_gets_a_floor_that_rises_before_the_morning_ramp():
    spec = planned(inputs_dict(managed_api=None, traffic={"hourly_mean_requests_per_s": office_profile(20, 1, 2)}))
    e = spec.endpoints[0]
    assert e.tier in ("floor_plus_burst", "dedicated_only")
    floor = e.floor.replicas_by_hour
    # Monday: the floor at 09:00 exceeds the overnight floor (it follows the clock, not the mean)
    assert floor[9] > floor[3]
    # every rise has a window that starts at least the cold-start lead before the demand rises
    rises = [h for h in range(168) if floor[h] > floor[h - 1]]
    assert rises
    for h in rises:
        w = next(w for w in e.floor.windows if w.demand_rise_minute_of_week == h * 60)
        lead_min = (w.demand_rise_minute_of_week - w.start_minute_of_week) % 10080
        assert lead_min * 60 >= e.floor.lead_time_s
        assert w.replicas == floor[h]
    assert e.floor.lead_time_s >= 600  # the measured new node + pod cold start


def test_dev_environment_runs_no_floor_replicas():
    d = inputs_dict(managed_api=None)
    d["environment"] = "dev"
    d["floor_replicas_allowed"] = False
    spec = planned(d)
    e = spec.endpoints[0]
    assert e.tier == "serverless_only"
    assert sum(e.floor.replicas_by_hour) == 0
    assert e.autoscaling is None and not spec.node_pools
    assert e.burst is not None and e.burst.max_containers >= 1


def _guard_on_slices_bursting_to_whole_gpus() -> dict:
    """A 1B model whose floor runs on MIG 1g.10gb slices while its burst containers are whole H100s (serverless
    runs whole GPUs): the two tiers carry very different loads per replica. At $0.0009/GPU-s serverless and a
    spiky office week (peak 600 req/s, × 3 within the hour) floor + burst is the cheapest option."""
    d = _small_model_inputs(traffic={"hourly_mean_requests_per_s": office_profile(600, 100, 100),
                                     "within_hour_peak_factor": 3.0})
    d["prices"]["serverless_usd_per_gpu_second"]["H100-80GB"] = 0.0009
    return d


def test_burst_is_sized_to_the_peak_above_the_floor_in_burst_containers():
    """Sized in the burst's own containers: the floor's slices plus max_containers whole-GPU containers carry
    every hour's within-hour peak, and one container fewer would leave the worst hour short."""
    e = planned(_guard_on_slices_bursting_to_whole_gpus()).endpoints[0]
    assert e.tier == "floor_plus_burst" and e.capacity.mig_profile == "1g.10gb"
    assert e.burst is not None and e.burst.gpus_per_container == 1 and e.burst_capacity.mig_profile is None
    per_slice, per_container = e.capacity.planning_requests_per_s, e.burst.planning_requests_per_s
    assert per_container > 5 * per_slice  # a whole GPU carries several slices' load: the tiers' rates differ
    peak = np.asarray(office_profile(600, 100, 100)) * 3.0
    above_floor = peak - np.asarray(e.floor.replicas_by_hour) * per_slice
    assert 1 <= e.burst.max_containers <= 60  # the input cap
    assert (above_floor <= e.burst.max_containers * per_container + 0.01).all()  # covered (rates are rounded)
    # headroom for the spike the endpoint must absorb (traffic.spike_factor, default 3× the peak), not beyond
    spike = 3.0 * peak - np.asarray(e.floor.replicas_by_hour) * per_slice
    assert e.burst.spike_containers == e.burst.max_containers
    assert (spike <= e.burst.max_containers * per_container + 0.01).all()
    assert spike.max() > (e.burst.max_containers - 1) * per_container + 0.01


def test_serverless_cap_too_small_makes_serverless_infeasible_with_the_reason():
    spec = planned(inputs_dict(serverless={"gpu_kind": "H100-80GB", "weights_region": "us-east-1", "max_containers_cap": 1}))
    alt = {a.option: a for a in spec.endpoints[0].alternatives}
    assert not alt["serverless_only"].feasible
    assert "max_containers_cap" in alt["serverless_only"].reason


def _small_model_inputs(**overrides) -> dict:
    return inputs_dict(**{**dict(
        managed_api=None,
        model={"name": "guard-1b", "revision": "r", "parameters_billion": 1.2, "precision": "bf16", "weights_gb": 2.5,
               "tokenizer": "t", "base_model": "b", "architecture_max_context_tokens": 131072, "kv_cache_mib_per_token": 0.03125},
        shape={"input_tokens_mean": 700, "input_tokens_p99": 3000, "output_tokens_mean": 8, "output_tokens_p99": 20,
               "product_max_context_tokens": 4096, "max_tokens": 32},
        slo={"ttft_p99_ms": 300, "inter_token_p99_ms": 50},
        engine=[{"gpu_kind": "H100-80GB", "decode_tokens_per_s": 6000, "prefill_tokens_per_s": 60000, "max_concurrent_sequences": 256,
                 "mig": [{"profile": "1g.10gb", "decode_tokens_per_s": 1300, "prefill_tokens_per_s": 12500, "max_concurrent_sequences": 48}]}],
        traffic={"hourly_mean_requests_per_s": office_profile(150, 8, 25)},
        prefix_cache_hit_fraction=0.6, tenants=["default"],
    ), **overrides})


def test_small_model_gets_mig_slices_with_a_valid_layout():
    spec = planned(_small_model_inputs())
    e = spec.endpoints[0]
    assert e.capacity.mig_profile == "1g.10gb"
    pools = [p for p in spec.node_pools if p.name in e.node_pools]
    assert pools and all(p.mig_layout is not None and p.mig_layout.devices == {"1g.10gb": 7} for p in pools)
    assert all(p.labels["nvidia.com/mig.config"] == "all-1g.10gb" for p in pools)


def test_model_too_big_for_any_slice_uses_whole_gpus_and_says_why():
    """70 GB of weights exceed the largest H100 slice below the whole GPU (4g.40gb: 40 GB), so no slice is
    even a candidate, whatever the tier."""
    spec = planned(inputs_dict(managed_api=None))
    e = spec.endpoints[0]
    assert e.capacity.mig_profile is None
    assert e.mig_decision.startswith("whole GPUs:") and "fit no MIG slice" in e.mig_decision


def test_engine_settings_follow_the_product_not_the_model():
    spec = planned(inputs_dict())
    en = spec.endpoints[0].engine
    assert en.max_model_len == 16384  # product limit, not the model's 131072
    assert en.max_tokens == 2048
    assert en.enable_prefix_caching and en.cache_salt_per_tenant  # two tenants
    args = en.vllm_args("/models/x")
    assert args[args.index("--max-model-len") + 1] == "16384"
    single = planned(inputs_dict(tenants=["only"])).endpoints[0]
    assert not single.engine.cache_salt_per_tenant
    assert single.gateway.cache_isolation == "single_tenant"


def test_lora_working_set_beyond_headroom_warns():
    small = planned(inputs_dict(lora={"count": 20, "rank": 16, "size_mb": 100, "active_working_set": 4})).endpoints[0]
    assert small.engine.lora is not None and small.engine.lora.max_loras == 4 and small.engine.lora.max_lora_rank == 16
    assert not any("LoRA" in w for w in small.warnings)
    big = planned(inputs_dict(lora={"count": 500, "rank": 100, "size_mb": 2000, "active_working_set": 60})).endpoints[0]
    assert big.engine.lora is not None and big.engine.lora.max_lora_rank == 128
    assert any("adapter-cache thrash" in w for w in big.warnings)


def test_autoscaling_is_queue_based_with_a_capped_step_and_a_cap():
    spec = planned(inputs_dict(managed_api=None, traffic={"hourly_mean_requests_per_s": office_profile(20, 1, 2)}))
    a = spec.endpoints[0].autoscaling
    assert a is not None
    assert a.metric == "vllm:num_requests_waiting"
    assert 1 <= a.scale_up_pods_per_period <= spec.endpoints[0].herd.step_replicas
    assert a.max_replicas <= 60
    assert a.scale_down_stabilization_s >= a.scale_up_stabilization_s


def test_thundering_herd_step_keeps_weight_load_within_the_acceptable_time():
    e = planned(inputs_dict()).endpoints[0]
    h = e.herd
    assert h.step_load_s <= 180
    load_one_more = h.weights_gb * (h.step_replicas + 1) / min(h.shared_path_gb_per_s, (h.step_replicas + 1) * h.per_node_gb_per_s)
    assert load_one_more > 180 or h.step_replicas == 64
    assert h.start_jitter_s >= 5


def test_floor_windows_wrap_past_sunday_midnight():
    floor = [1] * 168
    for h in list(range(165, 168)) + [0, 1]:
        floor[h] = 3
    windows = floor_windows(floor, 1, lead_s=600)
    assert len(windows) == 1
    w = windows[0]
    assert w.demand_rise_minute_of_week == 165 * 60
    assert w.start_minute_of_week == 165 * 60 - 10
    assert w.end_minute_of_week == 2 * 60


def test_erlang_c_matches_textbook_values():
    # c=2, A=1 → C = 1/3 ; c=1 → C = ρ
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    assert erlang_c(4096, 2000.0) < 1e-6


def test_spec_round_trips_through_json_and_is_frozen():
    spec = planned(inputs_dict())
    again = TopologySpec.from_json(spec.to_json())
    assert again == spec and again.sha256() == spec.sha256()
    with pytest.raises(Exception):
        spec.endpoints[0].tier = "managed_api"  # type: ignore[misc]


def test_every_figure_is_traceable_to_inputs():
    e = planned(inputs_dict(managed_api=None, traffic={"hourly_mean_requests_per_s": office_profile(20, 1, 2)})).endpoints[0]
    figures = {d.figure: d for d in e.derivations}
    for name in ("gpu_s_per_request", "planning_requests_per_s", "floor_lead_time_s", "target_waiting_per_replica",
                 "required_headroom_fraction", "scale_up_pods_per_period", "serverless_break_even_busy_hours_per_day"):
        assert name in figures, name
        assert figures[name].formula and figures[name].inputs
    assert figures["gpu_s_per_request"].value == pytest.approx(e.economics.gpu_s_per_request)


def test_tighter_inter_token_slo_limits_concurrency():
    loose = placements(CostInputs.model_validate(inputs_dict()).endpoints[0], __import__("topology").GPU_KINDS)[0][0]
    tight_inputs = CostInputs.model_validate(set_path(inputs_dict(), "endpoints.0.slo.inter_token_p99_ms", 40))
    tight = placements(tight_inputs.endpoints[0], __import__("topology").GPU_KINDS)[0][0]
    assert tight.usable_concurrency < loose.usable_concurrency
    assert tight.planning_rps < loose.planning_rps


def test_bundled_stacks_plan_with_only_expected_warnings(stack):
    name, inputs, spec = stack
    expected = ("long pastes at max × max concurrency", "limits a replica to", "capacity is estimated",
                "spike needs", "at the planned p99 prompt",
                # assist's 2-GPU burst containers with GPU snapshots on (tests/test_modal_snapshots.py)
                "GPU snapshots on a 2-GPU container",
                # vLLM's per-token gap at the planned batch (tests/test_token_gap.py; README Known limits)
                "per-token gap p99 at least", "per-token gap p99 between",
                # guard's one warm previous replica against its floor of up to 14 (tests/test_rollout.py)
                "a rollback before")
    for w in spec.warnings:
        assert any(x in w for x in expected), f"{name}: unexpected warning {w}"
    if name == "dev":
        assert not spec.node_pools and all(sum(e.floor.replicas_by_hour) == 0 for e in spec.endpoints)
    if name == "prod":
        tiers = {e.name: e.tier for e in spec.endpoints}
        assert tiers["assist"] == "floor_plus_burst"
        guard = spec.endpoint("guard")
        assert guard.capacity.mig_profile is not None and guard.floor.windows


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_endpoints_bills_add_up_to_the_stacks_and_every_served_endpoint_shares_the_platform(stack):
    """The platform (cluster, gateway, monitoring) runs for every endpoint behind the gateway, serverless-only ones
    included: dev deploys it for assist and guard, whose plan left its $1,200 a month out (the share went only to
    options with a floor). The serverless plan's fixed cost was charged whole to each endpoint using it and once
    in the total, so the endpoints' bills did not add up to the stack's. Hand-worked for dev: $1,200 between its
    two gated endpoints ($600 each), the Modal plan's $250 between the same two ($125 each)."""
    from tests.conftest import ROOT
    from topology.loading import load_inputs

    spec = plan(load_inputs(ROOT / "stacks" / f"Pulumi.{stack}.yaml"))
    assert sum(e.monthly_usd for e in spec.endpoints) == pytest.approx(spec.monthly_usd_total, abs=0.05)
    gated = [e for e in spec.endpoints if e.gated]
    assert (spec.monthly_usd_by_tier["platform_fixed"] > 0) == bool(gated)
    if stack == "dev":
        assert [e.tier for e in spec.endpoints] == ["serverless_only", "managed_api", "serverless_only"]
        assert spec.monthly_usd_by_tier["platform_fixed"] == 1200.0
        for e in gated:
            won = next(a for a in e.alternatives if a.option == e.tier)
            assert won.breakdown_usd["platform_fixed"] == pytest.approx(600.0, abs=0.01)
            assert won.breakdown_usd["serverless_fixed"] == pytest.approx(125.0, abs=0.01)
