"""SSE heartbeat interval from the path's idle timeouts (topology/gateway_timing.py), hand-worked."""

from __future__ import annotations

import pytest

from topology.gateway_timing import PATH_IDLE_HOPS, IdleHop, heartbeat_interval_s


def test_default_path_beats_every_15_s():
    # tightest hops: the gateway's own timeout client and an ALB's default, both 60 s; 60 / 4 = 15
    assert min(h.idle_timeout_s for h in PATH_IDLE_HOPS) == 60
    assert heartbeat_interval_s() == 15.0


def test_the_tightest_hop_decides_and_whole_seconds_at_least_one():
    hops = (IdleHop("nlb", 350, "x"), IdleHop("corporate proxy", 30, "x"))
    assert heartbeat_interval_s(hops) == 7.0  # 30 / 4 = 7.5 -> 7 (never later than a quarter)
    assert heartbeat_interval_s((IdleHop("tight", 3, "x"),)) == 1.0


@pytest.mark.parametrize("hops", [(), (IdleHop("broken", 0, "x"),), (IdleHop("nan", float("nan"), "x"),)])
def test_unusable_paths_are_refused_with_the_hop_named(hops):
    with pytest.raises(ValueError, match="hop|idle timeout"):
        heartbeat_interval_s(hops)


def test_the_plan_carries_it_for_every_endpoint(planned_stacks):
    for _, spec in planned_stacks.values():
        assert {e.gateway.sse_heartbeat_s for e in spec.endpoints} == {15.0}
