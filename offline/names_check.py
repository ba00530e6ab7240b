"""Names and labels the schemas type only as strings, checked against their syntax in the render.

The OpenAPI schemas say `metadata.name: string` and `labels: object of strings`; the API server then
refuses `Bad Value!` as a label value and `US_EAST 1` in a bucket name at apply time. These checks make
the offline render refuse them first, with the object and the field named. Rules: topology/names.py.
"""

from __future__ import annotations

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


def check_manifest(obj: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    kind = obj.get("kind", "")
    where = f"{kind} {meta.get('namespace', '')}/{meta.get('name', '')}"
    if "name" in meta:
        _check(errors, where, "metadata.name", meta["name"], check_dns_label if kind in DNS_LABEL_KINDS else check_dns_subdomain)
    if meta.get("namespace") is not None:
        _check(errors, where, "metadata.namespace", meta["namespace"], check_dns_label)
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
    errors = [e for obj in rec.kubernetes_objects() for e in check_manifest(obj)]
    for r in rec.resources:
        if r.type == "aws:s3/bucket:Bucket" and r.inputs.get("bucket") is not None:
            _check(errors, f"Bucket {r.name}", "bucket", r.inputs["bucket"], check_bucket_name)
        elif r.type == "aws:eks/nodeGroup:NodeGroup":
            for k, v in (r.inputs.get("labels") or {}).items():
                _check(errors, f"NodeGroup {r.name}", "labels key", k, check_label_key)
                _check(errors, f"NodeGroup {r.name}", f"labels.{k}", v, check_label_value)
    return errors
