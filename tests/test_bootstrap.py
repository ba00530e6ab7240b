"""First `pulumi up` on an empty account (issue #11 item 1): the weights are seeded into each new cache, and
the engine Deployments and the Modal deploy wait for them; the Modal Volume is filled before the deploy.

Pulumi's engine starts a resource only when its dependencies are done; a child's registration waits for its
parent component, whose registration waits for the component's `depends_on`. So "waits for X" below means X is
among the resource's dependencies or its parent component's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from ops.seed_weights import MANIFEST_NAME
from tests.moto_support import client  # the fixtures moto_endpoint and aws_env: conftest.py
from tests.pulumi_support import recording

ROOT = Path(__file__).resolve().parent.parent


def waits_for(rec, resource) -> set[str]:
    """Names of what a resource waits for: its dependencies and its ancestors' (transitively)."""
    names: set[str] = set()
    todo = [resource]
    while todo:
        r = todo.pop()
        for urn in r.dependencies:
            names.add(urn.rsplit("::", 1)[1])
            dep = rec.by_urn(urn)
            if dep is not None:
                todo.append(dep)
        parent = rec.by_urn(r.parent) if r.parent else None
        if parent is not None:
            todo.append(parent)
    return names


def commands(rec) -> dict[str, object]:
    return {r.name: r for r in rec.of_type("command:local:Command")}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_engines_and_modal_deploys_wait_for_the_seeded_weights(stack):
    rec = recording(stack)
    spec = rec.outputs["spec"]
    cmds = commands(rec)
    for cache in spec["weight_caches"]:
        seed = cmds[f"weights-{cache['region']}-seed-copy"]
        argv = shlex.split(seed.inputs["create"])
        assert argv[1:3] == ["-m", "ops.seed_weights"]
        assert argv[argv.index("--dest-bucket") + 1] == cache["bucket_name"]
        assert argv[argv.index("--source-bucket") + 1] == cache["source_bucket"]
        assert sorted(argv[i + 1] for i, a in enumerate(argv) if a == "--prefix") == sorted(cache["model_prefixes"])
        # an update runs the same copy (never replace = create-new-then-delete-old); nothing is deleted
        assert seed.inputs["update"] == seed.inputs["create"] and not seed.inputs.get("delete")
        # it copies into the bucket once the bucket is versioned and encrypted
        assert {f"weights-{cache['region']}-bucket", f"weights-{cache['region']}-versioning",
                f"weights-{cache['region']}-encryption"} <= waits_for(rec, seed)
        # ... and not for the cluster: dev's new cluster takes minutes, the copy runs meanwhile
        assert not any(n.startswith("cluster-") for n in waits_for(rec, seed))

    deployments = [r for r in rec.of_type("kubernetes:apps/v1:Deployment") if r.name.startswith("floor-")]
    # every engine Deployment: each floor endpoint's stable track, and a rollout's candidate or warm N−1 track
    assert {f"floor-{e['name']}-deployment" for e in spec["endpoints"] if e["node_pools"]} <= {d.name for d in deployments}
    for d in deployments:
        assert f"weights-{spec['cluster_region']}-seed-copy" in waits_for(rec, d), d.name

    bursts = [e for e in spec["endpoints"] if e["burst"]]
    assert bursts
    for e in bursts:
        deploy, fill = cmds[f"{e['name']}-burst-deploy"], cmds[f"{e['name']}-burst-weights"]
        assert "-m modal_apps.weights sync" in fill.inputs["create"] and fill.inputs["update"] == fill.inputs["create"]
        assert not fill.inputs.get("delete")  # the volume keeps its weights
        assert f"{e['name']}-burst-weights" in waits_for(rec, deploy)
        assert f"weights-{e['burst']['weights_region']}-seed-copy" in waits_for(rec, fill)
        burst_spec = json.loads(fill.inputs["environment"]["LLM_SERVING_BURST_SPEC"])
        assert burst_spec["burst"]["volume_name"] == e["burst"]["volume_name"]


def test_the_rendered_seed_command_fills_the_cache_from_the_source(aws_env, moto_endpoint):
    """Run exactly the command `pulumi up` would run for prod's cache, against moto."""
    rec = recording("prod")
    [cache] = rec.outputs["spec"]["weight_caches"]
    seed = commands(rec)[f"weights-{cache['region']}-seed-copy"]
    s3 = client("s3", moto_endpoint)
    existing = {b["Name"] for b in s3.list_buckets()["Buckets"]}  # one moto server per session
    for b in (cache["source_bucket"], cache["bucket_name"]):
        if b not in existing:
            s3.create_bucket(Bucket=b)
    for prefix in cache["model_prefixes"]:
        files = {"config.json": prefix.encode(), "model.safetensors": os.urandom(2048)}
        for rel, data in files.items():
            s3.put_object(Bucket=cache["source_bucket"], Key=prefix + rel, Body=data)
        s3.put_object(Bucket=cache["source_bucket"], Key=prefix + MANIFEST_NAME, Body="".join(
            f"{hashlib.sha256(d).hexdigest()}  {r}\n" for r, d in sorted(files.items())).encode())

    env = {**os.environ, **aws_env, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(seed.inputs["create"], shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["copied"] == 3 * len(cache["model_prefixes"])
    for prefix in cache["model_prefixes"]:
        listed = s3.list_objects_v2(Bucket=cache["bucket_name"], Prefix=prefix)["Contents"]
        assert {o["Key"][len(prefix):] for o in listed} == {"config.json", "model.safetensors", MANIFEST_NAME}
    again = subprocess.run(seed.inputs["update"], shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout)["copied"] == 0
