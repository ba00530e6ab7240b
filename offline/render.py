"""`python -m topology render STACK --out DIR`: what `helm template` is to Helm, for this Pulumi program.

Runs `__main__.py` for the stack under Pulumi's mocks and writes
  DIR/k8s/<kind>-<namespace>-<name>.yaml   every Kubernetes object, one per file
  DIR/helm/<namespace>-<release>.yaml      each Helm release: chart, version, repository, values
  DIR/inventory.json, DIR/inventory.md     every resource: type, name, parent, options, inputs
  DIR/outputs.json                         the stack outputs (spec, cost report, buckets, endpoints)
  DIR/.llm-serving-render.json             what this render wrote (the only files a re-render removes)
Every Kubernetes object is validated (offline/validate.py), and every name and label the schemas only
type as strings is checked against its syntax (offline/names_check.py). Same inputs → byte-identical files.

The output folder is the user's: render refuses a folder holding files it did not write, and on a
re-render removes only the files its previous run listed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from topology.errors import InputError

from .mockrun import Recording, RecordedResource, run_program
from .validate import validate_objects

class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Multi-line strings (scripts, embedded configs) as literal blocks, so a reviewer reads them as files.
    libyaml's emitter when PyYAML has it (the wheels do): the same YAML, several times faster to write."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(value: Any) -> str:
    text = yaml.dump(value, Dumper=_Dumper, sort_keys=True, width=120, allow_unicode=True)
    # libyaml closes a document holding a keep-chomped block ("|+") with an explicit end marker; one document
    # per file ends at the end of the file anyway, so the marker goes (the files read as before)
    return text[:-4] if text.endswith("\n...\n") else text


OWNED = ("k8s", "helm", "inventory.json", "inventory.md", "outputs.json")
MANIFEST = ".llm-serving-render.json"


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


def _previous_files(out: Path) -> list[str]:
    """Files an earlier render wrote into `out` (from its manifest); refuses a folder holding anything else."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {str(out)!r}: is a file, not a folder; name a new or empty folder")
    if not out.exists():
        return []
    previous: list[str] = []
    manifest = out / MANIFEST
    if manifest.is_file():
        from topology.reading import loads_json, read_text

        doc = loads_json(read_text(manifest), str(manifest))
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise InputError(f"{manifest}: not a render manifest (expected {{'files': [paths]}}); remove the folder")
        for f in files:
            parts = PurePosixPath(f).parts
            if not parts or PurePosixPath(f).is_absolute() or ".." in parts or parts[0] not in OWNED:
                raise InputError(f"{manifest}: lists {f!r}, which render never writes; remove the folder")
        previous = files
    known = set(previous)
    foreign = _first_foreign(out, known)
    if foreign is not None:
        raise InputError(
            f"--out {str(out)!r}: holds {foreign!r}, which render did not write; render into a new or empty "
            "folder (it never deletes files it did not write)"
        )
    return previous


def _first_foreign(out: Path, known: set[str]) -> str | None:
    """The first entry under `out` that is neither a file listed in `known` nor one of render's folders."""
    stack = [("", out)]
    while stack:
        rel, d = stack.pop()
        with os.scandir(d) as it:
            for entry in it:
                r = f"{rel}{entry.name}"
                if r == MANIFEST:
                    continue
                if entry.is_dir(follow_symlinks=False) and r in ("k8s", "helm"):
                    stack.append((r + "/", Path(entry.path)))
                elif r not in known or not entry.is_file(follow_symlinks=False):
                    return r
    return None


def render(rec: Recording, out: Path) -> list[str]:
    """Write the render of a recording into `out`; returns the validation errors (empty when all valid).

    Files listed by a previous render's manifest are replaced (so the output never depends on history);
    a folder holding anything else is refused with an InputError before anything is written."""
    previous = _previous_files(out)
    objs = rec.kubernetes_objects()
    files: dict[str, str] = {f"k8s/{manifest_filename(obj)}": dump_yaml(obj) for obj in objs}
    for r in rec.of_type("kubernetes:helm.sh/v3:Release"):
        body = {k: r.inputs.get(k) for k in ("name", "chart", "version", "repositoryOpts", "namespace", "values")}
        files[f"helm/{r.inputs.get('namespace')}-{r.inputs.get('name')}.yaml"] = dump_yaml(body)
    files["inventory.json"] = _dump_json(inventory(rec))
    files["inventory.md"] = inventory_markdown(rec)
    files["outputs.json"] = _dump_json(rec.outputs)
    out.mkdir(parents=True, exist_ok=True)
    for rel in previous:
        (out / rel).unlink(missing_ok=True)
    for d in ("k8s", "helm"):
        if (out / d).is_dir() and not any((out / d).iterdir()):
            (out / d).rmdir()
    # the manifest first: a render stopped half-way still lists every file it may have written
    (out / MANIFEST).write_text(_dump_json({"files": sorted(files)}))
    for rel, text in files.items():
        (out / rel).parent.mkdir(exist_ok=True)
        (out / rel).write_text(text)
    return validate_objects(objs)


def policies_allow(rec: Recording, stack_file: str | Path, config: dict[str, Any]) -> bool:
    """The policy pack's rules (policies/rules.py) over the recording, as `pulumi preview --policy-pack
    policies` would run them: advisories are printed, a mandatory violation refuses the render."""
    from policies.recorded import check_recording, split

    mandatory, advisory = split(check_recording(rec, config))
    for v in advisory:
        print(f"advisory [{v.policy}]: {v.message}")
    for v in mandatory:
        print(f"error: policy {v.policy} (mandatory): {v.message}", file=sys.stderr)
    if mandatory:
        print(f"{stack_file}: render refused: {len(mandatory)} mandatory policy violation(s); nothing written",
              file=sys.stderr)
    return not mandatory


def read_stack_file(path: str) -> tuple[str, dict[str, Any], ValidatedInputs]:
    """(stack name, config, its validated inputs) of a Pulumi stack file, read like every other input (bounded,
    one-line errors), its inputs validated exactly as `plan` validates them (dated against today)."""
    from topology.loading import CONFIG_KEY_SUFFIX, inputs_from_document, project_root
    from topology.reading import read_document

    p = Path(path)
    doc = read_document(p)
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        looks_like_inputs = isinstance(doc, dict) and "endpoints" in doc
        raise InputError(
            f"{p}: not a Pulumi stack file (no top-level 'config' mapping)"
            + ("; it looks like a plain inputs file: `plan` reads those, `render` needs a stack file with "
               "config: {llm-serving:inputs: ..., llm-serving:cluster: ...}" if looks_like_inputs else "")
        )
    if not any(str(k).endswith(CONFIG_KEY_SUFFIX) for k in doc["config"]):
        raise InputError(f"{p}: config has no 'llm-serving{CONFIG_KEY_SUFFIX}' key (the cost inputs)")
    # what load_inputs(p) does for a stack file, on the document read above (reading it is a third of the cost)
    from topology.cli import today as utc_today

    today = utc_today()  # the CLI's one clock read (UTC)
    inputs = inputs_from_document(doc, str(p), project_root(), today)
    from topology.inputs import prices_age_warning

    if (w := prices_age_warning(inputs.prices.prices_as_of, today)) is not None:
        print(f"warning: {w}", file=sys.stderr)
    name = p.name.removeprefix("Pulumi.").removesuffix(".yaml").removesuffix(".yml")
    return name, doc["config"], ValidatedInputs(doc["config"], project_root(), today, inputs)


@dataclass(frozen=True)
class ValidatedInputs:
    """A stack's inputs as read_stack_file validated them: the config they came from, the folder trace paths
    resolve against, the date they were checked on, and the result."""

    config: dict[str, Any]
    base_dir: Path
    today: dt.date
    inputs: Any  # topology.inputs.CostInputs


INPUTS_CONFIG_KEY = "llm-serving:inputs"  # the key the program reads (`config.require_object("inputs")`)


@contextlib.contextmanager
def _inputs_validated_once(validated: ValidatedInputs) -> Iterator[None]:
    """The program validates the stack's inputs again (`inputs_from_document` on its config, as under `pulumi
    up`): the same function on the same document, folder and date as read_stack_file just ran, which reads the
    rate traces again and warns about them a second time. While the program runs, that call is answered with
    read_stack_file's result; any other call (another document, folder or date: replication_destinations'
    other stacks) validates as before. The document the program is handed is the config value after the JSON
    round trip run_program gives it, so that is what is compared."""
    import topology.loading as loading

    try:
        document = json.loads(json.dumps(validated.config[INPUTS_CONFIG_KEY]))
    except (KeyError, TypeError, ValueError):  # no such key, or not JSON: the program fails or validates itself
        yield
        return
    original = loading.inputs_from_document

    def inputs_from_document(doc: Any, source: str, base_dir: Path, today: dt.date | None = None) -> Any:
        if today == validated.today and Path(base_dir) == validated.base_dir and doc == document:
            return validated.inputs
        return original(doc, source, base_dir, today)

    loading.inputs_from_document = inputs_from_document
    try:
        yield
    finally:
        loading.inputs_from_document = original


def _program_error(e: BaseException) -> str | None:
    """The one-line message for an error the program raises on bad config, or None for a bug."""
    import pulumi

    from components.modal_burst import ModalTokenError
    from topology.catalog import MigLayoutError
    from topology.plan import PlanningError

    if isinstance(e, (InputError, PlanningError, MigLayoutError, ModalTokenError, pulumi.RunError)):
        return str(e)
    if isinstance(e, (pulumi.ConfigMissingError, pulumi.ConfigTypeError)):
        return " ".join(str(e).split())
    return None


def stack_reference_placeholders(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(the stack's name, outputs) for a cluster taken from another stack (`cluster.stackReference`), which the
    offline render cannot read: placeholders under the output names the settings give (their defaults included),
    plainly named as such (the render ended in a KeyError on the missing output). None when the cluster is not
    from a stack reference, or the reference is not valid (the program then says why)."""
    from pydantic import ValidationError

    from components.stack_settings import StackReferenceSettings

    cluster = config.get("llm-serving:cluster")
    try:
        ref = StackReferenceSettings.model_validate(cluster["stackReference"])
    except (TypeError, KeyError, ValidationError):
        return None
    return ref.name, {ref.cluster_name_output: "from-stack-reference",
                      ref.node_role_arn_output: "arn:aws:iam::000000000000:role/from-stack-reference",
                      ref.subnet_ids_output: ["subnet-0fromstackref1", "subnet-0fromstackref2"],
                      ref.kubeconfig_output: "placeholder kubeconfig: the render reads no cluster"}


def cli_main(args: Any) -> int:
    from topology.cli import skip_exit_collection

    skip_exit_collection()  # a one-shot process; the files are written and closed before exit
    out_arg = str(args.out)
    if not out_arg.strip():
        print("error: --out '': name an output folder, e.g. --out out/render", file=sys.stderr)
        return 2
    out = Path(out_arg)
    try:
        _previous_files(out)  # refuse a bad folder before minutes of work, and again when writing
        stack, config, validated = read_stack_file(args.stack)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reference = stack_reference_placeholders(config)
    placeholders = reference[1] if reference else None
    if reference:
        print(f"cluster from stack reference {reference[0]!r}: rendered with placeholder outputs "
              f"({', '.join(sorted(placeholders))}); `pulumi preview` reads the real ones", file=sys.stderr)
    try:
        with _inputs_validated_once(validated):
            rec = run_program(stack, config, stack_reference_outputs=placeholders)
    except Exception as e:  # noqa: BLE001 - bad config surfaces from inside the program
        msg = _program_error(e)
        if msg is None:
            raise
        print(f"error: {msg}", file=sys.stderr)
        return 2
    if not policies_allow(rec, args.stack, config):
        return 2
    try:
        errors = render(rec, out) + name_errors(rec)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n_k8s = sum(r.is_kubernetes_object for r in rec.resources)
    print(f"{args.stack}: {len(rec.resources)} resources, {n_k8s} Kubernetes objects -> {out}")
    if errors:
        print(f"{len(errors)} schema or name error(s):", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    print("all Kubernetes objects valid against the Kubernetes and CRD schemas, names and labels well-formed")
    return 0


def name_errors(rec: Recording) -> list[str]:
    from .names_check import check_recording

    return check_recording(rec)
