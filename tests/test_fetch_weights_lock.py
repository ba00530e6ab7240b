"""The weight-fetch init container's node-local copy lock and LoRA folder, run for real (sh and bash).

Only `aws s3 sync` is stood in for (a local copy); the lock, the heartbeat, the stale takeover, the bounded
wait and the LoRA folder are the script's own behaviour. Every run has a subprocess timeout, so a script
that waits forever fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

FETCH = Path(__file__).resolve().parent.parent / "components" / "fetch_weights.sh"
SHELLS = [s for s in ("/bin/sh", "/bin/bash") if Path(s).exists()]


def _run(tmp_path: Path, shell: str, *, stale_s: int = 120, wait_max_s: int = 60, lora_dir: str | None = None,
         timeout_s: float = 20) -> subprocess.CompletedProcess:
    source = tmp_path / "bucket"
    source.mkdir(exist_ok=True)
    (source / "model.safetensors").write_text("weights")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake_aws = bin_dir / "aws"
    # `aws s3 sync --only-show-errors --no-progress SRC DEST`: copy a local folder instead
    fake_aws.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "aws-calls"}\nmkdir -p "$6"\ncp -R {source}/. "$6"/\n')
    fake_aws.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "WEIGHTS_URI": "s3://cache/models/m/rev/",
           "LOCAL_DIR": str(tmp_path / "nvme" / "m" / "rev"), "START_JITTER_S": "0",
           "STALE_LOCK_S": str(stale_s), "LOCK_WAIT_MAX_S": str(wait_max_s), "LOCK_POLL_S": "1"}
    if lora_dir is not None:
        env["LORA_DIR"] = lora_dir
    return subprocess.run([shell, str(FETCH)], env=env, capture_output=True, text=True, timeout=timeout_s)


def _lock(tmp_path: Path, age_s: float, heartbeat: bool) -> Path:
    """A lock left by a pod that was killed `age_s` ago (before its first heartbeat when heartbeat=False)."""
    lock = tmp_path / "nvme" / "m" / "rev.lock"
    lock.mkdir(parents=True)
    then = time.time() - age_s
    if heartbeat:
        (lock / "heartbeat").write_text(f"{int(then)}\n")
    os.utime(lock, (then, then))
    return lock


@pytest.mark.parametrize("shell", SHELLS)
def test_lock_without_heartbeat_left_by_a_killed_pod_is_taken_over(tmp_path, shell):
    # the old script read a missing timestamp as 0 and waited forever on such a lock
    _lock(tmp_path, age_s=600, heartbeat=False)
    r = _run(tmp_path, shell, stale_s=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "taking over a stale copy lock" in r.stdout
    assert (tmp_path / "nvme" / "m" / "rev" / ".complete").exists()
    assert not (tmp_path / "nvme" / "m" / "rev.lock").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_lock_with_an_old_heartbeat_is_taken_over(tmp_path, shell):
    _lock(tmp_path, age_s=600, heartbeat=True)
    r = _run(tmp_path, shell, stale_s=120)
    assert r.returncode == 0 and "taking over" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_a_live_neighbours_lock_is_waited_on_for_a_bounded_time_only(tmp_path, shell):
    lock = _lock(tmp_path, age_s=0, heartbeat=True)
    r = _run(tmp_path, shell, stale_s=120, wait_max_s=2)
    assert r.returncode == 1 and "LOCK_WAIT_MAX_S" in r.stderr, r.stdout + r.stderr
    assert lock.exists(), "a live neighbour's lock is not broken"
    assert not (tmp_path / "aws-calls").exists(), "no second copy while the neighbour copies"


@pytest.mark.parametrize("shell", SHELLS)
def test_a_neighbours_finished_copy_is_used(tmp_path, shell):
    _lock(tmp_path, age_s=0, heartbeat=True)
    local = tmp_path / "nvme" / "m" / "rev"
    local.mkdir(parents=True)
    (local / ".complete").touch()
    r = _run(tmp_path, shell)
    assert r.returncode == 0 and not (tmp_path / "aws-calls").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_lora_resolver_folder_exists_after_a_copy_without_adapters(tmp_path, shell):
    # vLLM's filesystem resolver (vllm/plugins/lora_resolvers/filesystem_resolver.py, 0.10–0.13) raises at
    # start unless VLLM_LORA_RESOLVER_CACHE_DIR is an existing directory; S3 copies create no empty folder
    lora = tmp_path / "nvme" / "m" / "rev" / "adapters"
    r = _run(tmp_path, shell, lora_dir=str(lora))
    assert r.returncode == 0, r.stderr
    assert lora.is_dir() and (tmp_path / "nvme" / "m" / "rev" / "model.safetensors").exists()
    # and on a node that already holds the weights (copied before adapters were enabled)
    lora.rmdir()
    r = _run(tmp_path, shell, lora_dir=str(lora))
    assert r.returncode == 0 and "already on this node" in r.stdout and lora.is_dir()


def test_rendered_fetch_container_gets_the_lora_folder_and_bounded_lock_settings():
    from pulumi_support import recording

    objs = recording("prod").kubernetes_objects()
    deployments = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-vllm")]
    assert deployments
    for d in deployments:
        (fetch,) = d["spec"]["template"]["spec"]["initContainers"]
        env = {e["name"]: e["value"] for e in fetch["env"]}
        assert int(env["STALE_LOCK_S"]) > 0 and int(env["LOCK_WAIT_MAX_S"]) > 0
        (engine,) = d["spec"]["template"]["spec"]["containers"]
        engine_env = {e["name"]: e.get("value") for e in engine["env"]}
        if "VLLM_LORA_RESOLVER_CACHE_DIR" in engine_env:
            assert env["LORA_DIR"] == engine_env["VLLM_LORA_RESOLVER_CACHE_DIR"]
        else:
            assert "LORA_DIR" not in env


# ── IAM: role policies as their own resources (pulumi-aws 7 deprecates a Role's inline_policies) ────────


@pytest.mark.parametrize("stack_name", ["dev", "prod"])
def test_roles_carry_no_inline_policies_and_each_gets_its_role_policy(stack_name):
    import json

    from pulumi_support import recording

    rec = recording(stack_name)
    roles = rec.of_type("aws:iam/role:Role")
    assert roles
    # the deprecated argument, on any role of the program
    assert [r.name for r in roles if r.inputs.get("inlinePolicies")] == []
    policies = {p.name: p for p in rec.of_type("aws:iam/rolePolicy:RolePolicy")}
    exclusive = {p.name: p for p in rec.of_type("aws:iam/rolePoliciesExclusive:RolePoliciesExclusive")}
    for role in roles:
        if role.name.endswith(("-control-plane-role", "-node-role")):
            continue  # the cluster's roles attach AWS-managed policies only
        policy = policies.get(f"{role.name}-policy")
        assert policy is not None, f"{role.name} has no RolePolicy"
        doc = json.loads(policy.inputs["policy"])
        assert doc["Version"] == "2012-10-17" and doc["Statement"]
        (names,) = [e.inputs["policyNames"] for n, e in exclusive.items() if n == f"{role.name}-policies"]
        assert names == [policy.inputs["name"]]
