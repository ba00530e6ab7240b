"""The planner is pure: importing it never imports pulumi or modal, and plan() reads no clock."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_importing_topology_does_not_import_pulumi_or_modal():
    code = (
        "import sys, topology, topology.plan, topology.report, topology.cli;"
        "bad=[m for m in ('pulumi','modal','pulumi_aws','pulumi_kubernetes','matplotlib') if m in sys.modules];"
        "print(','.join(bad))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ""


def test_plan_is_deterministic_and_ignores_the_clock(monkeypatch):
    import datetime as dt
    import time

    from topology import load_inputs, plan

    inputs = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    first = plan(inputs).to_json()

    def no_clock(*a, **k):  # any clock read inside plan() would fail the test
        raise AssertionError("plan() read the clock")

    monkeypatch.setattr(time, "time", no_clock)
    monkeypatch.setattr(time, "monotonic", no_clock)

    class NoNow(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            no_clock()

    monkeypatch.setattr(dt, "datetime", NoNow)
    assert plan(inputs).to_json() == first


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (from the project root)."""
    probe = code + "; import sys; print('\\n'.join(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_reading_a_spec_loads_neither_the_planner_nor_numpy():
    """The Modal container and every component import topology.spec to read a spec: that must stay cheap."""
    loaded = _modules_after("import topology.spec; from topology.spec import TopologySpec, EndpointSpec")
    assert "topology.spec" in loaded  # the probe ran
    heavy = sorted(m for m in loaded if m == "numpy" or m.startswith(("numpy.", "topology.plan", "simulator")))
    assert heavy == []


def test_topology_plan_is_still_the_planner_function_whichever_import_comes_first():
    for code in ("import topology.plan; from topology import plan",
                 "from topology.plan import erlang_c; from topology import plan",
                 "from topology import plan; import topology.plan"):
        r = subprocess.run([sys.executable, "-c", code + "; print(callable(plan) and plan.__name__)"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert r.stdout.strip() == "plan", (code, r.stdout, r.stderr)


def test_the_simulator_imports_nothing_of_the_planner():
    """It checks the plan's claims from the spec and the inputs; re-running planner code would check nothing."""
    loaded = _modules_after("import simulator, simulator.cli, simulator.drills")
    assert "simulator.engine" in loaded
    assert sorted(m for m in loaded if m.startswith("topology.plan")) == []
