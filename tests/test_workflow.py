"""The GitHub workflows: valid against the GitHub workflow schema (offline), and they do what the README says —
PR: tests, plan diff and `pulumi preview --diff` with the policy pack per stack; main: `pulumi up` dev then
prod behind an environment approval, one update per stack at a time, region and secrets from the secret store."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
STACKS = {p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (ROOT / "stacks").glob("Pulumi.*.yaml")}
PULUMI_ACTION = "pulumi/actions@v7"  # inputs checked in pulumi/actions v7 (8e5e406) action.yml


def load(name: str) -> dict:
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as True
    return doc


def pulumi_steps(job: dict) -> list[dict]:
    return [s for s in job["steps"] if s.get("uses") == PULUMI_ACTION]


def config_map(step: dict) -> dict:
    return yaml.safe_load(step["with"]["config-map"])


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_validates_against_the_github_schema(workflow):
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    if not Path(exe).exists():
        pytest.fail("check-jsonschema is a test dependency (pyproject [dev])")
    r = subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", str(workflow)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_there_is_a_pull_request_and_a_deploy_workflow():
    triggers = {p.name: load(p.name)["on"] for p in WORKFLOWS}
    assert "pull_request" in triggers["preview.yml"]
    assert triggers["deploy.yml"] == {"push": {"branches": ["main"]}}


def test_pull_requests_run_the_tests_and_preview_every_stack_with_the_policy_pack():
    wf = load("preview.yml")
    assert any("dev.py test" in s.get("run", "") for s in wf["jobs"]["tests"]["steps"])
    job = wf["jobs"]["plan-diff"]
    assert set(job["strategy"]["matrix"]["stack"]) == STACKS
    assert any("topology diff" in s.get("run", "") for s in job["steps"])
    (preview,) = pulumi_steps(job)
    w = preview["with"]
    assert w["command"] == "preview" and w["diff"] is True and w["comment-on-pr"] is True
    assert w["stack-name"] == "${{ matrix.stack }}"
    assert w["policyPacks"] == "policies" and (ROOT / "policies" / "PulumiPolicy.yaml").exists()
    install = [s for s in job["steps"] if "pip install" in s.get("run", "")]
    assert install and job["steps"].index(install[0]) < job["steps"].index(preview)  # the pack runs in .venv


def test_main_deploys_dev_then_prod_behind_an_approval():
    jobs = load("deploy.yml")["jobs"]
    ups = {name: job for name, job in jobs.items() if pulumi_steps(job)}
    by_stack = {pulumi_steps(j)[0]["with"]["stack-name"]: name for name, j in ups.items()}
    assert set(by_stack) == STACKS
    for name, job in ups.items():
        (step,) = pulumi_steps(job)
        assert step["with"]["command"] == "up" and step["with"]["policyPacks"] == "policies"
    dev, prod = jobs[by_stack["dev"]], jobs[by_stack["prod"]]
    assert dev["needs"] == "tests" and prod["needs"] == by_stack["dev"]  # dev only after the tests, prod only after dev
    assert prod["environment"] == "prod"  # required reviewers are set on this GitHub environment
    assert dev["environment"] == "dev"


def test_two_runs_never_update_one_stack_at_once():
    jobs = load("deploy.yml")["jobs"]
    groups = {}
    for name, job in jobs.items():
        for step in pulumi_steps(job):
            c = job["concurrency"]
            assert c["cancel-in-progress"] is False  # never kill an update half way
            groups[step["with"]["stack-name"]] = c["group"]
    assert len(set(groups.values())) == len(groups) == len(STACKS)
    assert all("${{" not in g for g in groups.values())  # the same group in every run, not per run


SECRET_REF = re.compile(r"^\$\{\{ secrets\.[A-Z0-9_]+ \}\}$")


@pytest.mark.parametrize("name", ["preview.yml", "deploy.yml"])
def test_every_credential_comes_from_the_secret_store(name):
    for job in load(name)["jobs"].values():
        for step in pulumi_steps(job):
            env = step["env"]
            for var in ("PULUMI_ACCESS_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                assert SECRET_REF.match(env[var]), (var, env[var])
            cm = config_map(step)
            assert "aws:region" not in cm  # the stack file's region (tests/test_stack_isolation.py)
            for key in ("llm-serving:modalTokenId", "llm-serving:modalTokenSecret"):
                # `pulumi up` deploys the Modal apps: the token reaches them only as secret config
                assert cm[key]["secret"] is True and SECRET_REF.match(cm[key]["value"])
    text = (ROOT / ".github" / "workflows" / name).read_text()
    assert not re.search(r"AKIA[0-9A-Z]{16}|ak-[A-Za-z0-9]{16,}", text)
