"""Each failure drill shows the effect it exists to show."""

from __future__ import annotations

import pytest

from simulator.drills import (
    disconnect, kv_step_replica, long_prompt, morning_cold_start, rollback, spike,
)
from simulator.engine import Engine


def test_morning_cold_start_without_the_clock_lead_hits_the_first_users(planned_stacks):
    """Guard (dedicated only): a floor window opening at the rise serves the first users 503s and long waits
    while the capped scale-up brings replicas; the plan's window, a cold-start lead earlier, does not."""
    inputs, spec = planned_stacks["prod"]
    r = morning_cold_start(inputs, spec, "guard")
    assert r.shows_effect, r.finding
    (led_503, rise_503) = r.values["503 (no ready replica)"]
    assert led_503 == 0 and rise_503 > 0
    led_good, rise_good = r.values["goodput (window)"]
    assert led_good >= 0.99 > rise_good


def test_morning_cold_start_on_a_floor_plus_burst_endpoint_waits_on_burst_cold_starts(planned_stacks):
    inputs, spec = planned_stacks["prod"]
    r = morning_cold_start(inputs, spec, "assist")
    assert r.shows_effect, r.finding
    cold = spec.endpoint("assist").serverless_cold_start_s
    assert r.values["max TTFT"][1] >= cold * 0.9 > r.values["max TTFT"][0]
    assert r.values["requests waiting on a cold container"][1] > r.values["requests waiting on a cold container"][0] == 0


def test_morning_cold_start_serverless_scale_to_zero_pays_one_container_start(planned_stacks):
    inputs, spec = planned_stacks["dev"]
    r = morning_cold_start(inputs, spec, "assist")
    assert r.shows_effect, r.finding
    cold = spec.endpoint("assist").serverless_cold_start_s
    assert r.values["max TTFT"][0] >= cold * 0.9 > r.values["max TTFT"][1]
    # dev's TTFT SLO (60 s) tolerates the snapshot restore: the cold start costs latency, not goodput
    assert r.values["goodput (window)"][0] >= 0.99
    assert r.values["cost (window)"][1] > r.values["cost (window)"][0]  # the warm container is not free


def test_spike_on_a_dedicated_endpoint_sheds_keeps_admitted_requests_in_slo_and_adds_replicas(planned_stacks):
    """prod guard (dedicated only, 14 replicas at Mon 09:00) at 3× for 10 min: beyond the floor the gateway sheds
    (429 after its bounded wait; a waiting request goes to the first replica slot to free, as HAProxy's queue
    does), every admitted request's replica is held at the admission cap where the inter-token SLO holds, and
    the bounded queue still reaches the KEDA target, so replicas are added. Admitted goodput over the window
    holds the issue's 99% bar (and every spike minute: the test below)."""
    inputs, spec = planned_stacks["prod"]
    r = spike(inputs, spec, "guard", factor=3.0, minutes=10.0)
    assert r.shows_effect, r.finding
    base, hit = r.values["admitted goodput (window)"]
    assert hit >= 0.99 and base >= 0.99
    shed = r.values["shed with 429 (window)"][1]
    assert 0 < shed < 0.2 and f"{shed:.2%} shed" in r.finding
    assert r.values["goodput (window)"][1] < hit  # the shed requests are the ones that miss
    assert r.values["queue peak (floor/burst)"][1] > r.values["queue peak (floor/burst)"][0]
    assert r.values["pod / node cold starts"][1] > r.values["pod / node cold starts"][0]


def test_spike_on_a_dedicated_endpoint_keeps_every_spike_minute_at_the_bar(planned_stacks):
    """prod guard at 3× for 10 min, every spike minute: HAProxy's queue hands a waiting request to the first
    replica slot to free, so requests are admitted up to the end of the bounded wait and then queue for prefill
    behind the other new prompts the freed replica took at once. The plan's wait leaves room for that queue
    (0.113 s: two mean prompts ahead at the p99 of slots freed together); with the old wait, 0.157 s (TTFT −
    one p99 prefill − one token gap), the worst spike minute was 96.75% (TTFT 0.30-0.52 s against 0.3 s); now
    99.25%, 99.84% over the window (was 99.33%). The price is the shed share: 3.74% of the window, was 3.70%."""
    inputs, spec = planned_stacks["prod"]
    r = spike(inputs, spec, "guard", factor=3.0, minutes=10.0)
    assert r.values["admitted goodput, worst spike minute"][1] >= 0.99
    assert r.values["admitted goodput (window)"][1] >= 0.99
    old_gw = spec.endpoint("guard").gateway.model_copy(update={"admission_queue_timeout_s": 0.157})
    old = spec.model_copy(update={"endpoints": tuple(
        e.model_copy(update={"gateway": old_gw}) if e.name == "guard" else e for e in spec.endpoints)})
    r_old = spike(inputs, old, "guard", factor=3.0, minutes=10.0)
    assert r_old.values["admitted goodput, worst spike minute"][1] < 0.99  # the old plan's wait misses the bar
    # the shorter wait sheds more: the requests the old wait admitted to miss their TTFT are refused instead
    assert r.values["shed with 429 (window)"][1] > r_old.values["shed with 429 (window)"][1]


def cold_restore_floor(ep, slo_s: float) -> float:
    """An admitted request that waited on a restore: past the TTFT SLO and half the container's cold start."""
    return max(slo_s, 0.5 * ep.serverless_cold_start_s)


def test_spike_drill_at_the_planned_spike_on_floor_plus_burst_misses_only_while_burst_restores(prod_unwarmed):
    """prod assist at its planned spike (traffic.spike_factor 3 for spike_minutes 10), planned with no burst kept
    warm for it (what a spike meets in an hour the plan does not keep warm). The gateway sees only its in-flight
    count to burst: below the cap (24 containers × 64 inputs) it admits to burst, and a request landing on a
    restoring container waits at Modal for the 25 s restore. In flight to burst reaches the cap; past it
    requests wait in HAProxy's queue for a floor slot (maxconn 64, the pick overflows at 49), which frees
    within the bounded wait, so nothing is shed. What misses is the first spike minute, on burst: admitted
    requests waiting on starting containers (named in the finding)."""
    inputs, spec = prod_unwarmed
    ep = spec.endpoint("assist")
    assert ep.burst.spike_warm_hours_of_week == ()
    t = next(e for e in inputs.endpoints if e.name == "assist").traffic
    r = spike(inputs, spec, "assist", factor=t.spike_factor, minutes=t.spike_minutes)
    shed = r.values["shed with 429 (window)"][1]
    assert shed == 0 and f"{shed:.2%} shed" in r.finding
    assert r.values["peak in flight to burst"][1] == ep.gateway.admission_burst_inflight
    worst = r.values["admitted goodput, worst spike minute"][1]
    assert worst < 0.99 and f"worst spike minute {worst:.2%}" in r.finding
    assert "the worst spike minute is minute 1, while burst containers restore" in r.finding
    assert r.values["requests waiting on a cold container"][1] > r.values["requests waiting on a cold container"][0]
    slo_s = next(e for e in inputs.endpoints if e.name == "assist").slo.ttft_p99_ms / 1000.0
    assert r.values["max TTFT"][1] > cold_restore_floor(ep, slo_s)
    # the bar fails without the warm minimum: 97.3% over the window; the finding says no hour is warm
    assert r.values["admitted goodput (window)"][1] < 0.99
    assert "the plan keeps burst warm for the spike in no hour" in r.finding


def test_spike_drill_at_the_planned_spike_keeps_admitted_goodput_on_floor_plus_burst(planned_stacks):
    """prod assist (traffic.spike_warm_hours_fraction 0.1) at its planned spike in its busiest hour, Fri 20:00: the
    plan holds 24 containers warm there (the spike needs 2,345 places in flight to burst, 37 containers of 64;
    the cap is 24: tests/test_admission_plan.py), so the excess over the floor lands on ready containers while
    the autoscaler's new ones restore. Admitted goodput ≥ 99% over the window and in every spike minute, the
    shed share stated (none: past the burst cap the floor's spare connections take the rest)."""
    inputs, spec = planned_stacks["prod"]
    ep = spec.endpoint("assist")
    t = next(e for e in inputs.endpoints if e.name == "assist").traffic
    assert 116 in ep.burst.spike_warm_hours_of_week
    r = spike(inputs, spec, "assist", factor=t.spike_factor, minutes=t.spike_minutes)
    assert r.values["admitted goodput (window)"][1] >= 0.99
    assert r.values["admitted goodput, worst spike minute"][1] >= 0.99
    shed = r.values["shed with 429 (window)"][1]
    assert f"{shed:.2%} shed" in r.finding
    assert "is one of the 17 hours the plan keeps burst warm for the spike" in r.finding


def test_a_spike_outside_the_warm_hours_waits_out_its_first_restores(planned_stacks):
    """The plan keeps burst warm for the spike only in assist's 17 busiest hours: at Wed 14:00 (hour 62, not one of
    them) the same 3× spike meets the burst's load-driven containers only, and the first minute's requests wait
    on 25 s restores: admitted goodput below the bar, and the finding says the hour is not kept warm."""
    inputs, spec = planned_stacks["prod"]
    ep = spec.endpoint("assist")
    assert 62 not in ep.burst.spike_warm_hours_of_week
    r = spike(inputs, spec, "assist", factor=3.0, minutes=10.0, hour=62)
    assert r.values["admitted goodput (window)"][1] < 0.99
    assert r.values["requests waiting on a cold container"][1] > r.values["requests waiting on a cold container"][0]
    assert "Wed 14:00 is not an hour the plan keeps burst warm for the spike (17 are)" in r.finding


def test_spike_on_floor_plus_burst_is_carried_by_burst_containers(prod_unwarmed):
    inputs, spec = prod_unwarmed
    r = spike(inputs, spec, "assist", factor=2.0, minutes=5.0)
    assert r.shows_effect, r.finding
    assert r.values["container cold starts"][1] > r.values["container cold starts"][0]
    assert r.values["cost (window)"][1] > r.values["cost (window)"][0]


def test_spike_beyond_the_burst_grows_the_floor_through_the_burst_backlog_trigger(planned_stacks):
    """prod autocomplete, 9× for 10 min (beyond the 3× spike its burst headroom is sized for): in flight to burst
    passes the burst's capacity (the trigger's threshold), so the floor scales up too; the same spec without
    that trigger adds fewer, only from the gateway's queue once burst is at its cap."""
    inputs, spec = planned_stacks["prod"]
    ep = spec.endpoint("autocomplete")
    threshold = ep.autoscaling.burst_backlog_threshold
    r = spike(inputs, spec, "autocomplete", factor=9.0, minutes=10.0)
    assert r.shows_effect, r.finding
    base_added, hit_added = r.values["replicas added by the burst-backlog trigger"]
    assert base_added == 0 < hit_added
    assert r.values["peak in flight to burst"][1] > threshold >= r.values["peak in flight to burst"][0]
    assert r.values["pod / node cold starts"][1] >= r.values["pod / node cold starts"][0] + hit_added
    assert "by the burst-backlog trigger" in r.finding

    no = ep.model_copy(update={"autoscaling": ep.autoscaling.model_copy(update={"burst_backlog_threshold": None})})
    without = spec.model_copy(update={"endpoints": tuple(no if e.name == ep.name else e for e in spec.endpoints)})
    r0 = spike(inputs, without, "autocomplete", factor=9.0, minutes=10.0)
    assert "replicas added by the burst-backlog trigger" not in r0.values
    # without it the floor grows only once burst is at its in-flight cap and requests wait in the gateway's queue
    # for a floor slot (the KEDA trigger counts them): later and fewer replicas than with the backlog trigger
    base0, hit0 = r0.values["pod / node cold starts"]
    assert base0 == 0 < hit0 < r.values["pod / node cold starts"][1]


def test_long_prompt_without_the_gateway_cap_preempts_and_overflows_the_kv_cache(planned_stacks):
    inputs, spec = planned_stacks["prod"]
    r = long_prompt(inputs, spec, "assist")
    assert r.shows_effect, r.finding
    (no_cap_pre, cap_pre) = r.values["preemptions"]
    assert no_cap_pre > 0 and cap_pre == 0
    assert r.values["KV demand ÷ KV cache"][0] > 1 >= r.values["KV demand ÷ KV cache"][1]
    assert r.values["GPU-s wasted on recompute"][0] > 0 == r.values["GPU-s wasted on recompute"][1]
    assert r.values["max TTFT"][0] > r.values["max TTFT"][1]


def test_kv_step_model_preempts_only_when_the_cache_overflows():
    eng = Engine(slots=8, prefill_tokens_per_s=10_000, t_min=0.01, k=0.001, interference=0.0,
                 kv_capacity_tokens=4_000, gpus=1.0)
    fits = kv_step_replica(eng, 8, [900.0] * 4, [50] * 4, 1.0)  # 4 × 950 ≤ 4000
    assert fits.preemptions == 0 and fits.kv_demand_over_capacity < 1
    over = kv_step_replica(eng, 8, [900.0] * 4, [300] * 4, 1.0)  # 4 × 1200 > 4000: growth overflows
    assert over.preemptions > 0 and over.recomputed_tokens > 0 and over.drain_s > fits.drain_s
    too_long = kv_step_replica(eng, 8, [5_000.0], [10], 1.0)
    assert too_long.unservable == 1


@pytest.mark.parametrize("stack_name,endpoint", [("prod", "assist"), ("prod", "guard"), ("dev", "assist")])
def test_disconnects_waste_gpu_seconds_only_without_abort_propagation(planned_stacks, stack_name, endpoint):
    inputs, spec = planned_stacks[stack_name]
    r = disconnect(inputs, spec, endpoint, fraction=0.2)
    assert r.shows_effect, r.finding
    with_abort, without = r.values["GPU-s generating for nobody"]
    assert with_abort == 0 and without > 0
    assert r.values["requests abandoned"][0] == r.values["requests abandoned"][1] > 0


def test_disconnects_without_abort_push_more_traffic_to_burst(planned_stacks):
    inputs, spec = planned_stacks["prod"]
    r = disconnect(inputs, spec, "assist", fraction=0.3)
    assert r.values["burst share"][1] > r.values["burst share"][0]
    # Fri 19:00–21:00 are hours the plan keeps burst warm for the spike: the window's bill cannot move, and the
    # drill says why instead of printing two equal costs next to 5% wasted GPU-seconds
    assert r.values["cost (window)"][0] == pytest.approx(r.values["cost (window)"][1], rel=1e-3)
    assert "cost is the same either way" in r.finding and "burst share" in r.finding


def test_rollback_with_the_previous_revision_warm_recovers_faster(planned_stacks):
    inputs, spec = planned_stacks["prod"]
    r = rollback(inputs, spec, "guard", detect_minutes=10)
    assert r.shows_effect, r.finding
    warm, cold = r.values["minutes from detection to baseline goodput"]
    assert warm < cold
    assert r.values["bad responses served"][0] < r.values["bad responses served"][1]
    out_warm, out_cold = r.values["minutes from rollout to last bad replica out"]
    assert out_warm == pytest.approx(10.25, abs=0.3)  # detection + gateway flip + one autoscaler poll
    assert out_cold > out_warm
    assert r.values["pod / node cold starts"][1] > r.values["pod / node cold starts"][0]


def test_drill_command_prints_a_table_per_endpoint(root, monkeypatch, capsys):
    # the CLI's main in this process: what is checked is what it prints (test_fuzz.py runs real processes)
    from topology.cli import main

    monkeypatch.chdir(root)
    capsys.readouterr()
    status = main(["simulate", "stacks/Pulumi.prod.yaml", "--drill", "long-prompt", "--markdown"])
    out = capsys.readouterr()
    assert status == 0, out.err
    assert out.out.startswith("### Drill long-prompt on prod")
    for name in ("assist", "autocomplete", "guard"):
        assert f"**{name}:" in out.out
    assert "| preemptions |" in out.out
