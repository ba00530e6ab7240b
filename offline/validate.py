"""Validate rendered Kubernetes objects: built-in kinds against the Kubernetes OpenAPI schemas
(`kubernetes-validate`, strict: unknown fields are errors), custom resources against the CRD schemas in
schemas/crd/ — also strictly, since the API server would silently prune a misspelt field.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas" / "crd"
KUBERNETES_VERSION = "1.33.0"  # the EKS version the stacks run (ClusterSettings.kubernetes_version)


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


def validate_object(obj: dict[str, Any], kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    """Problems with one manifest (empty when valid)."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    where = f"{kind} {obj.get('metadata', {}).get('namespace', '')}/{obj.get('metadata', {}).get('name', '')}"
    crd = crd_schemas().get((api_version, kind.lower()))
    if crd is not None:
        validator = jsonschema.Draft7Validator(crd)
        errors = [f"{where}: {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                  for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
        return errors + [f"{where}: {e}" for e in _unknown_fields(obj, crd, "")]
    try:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{where}: {'.'.join(map(str, e.path)) or '(root)'}: {e.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
        return [f"{where}: no schema for {api_version} {kind} ({e}); add its CRD schema to schemas/crd/"]
    return []


def validate_objects(objs: list[dict[str, Any]], kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    return [err for o in objs for err in validate_object(o, kubernetes_version)]
