"""The README's "Deploying for real" matches the program: its figures are the plan's, its versions the pins."""

from __future__ import annotations

import re
from pathlib import Path

from components import gpu_operator, keda, monitoring, node_autoscaler
from topology.loading import load_inputs
from topology.node_schedule import node_lead_minutes, pool_minimums
from topology.plan import plan

ROOT = Path(__file__).resolve().parent.parent


def section() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("### Deploying for real"):text.index("## Benchmarks")]


def test_the_phase_durations_are_the_plans_figures():
    doc = section()
    spec = plan(load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml"))
    for e in (e for e in spec.endpoints if e.node_pools):
        node, pod = int(e.node_cold_start_s), int(e.pod_cold_start_s)
        assert f"{e.name} {node} − {pod} = {node - pod} s" in doc
        assert f"{e.name} {pod} s" in doc
    budgets = " / ".join(str(e.startup_budget_s) for e in spec.endpoints if e.node_pools)
    assert f"startup budgets {budgets} s" in doc
    weights = sum(e.herd.weights_gb for e in spec.endpoints)
    assert f"{weights:.1f} GB of weights" in doc
    guard = spec.endpoint("guard")
    [first, *_] = pool_minimums(spec)["guard-on-demand"]
    h, m = divmod(first.minute_of_week % 1440, 60)
    assert f"{h:02d}:{m:02d} New York time" in doc
    assert f"{node_lead_minutes(guard)} minutes = its node cold start earlier" in doc


def test_the_versions_named_are_the_pinned_ones():
    doc = section()
    for version in (monitoring.CHART_VERSION, node_autoscaler.CHART_VERSION, keda.CHART_VERSION):
        assert re.search(rf"\b{re.escape(version)}\b", doc), version
    assert gpu_operator.CHART_VERSION in doc
