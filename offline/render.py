"""`python -m topology render STACK --out DIR`: what `helm template` is to Helm, for this Pulumi program.

Runs `__main__.py` for the stack under Pulumi's mocks and writes
  DIR/k8s/<kind>-<namespace>-<name>.yaml   every Kubernetes object, one per file
  DIR/helm/<namespace>-<release>.yaml      each Helm release: chart, version, repository, values
  DIR/inventory.json, DIR/inventory.md     every resource: type, name, parent, options, inputs
  DIR/outputs.json                         the stack outputs (spec, cost report, buckets, endpoints)
Every Kubernetes object is validated (offline/validate.py). Same inputs → byte-identical files.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from .mockrun import Recording, RecordedResource, read_stack_config, run_stack_file
from .validate import validate_objects

class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, embedded configs) as literal blocks, so a reviewer reads them as files."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=True, width=120, allow_unicode=True)


OWNED = ("k8s", "helm", "inventory.json", "inventory.md", "outputs.json")


def _readable(value: Any) -> Any:
    """JSON documents embedded as strings (IAM policies, kubeconfigs) shown as data."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return _readable(json.loads(value))
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: _readable(v) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [_readable(v) for v in value]
    return value


def _urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1] if urn else ""


def manifest_filename(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return f"{obj['kind'].lower()}-{meta.get('namespace') or 'cluster'}-{meta['name']}.yaml"


def inventory(rec: Recording) -> list[dict[str, Any]]:
    """One entry per resource, ordered by URN (the component tree)."""
    names = {r.urn: r for r in rec.resources}
    rows = []
    for r in rec.resources:
        parent = names.get(r.parent)
        row: dict[str, Any] = {
            "type": r.type,
            "name": r.name,
            "parent": parent.name if parent else "",
            "parentType": parent.type if parent else "",
            "protect": r.protect,
            "ignoreChanges": list(r.ignore_changes),
            "dependsOn": sorted(_urn_name(d) for d in r.dependencies),
        }
        if r.is_kubernetes_object:
            row["manifest"] = f"k8s/{manifest_filename(r.inputs)}"
        elif r.custom:
            row["inputs"] = _readable(r.inputs)
        rows.append(row)
    return rows


def _summary(r: RecordedResource) -> str:
    """The one or two inputs a reviewer looks for first, per resource type."""
    i = r.inputs
    t = r.type
    picks: list[str] = []
    if t == "aws:eks/nodeGroup:NodeGroup":
        sc = i.get("scalingConfig", {})
        picks = [f"{i.get('instanceTypes')}", f"{i.get('amiType')}", f"min {sc.get('minSize')} max {sc.get('maxSize')}",
                 f"labels {json.dumps(i.get('labels'), sort_keys=True)}"]
    elif t == "aws:s3/bucket:Bucket":
        picks = [f"bucket {i.get('bucket')}", f"region {i.get('region')}"]
    elif t == "aws:s3/bucketVersioning:BucketVersioning":
        picks = [f"versioning {i.get('versioningConfiguration', {}).get('status')}"]
    elif t == "aws:iam/role:Role":
        picks = [str(i.get("description", ""))]
    elif t == "kubernetes:helm.sh/v3:Release":
        picks = [f"{i.get('chart')} {i.get('version')}", f"namespace {i.get('namespace')}"]
    elif r.is_kubernetes_object:
        m = i.get("metadata", {})
        picks = [f"{i.get('kind')} {m.get('namespace', '')}/{m.get('name')}"]
    elif t == "aws:eks/podIdentityAssociation:PodIdentityAssociation":
        picks = [f"{i.get('namespace')}/{i.get('serviceAccount')}"]
    return "; ".join(p.replace("|", "/") for p in picks)


def inventory_markdown(rec: Recording) -> str:
    names = {r.urn: r.name for r in rec.resources}
    lines = [
        f"# Inventory of stack `{rec.stack}` (offline render under Pulumi mocks)",
        "",
        f"{len(rec.resources)} resources, {sum(r.is_kubernetes_object for r in rec.resources)} of them Kubernetes objects.",
        "",
        "| type | name | parent | protect | summary |",
        "|---|---|---|---|---|",
    ]
    for r in rec.resources:
        lines.append(f"| `{r.type}` | {r.name} | {names.get(r.parent, '')} | {'yes' if r.protect else ''} | {_summary(r)} |")
    return "\n".join(lines) + "\n"


def _dump_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render(rec: Recording, out: Path) -> list[str]:
    """Write the render of a recording into `out`; returns the validation errors (empty when all valid)."""
    out.mkdir(parents=True, exist_ok=True)
    for owned in OWNED:  # stale files from an earlier render would make the output depend on history
        p = out / owned
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    objs = rec.kubernetes_objects()
    (out / "k8s").mkdir()
    for obj in objs:
        (out / "k8s" / manifest_filename(obj)).write_text(dump_yaml(obj))
    releases = rec.of_type("kubernetes:helm.sh/v3:Release")
    if releases:
        (out / "helm").mkdir()
        for r in releases:
            body = {k: r.inputs.get(k) for k in ("name", "chart", "version", "repositoryOpts", "namespace", "values")}
            (out / "helm" / f"{r.inputs.get('namespace')}-{r.inputs.get('name')}.yaml").write_text(
                dump_yaml(body)
            )
    (out / "inventory.json").write_text(_dump_json(inventory(rec)))
    (out / "inventory.md").write_text(inventory_markdown(rec))
    (out / "outputs.json").write_text(_dump_json(rec.outputs))
    return validate_objects(objs)


def policies_allow(rec: Recording, stack_file: str | Path) -> bool:
    """The policy pack's rules (policies/rules.py) over the recording, as `pulumi preview --policy-pack
    policies` would run them: advisories are printed, a mandatory violation refuses the render."""
    from policies.recorded import check_recording, split

    _stack, config = read_stack_config(stack_file)
    mandatory, advisory = split(check_recording(rec, config))
    for v in advisory:
        print(f"advisory [{v.policy}]: {v.message}")
    for v in mandatory:
        print(f"error: policy {v.policy} (mandatory): {v.message}", file=sys.stderr)
    if mandatory:
        print(f"{stack_file}: render refused: {len(mandatory)} mandatory policy violation(s); nothing written",
              file=sys.stderr)
    return not mandatory


def cli_main(args: Any) -> int:
    from topology.catalog import MigLayoutError

    try:
        rec = run_stack_file(args.stack)
    except MigLayoutError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not policies_allow(rec, args.stack):
        return 2
    out = Path(args.out)
    errors = render(rec, out)
    n_k8s = sum(r.is_kubernetes_object for r in rec.resources)
    print(f"{args.stack}: {len(rec.resources)} resources, {n_k8s} Kubernetes objects -> {out}")
    if errors:
        print(f"{len(errors)} schema error(s):", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    print("all Kubernetes objects valid against the Kubernetes and CRD schemas")
    return 0
