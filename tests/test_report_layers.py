"""The report's layer table shows what the plan pays for each layer: rows (plus the fixed shares) sum to the
endpoint's monthly cost."""

from __future__ import annotations

import pytest

from topology import load_inputs, plan
from topology.report import layer_rows, terminal


def _fixed(e) -> float:
    win = next(a for a in e.alternatives if a.option == e.tier)
    return sum(v for k, v in win.breakdown_usd.items() if k.endswith("_fixed"))


@pytest.mark.parametrize("stack", ["stacks/Pulumi.prod.yaml", "stacks/Pulumi.dev.yaml"])
def test_layer_rows_sum_to_the_endpoint_cost(root, stack):
    spec = plan(load_inputs(root / stack))
    with_layers = [e for e in spec.endpoints if e.layers]
    assert with_layers or stack.endswith("dev.yaml")
    for e in with_layers:
        spike = e.burst.spike_warm_usd_per_month if e.burst else 0.0  # a row of its own, no node's
        total = sum(layer.monthly_usd for layer in e.layers) + spike + _fixed(e)
        # each row is rounded to the cent
        assert total == pytest.approx(e.monthly_usd, abs=0.01 * (len(e.layers) + 3)), e.name


def test_a_layer_run_part_time_is_priced_for_what_it_runs(root):
    """prod assist: a node needed most of the week but run on the clock for fewer hours pays for those hours
    (plus the serverless bill of the hours it is not running), not for every hour it is needed."""
    spec = plan(load_inputs(root / "stacks/Pulumi.prod.yaml"))
    e = spec.endpoint("assist")
    part_time = [layer for layer in e.layers if layer.tier == "scheduled_on_demand"]
    assert part_time
    rows = layer_rows(e)
    assert rows[-1].split()[-1] == f"${e.monthly_usd:,.0f}"
    assert "node  1" in terminal(spec)


def test_a_scheduled_nodes_row_says_what_it_pays_running_and_what_burst_carries():
    """Prod assist's third node is needed 89% of the week's hours but runs on the clock only in the floor's windows
    (5 h and three 710 s leads a week): its row's $15,320 was read as on-demand spend. Hand-worked from the inputs
    (an independent audit): 5.5917 h × $55.04 (p5.48xlarge, 8 × $6.88) × 730/168 = $1,337.31 running; the rest is
    its share of the serverless bill. The report now says both."""
    from tests.conftest import ROOT
    from topology import plan
    from topology.loading import load_inputs
    from topology.report import terminal

    spec = plan(load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml"))
    assist = spec.endpoint("assist")
    node3 = assist.layers[2]
    assert node3.tier == "scheduled_on_demand" and node3.duty_fraction > 0.85 and node3.runs_fraction < 0.05
    running = node3.monthly_usd - node3.serverless_usd_per_month
    assert running == pytest.approx((5 + 3 * 710 / 3600) * 55.04 * 730 / 168, abs=0.05)
    assert f"runs {node3.runs_fraction:.0%} of hours: $1,337" in terminal(spec)
    for e in spec.endpoints:
        for layer in e.layers:
            assert 0 <= layer.serverless_usd_per_month <= layer.monthly_usd + 0.01
            assert (layer.runs_fraction == 1.0) == (layer.tier == "reserved")
