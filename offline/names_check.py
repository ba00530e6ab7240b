"""Names and labels the schemas type only as strings, checked against their syntax in the render.

The OpenAPI schemas say `metadata.name: string` and `labels: object of strings`; the API server then
refuses `Bad Value!` as a label value and `US_EAST 1` in a bucket name at apply time. These checks make
the offline render refuse them first, with the object and the field named. Rules: topology/names.py.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

from topology.names import (
    check_bucket_name,
    check_dns_label,
    check_dns_subdomain,
    check_label_key,
    check_label_value,
)

from .mockrun import Recording

# a container port's name: an IANA service name (apimachinery validation.IsValidPortName): at most 15 characters
# of [a-z0-9-], at least one letter, no '-' at either end and no '--'
IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])(?!-)(?!.*--)[a-z0-9-]{1,15}(?<!-)$")

# kinds whose names must be DNS-1123 labels (a Service's name is a DNS label; most others are subdomains)
DNS_LABEL_KINDS = {"Namespace", "Service"}


def _label_maps(obj: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(path, labels) for every label map and selector of a manifest."""
    yield "metadata.labels", obj.get("metadata", {}).get("labels")
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    sel = spec.get("selector")
    if isinstance(sel, dict):
        yield "spec.selector.matchLabels", sel.get("matchLabels")
        if obj.get("kind") == "Service":
            yield "spec.selector", sel
    tmpl = spec.get("template")
    if isinstance(tmpl, dict) and isinstance(tmpl.get("metadata"), dict):
        yield "spec.template.metadata.labels", tmpl["metadata"].get("labels")


def _check(errors: list[str], where: str, field: str, value: Any, check) -> None:
    if not isinstance(value, str):
        errors.append(f"{where}: {field} = {value!r}: not a string")
        return
    try:
        check(value)
    except ValueError as e:
        errors.append(f"{where}: {field}: {e}")


def _port_names(obj: dict[str, Any], where: str) -> list[str]:
    """A Service's port names: DNS-1123 labels, unique in the Service (kubernetes pkg/apis/core/validation
    validateServicePort); a pod template's container port names: IANA service names, unique in the pod."""
    errors: list[str] = []
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    if obj.get("kind") == "Service":
        names = [p.get("name") for p in spec.get("ports") or [] if isinstance(p, dict) and p.get("name") is not None]
        for n in names:
            _check(errors, where, "spec.ports[].name", n, check_dns_label)
        errors += [f"{where}: spec.ports[].name {n!r} appears {c} times (the API server refuses duplicates)"
                   for n, c in Counter(names).items() if c > 1]
    pod = (spec.get("template") or {}).get("spec") if isinstance(spec.get("template"), dict) else None
    if isinstance(pod, dict):
        names = [p.get("name") for c in (pod.get("containers") or []) + (pod.get("initContainers") or [])
                 if isinstance(c, dict) for p in c.get("ports") or [] if isinstance(p, dict) and p.get("name") is not None]
        errors += [f"{where}: container port name {n!r} is not an IANA service name (at most 15 characters of "
                   "a-z, 0-9 and '-', with a letter, no '-' at either end, no '--')"
                   for n in names if not (isinstance(n, str) and IANA_SVC_NAME.match(n))]
        errors += [f"{where}: container port name {n!r} appears {c} times in the pod"
                   for n, c in Counter(names).items() if c > 1]
    return errors


def check_manifest(obj: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    kind = obj.get("kind", "")
    where = f"{kind} {meta.get('namespace', '')}/{meta.get('name', '')}"
    if "name" in meta:
        _check(errors, where, "metadata.name", meta["name"], check_dns_label if kind in DNS_LABEL_KINDS else check_dns_subdomain)
    if meta.get("namespace") is not None:
        _check(errors, where, "metadata.namespace", meta["namespace"], check_dns_label)
    errors += _port_names(obj, where)
    seen: set[tuple[str, int]] = set()
    for path, labels in _label_maps(obj):
        if not isinstance(labels, dict) or (path, id(labels)) in seen:
            continue
        seen.add((path, id(labels)))
        for k, v in labels.items():
            _check(errors, where, f"{path} key", k, check_label_key)
            _check(errors, where, f"{path}.{k}", v, check_label_value)
    return errors


def check_recording(rec: Recording) -> list[str]:
    """Name and label problems in every Kubernetes object, node group and bucket of a recording."""
    objs = rec.kubernetes_objects()
    errors = [e for obj in objs for e in check_manifest(obj)]
    # two declarations of one resource: Pulumi refuses a repeated URN at preview (a URN holds the parent's type,
    # not its name, so component children named "<component>-<suffix>" meet when one endpoint's name is
    # another's plus a suffix), and two Pulumi resources writing one Kubernetes object fight over it
    errors += [f"Pulumi resource URN {urn} is declared {c} times: two endpoints' names make one resource name "
               "(e.g. 'X' and 'X-pods'); rename one endpoint"
               for urn, c in Counter(r.urn for r in rec.resources).items() if c > 1]
    # one object whatever the version it is declared at: its API group ("" for the core group), kind, namespace, name
    ident = Counter((o.get("apiVersion", "").rpartition("/")[0], o.get("kind"), (o.get("metadata") or {}).get("namespace"),
                     (o.get("metadata") or {}).get("name")) for o in objs)
    errors += [f"Kubernetes object {kind} {ns or ''}/{name} is declared {c} times"
               for (_, kind, ns, name), c in ident.items() if c > 1]
    for r in rec.resources:
        if r.type == "aws:s3/bucket:Bucket" and r.inputs.get("bucket") is not None:
            _check(errors, f"Bucket {r.name}", "bucket", r.inputs["bucket"], check_bucket_name)
        elif r.type == "aws:eks/nodeGroup:NodeGroup":
            for k, v in (r.inputs.get("labels") or {}).items():
                _check(errors, f"NodeGroup {r.name}", "labels key", k, check_label_key)
                _check(errors, f"NodeGroup {r.name}", f"labels.{k}", v, check_label_value)
    return errors
