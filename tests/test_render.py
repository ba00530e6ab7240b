"""The offline render (`python -m topology render STACK --out DIR`): complete, valid, deterministic."""

from __future__ import annotations

import copy
import json
import types
from pathlib import Path

import pytest
import yaml

from offline.mockrun import run_program, run_stack_file
from offline.render import cli_main, render
from offline.validate import validate_object, validate_objects
from topology.errors import InputError
from pulumi_support import ROOT, recording


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_every_kubernetes_object_validates_against_its_schema(stack):
    name, _inputs, _spec = stack
    objs = recording(name).kubernetes_objects()
    assert objs
    assert validate_objects(objs) == []


def test_the_validator_rejects_what_the_api_server_would():
    objs = recording("prod").kubernetes_objects()
    so = copy.deepcopy(next(o for o in objs if o["kind"] == "ScaledObject" and any(
        t["type"] == "cron" for t in o["spec"]["triggers"])))
    cron = next(t for t in so["spec"]["triggers"] if t["type"] == "cron")
    cron["metadata"]["desiredReplicas"] = 14  # KEDA wants strings
    assert any("is not of type 'string'" in e for e in validate_object(so))
    so2 = copy.deepcopy(so)
    so2["spec"]["minReplicas"] = 1  # misspelt: would be silently pruned
    assert any("spec.minReplicas: unknown field" in e for e in validate_object(so2))
    dep = copy.deepcopy(next(o for o in objs if o["kind"] == "Deployment"))
    dep["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    assert validate_object(dep)


def test_render_is_byte_identical_across_runs(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert render(run_stack_file(ROOT / "stacks" / "Pulumi.prod.yaml"), first) == []
    prod_only = set(_files(first))
    # a re-render replaces what the last render wrote: files only the prod render had are gone
    assert render(run_stack_file(ROOT / "stacks" / "Pulumi.dev.yaml"), first) == []
    assert render(recording("dev"), second) == []
    assert _files(first) == _files(second)
    assert prod_only - set(_files(second)), "the prod render should have had files dev does not write"


def test_render_never_deletes_or_writes_next_to_files_it_did_not_write(tmp_path):
    out = tmp_path / "out"
    (out / "k8s").mkdir(parents=True)
    (out / "k8s" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"holds 'k8s/notes.txt', which render did not write"):
        render(recording("dev"), out)
    assert (out / "k8s" / "notes.txt").read_text() == "mine" and sorted(p.name for p in out.rglob("*")) == ["k8s", "notes.txt"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(InputError, match="is a file, not a folder"):
        render(recording("dev"), afile)


def test_render_writes_each_object_and_an_inventory_of_every_resource(stack, tmp_path):
    name, _inputs, spec = stack
    rec = recording(name)
    assert cli_main(types.SimpleNamespace(stack=str(ROOT / "stacks" / f"Pulumi.{name}.yaml"), out=str(tmp_path))) == 0
    manifests = sorted((tmp_path / "k8s").glob("*.yaml"))
    assert len(manifests) == len(rec.kubernetes_objects())
    for m in manifests:
        obj = yaml.safe_load(m.read_text())
        assert m.name == f"{obj['kind'].lower()}-{obj['metadata'].get('namespace', 'cluster')}-{obj['metadata']['name']}.yaml"
    inventory = json.loads((tmp_path / "inventory.json").read_text())
    assert sorted((r["type"], r["name"]) for r in inventory) == sorted((r.type, r.name) for r in rec.resources)
    buckets = [r for r in inventory if r["type"] == "aws:s3/bucket:Bucket"]
    assert all(b["protect"] and b["parentType"] == "serving:components:WeightCache" for b in buckets)
    assert {b["inputs"]["bucket"] for b in buckets} == {c.bucket_name for c in spec.weight_caches}
    roles = [r for r in inventory if r["type"] == "aws:iam/role:Role"]
    assert all(isinstance(r["inputs"]["assumeRolePolicy"], dict) for r in roles)  # policies shown as data
    assert f"Inventory of stack `{name}`" in (tmp_path / "inventory.md").read_text()
    outputs = json.loads((tmp_path / "outputs.json").read_text())
    assert outputs["specSha256"] == spec.sha256()


def test_render_of_a_stack_keeps_secrets_out(tmp_path):
    stack_file = ROOT / "stacks" / "Pulumi.prod.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["llm-serving:cluster"] = {"mode": "existing", "stackReference": {"name": "acme/platform/prod"}}
    rec = run_program(
        "prod", doc["config"],
        stack_reference_outputs={"clusterName": "c", "nodeRoleArn": "arn:aws:iam::1:role/n",
                                 "privateSubnetIds": ["s-1"], "kubeconfig": "TOP-SECRET-KUBECONFIG"},
    )
    render(rec, tmp_path)
    assert not any(b"TOP-SECRET-KUBECONFIG" in data for data in _files(tmp_path).values())


def test_command_line_renders_a_stack_and_reports_bad_settings_clearly(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "topology", "render", "stacks/Pulumi.dev.yaml", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (out / "inventory.json").exists() and (out / "k8s").is_dir()

    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    doc["config"]["llm-serving:cluster"]["mode"] = "borrowed"
    bad = tmp_path / "Pulumi.dev.yaml"
    bad.write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "topology", "render", str(bad), "--out", str(tmp_path / "bad")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "cluster.mode = 'borrowed'" in r.stderr and "Traceback" not in r.stderr


def test_the_program_run_by_render_takes_the_inputs_render_validated_and_validates_anything_else():
    """`render` validates the stack's inputs before running the program (one-line errors naming the file), and
    the program validates them again as under `pulumi up`: the same work on the same document, rate traces read
    and warned about twice. Inside render the program's call gets render's result; any other document, folder or
    date is validated as before, and outside render nothing changes."""
    import datetime as dt

    import topology.loading as loading
    from offline.render import _inputs_validated_once, read_stack_file

    _name, config, validated = read_stack_file(str(ROOT / "stacks" / "Pulumi.prod.yaml"))
    doc = json.loads(json.dumps(config["llm-serving:inputs"]))  # what the program is handed (run_program's JSON)
    bad = copy.deepcopy(doc)
    bad["endpoints"][0]["name"] = "Not A Name"
    with _inputs_validated_once(validated):
        same = loading.inputs_from_document(doc, "program", validated.base_dir, today=validated.today)
        next_day = loading.inputs_from_document(doc, "program", validated.base_dir,
                                                today=validated.today + dt.timedelta(days=1))
        with pytest.raises(InputError, match="program: endpoints.0.name"):
            loading.inputs_from_document(bad, "program", validated.base_dir, today=validated.today)
    outside = loading.inputs_from_document(doc, "program", validated.base_dir, today=validated.today)
    assert same is validated.inputs
    assert next_day is not validated.inputs and outside is not validated.inputs
    assert next_day == outside == validated.inputs


def test_render_warns_about_a_rate_trace_once(tmp_path, recwarn):
    from topology.errors import InputNotice

    assert cli_main(types.SimpleNamespace(stack=str(ROOT / "stacks" / "Pulumi.prod.yaml"), out=str(tmp_path))) == 0
    gaps = [w for w in recwarn if issubclass(w.category, InputNotice) and "had no data" in str(w.message)]
    assert len(gaps) == 1 and "stacks/Pulumi.prod.yaml" in str(gaps[0].message)  # was twice, once per reading


def test_a_render_process_leaves_the_last_collection_to_the_os_and_writes_everything_first(tmp_path):
    """The interpreter's exit-time cyclic collection (a full walk of everything a render leaves alive) is skipped:
    what is alive is frozen out of it by an exit handler render's CLI registers once, which runs after the render
    and after exit handlers registered later, and before the interpreter's teardown."""
    import subprocess
    import sys

    code = f"""
import atexit, gc, json, sys, types, warnings
warnings.simplefilter("ignore")
def report():  # registered first, so it runs after render's handler (exit handlers run last in, first out)
    print(json.dumps({{"frozen": gc.get_freeze_count()}}))
atexit.register(report)
from offline.render import cli_main
for out in ("a", "b"):
    assert cli_main(types.SimpleNamespace(stack="stacks/Pulumi.dev.yaml", out={str(tmp_path)!r} + "/" + out)) == 0
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["frozen"] > 50_000  # the SDK classes, the recordings (≈ 150 000 objects): out of the exit collection
    assert _files(tmp_path / "a") == _files(tmp_path / "b") and (tmp_path / "a" / "inventory.json").exists()


def test_render_of_a_cluster_from_a_stack_reference_uses_named_placeholders(tmp_path, capsys):
    """`cluster: {mode: existing, stackReference: {name: ...}}` is a valid stack, but the offline render cannot read
    another stack's outputs: it ended in KeyError 'clusterName' (exit 70; found by this stop's fuzz). The render
    now fills the outputs the settings name with placeholders, says so, and renders."""
    from topology.cli import main

    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text())
    doc["config"]["llm-serving:cluster"] = {"mode": "existing",
                                            "stackReference": {"name": "acme/platform/prod", "clusterNameOutput": "eks"}}
    stack = tmp_path / "Pulumi.prod.yaml"
    stack.write_text(yaml.safe_dump(doc))
    assert main(["render", str(stack), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "rendered with placeholder outputs (eks, kubeconfig, nodeRoleArn, privateSubnetIds)" in err
    # the GPU node groups are declared on the placeholder cluster, named as such
    inventory = json.loads((tmp_path / "out" / "inventory.json").read_text())
    assert "from-stack-reference" in json.dumps(inventory)
