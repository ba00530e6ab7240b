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


PREFIX = "s3://cache/models/m/rev/"


def _bucket(tmp_path: Path, files: dict[str, str] | None = None, manifest: bool = True) -> Path:
    """The cache prefix as a local folder: the files, and SHA256SUMS listing them (as the seed writes it, last)."""
    source = tmp_path / "bucket"
    source.mkdir(exist_ok=True)
    files = {"model.safetensors": "weights"} if files is None else files
    for rel, text in files.items():
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_text(text)
    if manifest:
        listed = sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
        (source / "SHA256SUMS").write_text("".join(f"{'0' * 64}  {rel}\n" for rel in listed))
    return source


def _env(tmp_path: Path, *, stale_s: int = 120, wait_max_s: int = 60, lora_dir: str | None = None,
         lora: bool = False, jitter_s: int = 0, credentials: bool = True) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake_aws = bin_dir / "aws"
    source = tmp_path / "bucket"
    # `aws s3 sync --only-show-errors --no-progress SRC DEST`: copy the matching local folder instead
    fake_aws.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "aws-calls"}\nrel="${{5#{PREFIX}}}"\n'
                        f'mkdir -p "$6"\nif [ -d "{source}/$rel" ]; then cp -R "{source}/$rel/." "$6"/; fi\n')
    fake_aws.chmod(0o755)
    local = tmp_path / "nvme" / "m" / "rev"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "WEIGHTS_URI": PREFIX,
           "LOCAL_DIR": str(local), "START_JITTER_S": str(jitter_s),
           "STALE_LOCK_S": str(stale_s), "LOCK_WAIT_MAX_S": str(wait_max_s), "LOCK_POLL_S": "1"}
    for k in ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ACCESS_KEY_ID"):
        env.pop(k, None)
    if credentials:  # what EKS Pod Identity's webhook adds to a pod it admits
        env["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = "http://169.254.170.23/v1/credentials"
    if lora_dir is not None:
        env["LORA_DIR"] = lora_dir
    if lora:  # as the rendered floor passes them (components/floor_replicas.py lora_dir_env)
        env.update(LORA_DIR=f"{local}.lora", LORA_SRC=f"{local}/adapters", ADAPTERS_URI=f"{PREFIX}adapters/")
    return env


def _run(tmp_path: Path, shell: str, *, timeout_s: float = 20, **kw) -> subprocess.CompletedProcess:
    if not (tmp_path / "bucket").exists():
        _bucket(tmp_path)
    return subprocess.run([shell, str(FETCH)], env=_env(tmp_path, **kw), capture_output=True, text=True,
                          timeout=timeout_s)


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


# ── a floor pod's start, beyond the lock: credentials, completeness, signals, LoRA adapters ──────────────

ADAPTER_CONFIG = {"peft_type": "LORA", "base_model_name_or_path": "meta-llama/Llama-3.3-70B-Instruct", "r": 16,
                  "target_modules": ["q_proj", "v_proj"]}


def _adapter(name: str) -> dict[str, str]:
    import json

    return {f"adapters/{name}/adapter_config.json": json.dumps(ADAPTER_CONFIG, indent=2),
            f"adapters/{name}/adapter_model.safetensors": f"lora weights of {name}"}


@pytest.mark.parametrize("shell", SHELLS)
def test_adapters_resolve_on_the_engines_local_model_and_new_ones_arrive_at_the_next_start(tmp_path, shell):
    """vLLM loads an adapter only when its config names the engine's model (the local path) as its base: the
    published config names the hub id, so the resolver's folder holds a copy naming the local copy. An adapter
    published later reaches a node that already holds the weights at its next pod start."""
    import json

    from tests.vllm_lora_resolver import resolves

    _bucket(tmp_path, {"model.safetensors": "weights", **_adapter("tenant-a")})
    r = _run(tmp_path, shell, lora=True)
    assert r.returncode == 0, r.stdout + r.stderr
    local = tmp_path / "nvme" / "m" / "rev"
    view, published = f"{local}.lora", local / "adapters"
    assert resolves(view, str(local), "tenant-a")
    assert not resolves(str(published), str(local), "tenant-a")  # as published: a 404 for every request
    assert json.loads((published / "tenant-a" / "adapter_config.json").read_text()) == ADAPTER_CONFIG  # kept as published
    weights = Path(view) / "tenant-a" / "adapter_model.safetensors"
    assert weights.stat().st_ino == (published / "tenant-a" / "adapter_model.safetensors").stat().st_ino  # linked
    assert "published for meta-llama/Llama-3.3-70B-Instruct" in r.stdout

    _bucket(tmp_path, _adapter("tenant-b"))  # published after this node copied the revision
    time.sleep(1.1)  # the first builds are now older than STALE_LOCK_S=0: unreferenced ones are removed
    r = _run(tmp_path, shell, lora=True, stale_s=0)
    assert r.returncode == 0 and "already on this node" in r.stdout, r.stdout + r.stderr
    assert resolves(view, str(local), "tenant-b") and resolves(view, str(local), "tenant-a")
    # each adapter a link to its built folder; no other folder is left (the first build of tenant-a is gone)
    links = {p.name: os.readlink(p) for p in Path(view).iterdir() if p.is_symlink()}
    assert set(links) == {"tenant-a", "tenant-b"}
    assert {p.name for p in Path(view).iterdir() if not p.is_symlink()} == set(links.values())


@pytest.mark.parametrize("shell", SHELLS)
def test_a_copy_missing_files_its_manifest_lists_is_not_marked_complete(tmp_path, shell):
    source = _bucket(tmp_path, {"model.safetensors": "weights", "config.json": "{}"})
    (source / "config.json").unlink()  # the manifest arrived before this file (replication is in no order)
    r = _run(tmp_path, shell)
    assert r.returncode == 1 and "missing from the copy: config.json" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "nvme" / "m" / "rev" / ".complete").exists()
    assert not (tmp_path / "nvme" / "m" / "rev.lock").exists()  # the lock is released for the retry
    (source / "config.json").write_text("{}")  # the cache has filled: the kubelet's retry completes
    r = _run(tmp_path, shell)
    assert r.returncode == 0 and (tmp_path / "nvme" / "m" / "rev" / ".complete").exists(), r.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_a_cache_without_a_manifest_is_refused(tmp_path, shell):
    _bucket(tmp_path, manifest=False)
    r = _run(tmp_path, shell)
    assert r.returncode == 1 and "no SHA256SUMS" in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_a_pod_without_credentials_says_to_delete_it_before_waiting_or_copying(tmp_path, shell):
    r = _run(tmp_path, shell, credentials=False)
    assert r.returncode == 1 and "Delete the pod" in r.stderr, r.stdout + r.stderr
    assert "start jitter" not in r.stdout and not (tmp_path / "aws-calls").exists()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.parametrize("shell", SHELLS)
def test_as_pid_1_a_pod_deleted_while_waiting_stops_at_once(tmp_path, shell):
    """The script is its container's PID 1, where a signal without a handler is ignored: before the trap, a pod
    deleted during the start jitter or a neighbour's copy slept on and copied the weights until the kubelet's
    SIGKILL at the end of the grace period (minutes). Run as PID 1 of a new PID namespace (unshare, as root)."""
    import shutil
    import signal

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a PID namespace needs root and util-linux unshare")
    _bucket(tmp_path)
    _lock(tmp_path, age_s=0, heartbeat=True)  # a neighbour is copying: this pod waits
    proc = subprocess.Popen(["unshare", "--pid", "--fork", shell, str(FETCH)], env=_env(tmp_path, wait_max_s=120),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not _children(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (script,) = _children(proc.pid)
        time.sleep(1.5)  # waiting on the neighbour's lock
        started = time.monotonic()
        os.kill(script, signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert took < 3, f"still running {took:.1f}s after SIGTERM"
    assert not (tmp_path / "aws-calls").exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_pods_starting_together_on_a_node_build_the_adapters_once_each_and_leave_the_published_ones_intact(
        tmp_path, shell):
    """Pods starting on one node at once (a scale-up, guard's 7 slices per node) all reach the adapters at the same
    moment. As PID 1 of their containers their $$ is 1 in every pod, so folders named by it collided: an init
    container failed and a published adapter_config.json was truncated through a hard link. Run as PID 1 of
    separate PID namespaces where possible (unshare, as root), otherwise as plain processes."""
    import json
    import shutil

    from tests.vllm_lora_resolver import resolves

    adapters = {}
    for i in range(12):
        adapters.update(_adapter(f"tenant-{i}"))
        adapters[f"adapters/tenant-{i}/tokenizer.json"] = "{}"
    _bucket(tmp_path, {"model.safetensors": "weights", **adapters})
    r = _run(tmp_path, shell, lora=True)  # the node's first pod copies the revision
    assert r.returncode == 0, r.stderr
    as_pid_1 = os.geteuid() == 0 and shutil.which("unshare") is not None
    prefix = ["unshare", "--pid", "--fork"] if as_pid_1 else []
    env = _env(tmp_path, lora=True)
    for _ in range(3):
        procs = [subprocess.Popen([*prefix, shell, str(FETCH)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
        outs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0, 0], [err for _, err in outs]
    local = tmp_path / "nvme" / "m" / "rev"
    view = f"{local}.lora"
    for i in range(12):
        assert resolves(view, str(local), f"tenant-{i}")
        assert json.loads((local / "adapters" / f"tenant-{i}" / "adapter_config.json").read_text()) == ADAPTER_CONFIG
    assert not (tmp_path / "nvme" / "m" / "rev.adapters.lock").exists()
    builds = [p for p in Path(view).iterdir() if not p.is_symlink()]
    assert len(builds) >= 12 and all(p.name.startswith(".tenant-") for p in builds)  # older ones go when stale


@pytest.mark.parametrize("shell", SHELLS)
def test_an_adapter_config_the_rewrite_cannot_read_is_skipped_with_a_reason(tmp_path, shell):
    import json

    from tests.vllm_lora_resolver import resolves

    odd = {**ADAPTER_CONFIG, "base_model_name_or_path": None}
    _bucket(tmp_path, {"model.safetensors": "weights", **_adapter("good"),
                       "adapters/odd/adapter_config.json": json.dumps(odd),
                       "adapters/odd/adapter_model.safetensors": "w"})
    r = _run(tmp_path, shell, lora=True)
    assert r.returncode == 0, r.stderr
    local = tmp_path / "nvme" / "m" / "rev"
    assert resolves(f"{local}.lora", str(local), "good")
    assert not (Path(f"{local}.lora") / "odd").exists()
    assert "adapter odd: could not point adapter_config.json's base_model_name_or_path" in r.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_a_link_left_by_a_pod_killed_mid_swap_blocks_no_later_start(tmp_path, shell):
    """A pod killed between making an adapter's link and renaming it into place leaves the link behind: later pods
    name their own links and remove a stale one (with the old fixed name every later start on the node failed)."""
    from tests.vllm_lora_resolver import resolves

    _bucket(tmp_path, {"model.safetensors": "weights", **_adapter("tenant-a")})
    local = tmp_path / "nvme" / "m" / "rev"
    view = Path(f"{local}.lora")
    view.mkdir(parents=True)
    for left in (".tenant-a.link", ".tenant-a.1700000000000000000.link"):
        (view / left).symlink_to(".tenant-a.1700000000000000000")
        os.utime(view / left, (time.time() - 600, time.time() - 600), follow_symlinks=False)
    r = _run(tmp_path, shell, lora=True, stale_s=120)
    assert r.returncode == 0, r.stderr
    assert resolves(str(view), str(local), "tenant-a")
    assert not os.path.lexists(view / ".tenant-a.1700000000000000000.link")
