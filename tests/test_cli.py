"""The plan report, JSON and Markdown outputs, and diff between two plans, through the real CLI: its `main` in
this process (what is checked is what it prints), the first test through `python -m topology` itself."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import yaml

from topology import TopologySpec
from topology.cli import main
from topology.report import floor_grid

ROOT = Path(__file__).resolve().parent.parent
PROD = ROOT / "stacks" / "Pulumi.prod.yaml"


def run_process(*args):
    r = subprocess.run([sys.executable, "-m", "topology", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def run(*args):
    """The command's exit status must be 0; what it printed on stdout."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    assert status == 0, err.getvalue()
    return out.getvalue()


def test_plan_report_shows_decision_alternatives_break_even_floor_and_burst():
    out = run_process("plan", str(PROD))
    assert "prices as of 2026-10-04" in out
    assert "== assist: dedicated floor + serverless burst" in out
    assert "why the runner-up lost:" in out
    for option in ("floor_plus_burst", "serverless_only", "dedicated_only", "managed_api"):
        assert option in out
    assert "GPU-s/request" in out and "busy h/day" in out
    assert "Mon  " in out and "Sun  " in out  # hour-of-week grid
    assert "burst: Modal H100:2" in out
    assert "MIG 1g.10gb" in out


def test_plan_json_is_the_spec():
    spec = TopologySpec.from_json(run("plan", str(PROD), "--json"))
    assert {e.name for e in spec.endpoints} == {"assist", "autocomplete", "guard"}


def test_plan_markdown_is_a_pr_comment():
    md = run("plan", str(PROD), "--markdown")
    assert md.startswith("### Serving plan `llm-serving/prod`")
    assert "| endpoint | decision | monthly |" in md and "<details>" in md


def test_diff_shows_decision_floor_and_cost_changes(tmp_path):
    doc = yaml.safe_load(PROD.read_text())
    inputs = doc["config"]["llm-serving:inputs"]
    guard = next(e for e in inputs["endpoints"] if e["name"] == "guard")
    guard["traffic"]["hourly_mean_requests_per_s"] = [x * 2 for x in guard["traffic"]["hourly_mean_requests_per_s"]]
    new = tmp_path / "Pulumi.prod.yaml"
    new.write_text(yaml.safe_dump(doc))
    out = run("diff", str(PROD), str(new))
    assert "monthly total:" in out
    assert "~ guard:" in out and "floor changed in" in out
    assert "= assist: unchanged" in out
    saved = tmp_path / "spec.json"
    saved.write_text(run("plan", str(PROD), "--json"))
    assert "unchanged" in run("diff", str(saved), str(PROD))


def test_floor_grid_marks_each_hour():
    rows = floor_grid([0] * 24 + [12] * 144, "")
    assert rows[1].startswith("Mon  · ·")
    assert rows[2].startswith("Tue  c c")
    assert len(rows) == 8
    json.dumps(rows)


def test_readme_input_tables_match_the_models():
    from topology.docs import readme_block

    readme = (ROOT / "README.md").read_text()
    assert readme_block() in readme, "README input tables drifted: run `.venv/bin/python -m topology.docs --write`"


def test_readme_quickstart_is_two_commands_that_exist():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quickstart", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["python3 dev.py demo", "python3 dev.py test"]
    assert "python3 dev.py test" in (ROOT / ".ci" / "run").read_text()


def test_plan_with_simulate_shows_simulated_attainment_and_cost_next_to_the_plan():
    out = run("plan", str(ROOT / "stacks" / "Pulumi.dev.yaml"), "--simulate")
    section = out.split("simulated week vs this plan:", 1)[1]
    for name in ("assist", "autocomplete", "guard"):
        assert name in section
    assert "sim goodput" in section and "plan $/month" in section and "(±15%)" in section
