"""Validate rendered Kubernetes objects: built-in kinds against the Kubernetes OpenAPI schemas
(`kubernetes-validate`, strict: unknown fields are errors), custom resources against the CRD schemas in
schemas/crd/ — also strictly, since the API server would silently prune a misspelt field.

Each kind's validator is built once: `kubernetes_validate.validate` re-reads and re-parses the 1.46 MB
definitions file for every object, which was most of the render's validation time.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import referencing

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas" / "crd"
KUBERNETES_VERSION = "1.35.0"  # the EKS version the stacks run (ClusterSettings.kubernetes_version)


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """{(apiVersion, kind): schema} from files named `<kind>_<group>_<version>.json`."""
    out = {}
    for f in sorted(SCHEMA_DIR.glob("*.json")):
        kind_lower, group, version = f.stem.split("_")
        schema = json.loads(f.read_text())
        out[(f"{group}/{version}", kind_lower)] = schema
    return out


def _unknown_fields(obj: Any, schema: dict, path: str) -> list[str]:
    """Fields a structural schema would prune (not declared, no additionalProperties, no preserve-unknown)."""
    errors: list[str] = []
    if isinstance(obj, dict) and schema.get("type") == "object":
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return errors
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in obj.items():
            if props is not None and k in props:
                errors += _unknown_fields(v, props[k], f"{path}.{k}")
            elif isinstance(extra, dict):
                errors += _unknown_fields(v, extra, f"{path}.{k}")
            elif props is not None and not extra:
                errors.append(f"{path}.{k}: unknown field")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            errors += _unknown_fields(v, schema["items"], f"{path}[{i}]")
    return errors


@functools.cache
def _crd_validator(api_version: str, kind_lower: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(crd_schemas()[(api_version, kind_lower)])


@functools.cache
def _strict_schema_dir(kubernetes_version: str) -> str:
    """kubernetes_validate's strict schemas for a Kubernetes version: the newest it has not above that version
    (its own rule, in kubernetes_validate.utils.validate)."""
    kv = kubernetes_validate.utils
    if kv.major_minor(kubernetes_version) > kv.latest_version():
        raise kv.VersionNotSupportedError(version=kv.major_minor(kubernetes_version))
    version = [v for v in kv.all_versions() if kv.major_minor(v) <= kv.major_minor(kubernetes_version)][-1]
    return f"kubernetes-json-schema/v{version}-local-strict"


@functools.cache
def _strict_definitions(schema_dir: str, kubernetes_version: str) -> referencing.Resource:
    return referencing.Resource.from_contents(
        kubernetes_validate.utils.schema_contents(f"{schema_dir}/_definitions.json", kubernetes_version))


@functools.cache
def _kubernetes_validator(api_version: str, kind: str, kubernetes_version: str) -> jsonschema.Draft202012Validator:
    """The validator `kubernetes_validate.validate(obj, version, strict=True)` builds for one kind, built once.

    Raises kubernetes_validate.SchemaNotFoundError for a kind it has no schema for."""
    schema_dir = _strict_schema_dir(kubernetes_version)
    # its file naming: the API group's domain dropped, "/" → "-" (rbac.authorization.k8s.io/v1 → rbac-v1)
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kubernetes_validate.utils.schema_contents(
            f"{schema_dir}/{kind.lower()}-{group_version}.json", kubernetes_version)
    except FileNotFoundError:
        raise kubernetes_validate.SchemaNotFoundError(
            version=kubernetes_validate.utils.major_minor(kubernetes_version), kind=kind, api_version=api_version,
        ) from None
    registry = _strict_definitions(schema_dir, kubernetes_version) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_object(obj: dict[str, Any], kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    """Problems with one manifest (empty when valid)."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    where = f"{kind} {obj.get('metadata', {}).get('namespace', '')}/{obj.get('metadata', {}).get('name', '')}"
    crd = crd_schemas().get((api_version, kind.lower()))
    if crd is not None:
        validator = _crd_validator(api_version, kind.lower())
        errors = [f"{where}: {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                  for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
        return errors + [f"{where}: {e}" for e in _unknown_fields(obj, crd, "")]
    try:
        _kubernetes_validator(api_version, kind, kubernetes_version).validate(obj)
    except jsonschema.ValidationError as e:
        return [f"{where}: {'.'.join(map(str, e.path)) or '(root)'}: {e.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
        return [f"{where}: no schema for {api_version} {kind} ({e}); add its CRD schema to schemas/crd/"]
    return []


def validate_objects(objs: list[dict[str, Any]], kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    return [err for o in objs for err in validate_object(o, kubernetes_version)]
