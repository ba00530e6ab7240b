"""The PR-preview workflow is a valid GitHub workflow and runs the plan diff and pulumi preview per stack."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "preview.yml"


def test_workflow_validates_against_the_github_schema():
    exe = shutil.which("check-jsonschema") or str(Path(__import__("sys").executable).with_name("check-jsonschema"))
    if not Path(exe).exists():
        pytest.fail("check-jsonschema is a test dependency (pyproject [dev])")
    r = subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_workflow_previews_every_stack_in_stacks():
    wf = yaml.safe_load(WORKFLOW.read_text())
    job = wf["jobs"]["plan-diff"]
    stacks = {p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (ROOT / "stacks").glob("Pulumi.*.yaml")}
    assert set(job["strategy"]["matrix"]["stack"]) == stacks
    steps = {s.get("uses", s.get("name")): s for s in job["steps"]}
    preview = steps["pulumi/actions@v7"]["with"]
    assert preview["command"] == "preview" and preview["comment-on-pr"] is True
    assert any("topology diff" in s.get("run", "") for s in job["steps"])
