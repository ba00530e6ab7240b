"""Properties of the planner over generated inputs (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inputs_factory import inputs_dict, office_profile
from topology import GPU_KINDS, CostInputs, plan
from topology.plan import placements

# derandomize: the same 100 examples every run, so CI does not pass or fail by the draw (a random run of the
# floors property found a case where more traffic lowers the floor, correctly: see that test's docstring)
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

profiles = st.builds(
    office_profile,
    peak=st.floats(0.2, 60),
    night=st.floats(0.0, 3),
    weekend=st.floats(0.0, 5),
)


def _inputs(profile, *, api_price=0.88, with_api=True, od_price=2.69, fixed=1500.0):
    d = inputs_dict(traffic={"hourly_mean_requests_per_s": profile, "within_hour_peak_factor": 1.5})
    d["prices"]["dedicated_on_demand_usd_per_gpu_hour"]["H100-80GB"] = od_price
    d["prices"]["platform_fixed_usd_per_month"] = fixed
    d["endpoints"][0]["max_dedicated_replicas"] = 1000  # caps are tested elsewhere; here demand must always fit
    d["endpoints"][0]["serverless"]["max_containers_cap"] = 10000
    if with_api:
        d["endpoints"][0]["managed_api"]["usd_per_million_input_tokens"] = api_price
        d["endpoints"][0]["managed_api"]["usd_per_million_output_tokens"] = api_price
    else:
        d["endpoints"][0]["managed_api"] = None
    return CostInputs.model_validate(d)


@SETTINGS
@given(profile=profiles, k=st.floats(1.0, 3.0), with_api=st.booleans(), od=st.floats(1.5, 8.0))
# found by hypothesis when the layer DP's single schedule was taken as is: 3% more traffic planned $30,032/month
# against $30,084.50 (the DP prices serverless by the layers' share, not the exact marginal)
@example(profile=office_profile(33.0, 0.0, 0.0), k=1.03125, with_api=True, od=2.0)
def test_more_traffic_never_lowers_cost(profile, k, with_api, od):
    a = plan(_inputs(profile, with_api=with_api, od_price=od))
    b = plan(_inputs([x * k for x in profile], with_api=with_api, od_price=od))
    assert b.monthly_usd_total >= a.monthly_usd_total - 0.01


@SETTINGS
@given(profile=profiles, k=st.floats(1.0, 3.0), od=st.floats(1.5, 8.0), with_api=st.booleans())
@example(profile=office_profile(39.5, 0.0, 0.0), k=1.0625, od=1.75, with_api=False)
def test_more_traffic_never_lowers_floors(profile, k, od, with_api):
    """Within a decision and placement, the floor's reserved base only rises with traffic (600 random cases,
    besides the fixed ones). Its replica-hours over the week do not, and the test no longer claims they do: a
    random run found office peak 2 req/s, night 5e-160 req/s, no weekend traffic, ×2, on-demand $3/GPU-h, no
    API — floor + burst both times, 4 replicas from 07:00 to 19:00, and from 05:00 on Tuesday to Friday at ×1
    only: 252 → 220 replica-hours a week, the doubled traffic's cheapest schedule leaving 05:00–07:00 to the
    burst (the ×3 case below is the same kind). Not hour by hour either: floor + burst schedules are chosen by
    their exact weekly cost among the layer DP's candidates (one per serverless price scale), and with more traffic the cheapest can move a
    node from one hour to another and carry the hour it left on the burst. Worked example (the @example
    below): office profile, peak 39.5 req/s, no night or weekend traffic, ×1.0625, on-demand $1.75/GPU-h, no
    API — the floor goes from 20 to 24 replicas at 08:00 and from 28 to 24 at 12:00 (the lunch dip), the same
    1,440 replica-hours a week; the schedule that keeps every hour at least as high bills $80/month more.
    (When more traffic makes a burst tier worth its fixed cost, dedicated_only can become floor + burst and
    a marginal hour may move to the burst; coverage of every hour is checked by the headroom property below.)

    Not a law across traffic levels either, and the reason is worth knowing. A random run found office peak
    22 req/s, night and weekend 1, ×3, on-demand $8/GPU-h, no API: the weekly floor goes from 1,064 to 896
    replica-hours. At ×3 the burst carries the whole office day (floor 4) and the floor rises to 24 at 17:00
    and 16 at 18:00. That is the cheapest schedule, by the serverless model's own routing: requests spread
    over the burst's containers (least in flight), so a container stops only after a scaledown window in
    which the burst held fewer requests than its rank. After the day's peak, 50 containers of 48 target
    inputs stay billed while the burst holds ≥ 50 requests (764 at 17:00 on a floor of 4): $593 an hour at
    17:00 and 18:00 as at noon (`serverless_usd_by_hour`), against 30 containers for the same rate from a
    cold start. Raising the floor at 17:00 empties the burst so they stop. At $8/GPU-h the candidate
    schedules (896 to 2,488 replica-hours) all bill within 3.7% of each other, so the pick among them moves
    with small changes of traffic."""
    a = plan(_inputs(profile, with_api=with_api, od_price=od)).endpoints[0]
    b = plan(_inputs([x * k for x in profile], with_api=with_api, od_price=od)).endpoints[0]
    same_placement = (a.capacity.gpu_kind, a.capacity.mig_profile) == (b.capacity.gpu_kind, b.capacity.mig_profile)
    if a.tier == b.tier and same_placement:
        assert b.floor.reserved_replicas >= a.floor.reserved_replicas


@SETTINGS
@given(profile=profiles, with_api=st.booleans(), od=st.floats(1.5, 8.0), fixed=st.floats(0, 20000))
def test_chosen_option_is_never_dearer_than_a_feasible_alternative(profile, with_api, od, fixed):
    spec = plan(_inputs(profile, with_api=with_api, od_price=od, fixed=fixed))
    e = spec.endpoints[0]
    for a in e.alternatives:
        if a.feasible:
            assert e.monthly_usd <= a.monthly_usd + 0.01, (e.tier, a.option)


@SETTINGS
@given(profile=profiles, od=st.floats(1.5, 8.0))
def test_floor_plus_burst_covers_demand_with_headroom_where_dedicated_serves(profile, od):
    inputs = _inputs(profile, with_api=False, od_price=od)
    e = plan(inputs).endpoints[0]
    ep = inputs.endpoints[0]
    peak = np.asarray(profile) * ep.traffic.within_hour_peak_factor
    floor = np.asarray(e.floor.replicas_by_hour)
    ok, _ = placements(ep, GPU_KINDS)
    sls = next(p for p in ok if p.gpu_kind == ep.serverless.gpu_kind and p.mig_profile is None)
    burst = e.burst.max_containers if e.burst else 0
    saturated = floor * e.capacity.saturated_requests_per_s + burst * sls.saturated_rps
    served = floor > 0
    assert (saturated[served] >= peak[served] * (1 + ep.headroom_fraction) - 1e-6).all()


@SETTINGS
@given(profile=profiles, p1=st.floats(0.1, 3.0), bump=st.floats(0.0, 3.0))
def test_a_higher_api_price_never_turns_an_api_loss_into_a_win(profile, p1, bump):
    low = plan(_inputs(profile, api_price=p1)).endpoints[0]
    high = plan(_inputs(profile, api_price=p1 + bump)).endpoints[0]
    if low.tier != "managed_api":
        assert high.tier != "managed_api"
