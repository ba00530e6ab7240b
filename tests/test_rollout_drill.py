"""The rollback drill reads the rollout's settings (shadow share, canary share, warm N−1) from the spec."""

from __future__ import annotations

import pytest

from simulator.drills import rollback


def _with_rollout(spec, name, **changes):
    """The spec with one endpoint's rollout settings changed (what `pulumi config set --path` would do)."""
    eps = tuple(e.model_copy(update={"rollout": e.rollout.model_copy(update=changes)}) if e.name == name else e
                for e in spec.endpoints)
    return spec.model_copy(update={"endpoints": eps})


@pytest.fixture(scope="module")
def guard_drill(planned_stacks):
    inputs, spec = planned_stacks["prod"]
    return rollback(inputs, spec, "guard", detect_minutes=10)


def test_each_stage_exposes_users_by_the_configured_share(guard_drill):
    r = guard_drill
    # guard peaks Mon 09:00; the bad version starts at 08:30, when the stack's traffic is 120 req/s:
    # 10 min × 60 s × 120 req/s = 72,000 requests in the detection window
    assert r.values["bad answers to users if caught in shadow"] == (0.0, 0.0)
    assert r.values["requests mirrored to it in shadow"][0] == 3_600  # shadow_percent 5 (default)
    assert r.values["bad answers to users if caught in canary"][0] == 7_200  # canary_percent 10
    assert r.values["bad responses served"][0] > r.values["bad answers to users if caught in canary"][0]


def test_n_minus_1_is_the_configured_minimum_and_its_price(guard_drill):
    r = guard_drill
    warm, serving = r.values["N−1 replicas warm / serving at the drill hour"]
    assert warm == 1 and serving > 1  # one warm replica cannot carry the peak: the finding says so
    assert "the warm column is a bound" in r.finding and "bound" in r.variants[0]
    per_day, window = r.values["N−1 warm price per day / for the window"]
    # one 1g.10gb slice beside a floor of 7 or 14 slices, which fills its p5.4xlarge nodes (7 slices of its one H100)
    # every hour: a node of its own, $6.88/h × 24 h = $165.12/day (1/7 of the H100, $23.59/day, before); × 7 days
    assert per_day == pytest.approx(6.88 * 24, abs=0.01) and window == pytest.approx(per_day * 7, abs=0.05)


def test_changing_the_settings_changes_the_drill(planned_stacks, guard_drill):
    inputs, spec = planned_stacks["prod"]
    serving = int(guard_drill.values["N−1 replicas warm / serving at the drill hour"][1])
    changed = _with_rollout(spec, "guard", canary_percent=20.0, shadow_percent=1.0, previous_warm_replicas=serving,
                            previous=spec.endpoint("guard").rollout.previous.model_copy(update={"replicas": serving}))
    r = rollback(inputs, changed, "guard", detect_minutes=10)
    assert r.values["bad answers to users if caught in canary"][0] == 14_400
    assert r.values["requests mirrored to it in shadow"][0] == 720
    assert r.values["N−1 replicas warm / serving at the drill hour"] == (serving, serving)
    assert "bound" not in r.variants[0] and "bound" not in r.finding


def test_without_a_rollout_the_drill_says_what_it_assumes(planned_stacks):
    inputs, spec = planned_stacks["prod"]
    r = rollback(inputs, spec, "autocomplete", detect_minutes=10)
    assert "no rollout configured" in r.variants[0]
    assert "N−1 replicas warm / serving at the drill hour" not in r.values
