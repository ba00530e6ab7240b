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
