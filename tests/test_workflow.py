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
    # the comment carries the plan and a simulated week through it: the plan verified, not asserted
    assert any("topology plan" in s.get("run", "") and "--simulate" in s.get("run", "") for s in job["steps"])
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
        # `up` runs with --skip-preview (its stack policies judge outputs after the changes are applied): a preview
        # with the pack gates the merged commit first, on the same stack and config
        preview, up = pulumi_steps(job)
        assert preview["with"]["command"] == "preview" and up["with"]["command"] == "up"
        assert preview["with"]["policyPacks"] == up["with"]["policyPacks"] == "policies"
        assert {k: v for k, v in preview["with"].items() if k != "command"} == \
            {k: v for k, v in up["with"].items() if k != "command"}
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
AWS_CREDENTIALS_ACTION = "aws-actions/configure-aws-credentials@v6"
# the inputs of aws-actions/configure-aws-credentials v6.2.3 (action.yml; node24), those the workflows may pass
AWS_CREDENTIALS_INPUTS = {"aws-region", "role-to-assume", "role-duration-seconds", "role-session-name", "audience",
                          "role-skip-session-tagging", "mask-aws-account-id", "allowed-account-ids"}


@pytest.mark.parametrize("name", ["preview.yml", "deploy.yml"])
def test_every_credential_comes_from_the_secret_store(name):
    for job in load(name)["jobs"].values():
        for step in pulumi_steps(job):
            env = step["env"]
            assert SECRET_REF.match(env["PULUMI_ACCESS_TOKEN"])
            cm = config_map(step)
            assert "aws:region" not in cm  # the stack file's region (tests/test_stack_isolation.py)
            for key in ("llm-serving:modalTokenId", "llm-serving:modalTokenSecret"):
                # `pulumi up` deploys the Modal apps: the token reaches them only as secret config
                assert cm[key]["secret"] is True and SECRET_REF.match(cm[key]["value"])
    text = (ROOT / ".github" / "workflows" / name).read_text()
    assert not re.search(r"AKIA[0-9A-Z]{16}|ak-[A-Za-z0-9]{16,}", text)


@pytest.mark.parametrize("name", ["preview.yml", "deploy.yml"])
def test_aws_access_is_a_short_lived_role_session_never_a_stored_key(name):
    """Every job that runs Pulumi assumes the CI role by GitHub's OIDC token before it (credentials that expire
    with the job); no AWS key is stored or passed anywhere, and only those jobs may mint an OIDC token."""
    text = (ROOT / ".github" / "workflows" / name).read_text()
    assert "AWS_ACCESS_KEY_ID" not in text and "AWS_SECRET_ACCESS_KEY" not in text and "aws-access-key-id" not in text
    wf = load(name)
    assert wf.get("permissions", {}).get("id-token") is None  # not granted workflow-wide
    for job_name, job in wf["jobs"].items():
        steps = job["steps"]
        if not pulumi_steps(job):
            # the tests run the pull request's code: no token to assume a role with
            assert job.get("permissions", {}).get("id-token") is None, job_name
            continue
        assert job["permissions"]["id-token"] == "write", job_name
        # the job's secrets and role are its environment's: the PR preview (the branch's own code) never gets the
        # deploy environments' (dev, prod), whose roles its OIDC subject cannot assume
        assert job["environment"] in ({"preview"} if name == "preview.yml" else {"dev", "prod"}), job_name
        (creds,) = [s for s in steps if s.get("uses", "").startswith("aws-actions/configure-aws-credentials")]
        assert creds["uses"] == AWS_CREDENTIALS_ACTION
        w = creds["with"]
        assert set(w) <= AWS_CREDENTIALS_INPUTS, set(w) - AWS_CREDENTIALS_INPUTS
        assert w["role-to-assume"] == "${{ vars.AWS_ROLE_ARN }}"
        assert w["aws-region"] == "${{ steps.region.outputs.region }}"
        # AWS accepts 900 s to 12 h; an `up` that outlives its session fails half way
        assert 900 <= int(w["role-duration-seconds"]) <= 43200
        (region,) = [s for s in steps if s.get("id") == "region"]
        first = pulumi_steps(job)[0]
        assert steps.index(region) < steps.index(creds) < steps.index(first)


@pytest.mark.parametrize("name", ["preview.yml", "deploy.yml"])
def test_the_region_step_reads_each_stack_files_region(name, tmp_path):
    """The region the role session is opened in is the stack file's own aws:region, read by the step's own
    command (run here with this interpreter for the runner's .venv)."""
    wf = load(name)
    for job in wf["jobs"].values():
        if not pulumi_steps(job):
            continue
        (step,) = [s for s in job["steps"] if s.get("id") == "region"]
        stack = pulumi_steps(job)[0]["with"]["stack-name"]
        stacks = sorted(STACKS) if stack == "${{ matrix.stack }}" else [stack]
        for s in stacks:
            out = tmp_path / f"out-{s}"
            script = step["run"].replace("${{ matrix.stack }}", s).replace(".venv/bin/python", sys.executable)
            r = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env={"GITHUB_OUTPUT": str(out), "PATH": "/usr/bin:/bin"},
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            want = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{s}.yaml").read_text())["config"]["aws:region"]
            assert out.read_text() == f"region={want}\n"


@pytest.mark.parametrize("name", ["preview.yml", "deploy.yml"])
def test_the_tests_job_runs_where_the_gateway_tests_can_run(name):
    """The gateway tests need HAProxy 3.0 (the image's line), which dev.py builds from Debian's source only as
    root on Debian: the job runs in a Debian bookworm container (root by default), as .ci/run's machine; no
    step installs the runner's own HAProxy (Ubuntu's 2.8, which the tests refuse under CI)."""
    job = load(name)["jobs"]["tests"]
    assert job["container"] == "python:3.11-bookworm"
    assert "options" not in job  # a --user option would make dev.py skip the build
    runs = [s.get("run", "") for s in job["steps"]]
    assert any(r.strip() == "python3 dev.py test" for r in runs)
    assert not any("haproxy" in r for r in runs)
