"""The render's validator builds each kind's Kubernetes schema validator once (issue #17) instead of letting
`kubernetes_validate.validate` re-parse its 1.46 MB definitions for every object. Cached, it must still say
exactly what `kubernetes_validate.validate` says — for valid objects, a misspelt field, a wrong type and a
kind it has no schema for — including for an object validated after a valid one of the same kind."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from offline.validate import KUBERNETES_VERSION, crd_schemas, validate_object
from pulumi_support import recording


def upstream(obj: dict) -> list[str]:
    """The same report, from kubernetes_validate.validate itself (the reference)."""
    where = f"{obj['kind']} {obj.get('metadata', {}).get('namespace', '')}/{obj.get('metadata', {}).get('name', '')}"
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{where}: {'.'.join(map(str, e.path)) or '(root)'}: {e.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
        return [f"{where}: no schema for {obj['apiVersion']} {obj['kind']} ({e}); add its CRD schema to schemas/crd/"]
    return []


def builtin_objects() -> list[dict]:
    objs = [o for o in recording("prod").kubernetes_objects() if (o["apiVersion"], o["kind"].lower()) not in crd_schemas()]
    assert {o["kind"] for o in objs} >= {"Deployment", "Service", "ConfigMap"}
    return objs


def test_cached_validation_says_what_kubernetes_validate_says():
    checked = 0
    for obj in builtin_objects():
        misspelt = copy.deepcopy(obj)
        misspelt["metadata"]["lables"] = {"app": "x"}
        wrong_type = copy.deepcopy(obj)
        wrong_type["metadata"]["name"] = 5
        for o in (obj, misspelt, wrong_type, obj):  # a valid object again after the invalid ones
            assert validate_object(o) == upstream(o)
            checked += 1
        assert validate_object(obj) == []
        assert any("lables" in e for e in validate_object(misspelt))
    assert checked >= 40


def test_a_misspelt_deployment_field_is_rejected_after_a_valid_deployment():
    dep = next(o for o in builtin_objects() if o["kind"] == "Deployment")
    assert validate_object(dep) == []  # the kind's validator is now built and cached
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    errors = validate_object(bad)
    assert errors == upstream(bad)
    assert len(errors) == 1 and "imagePullPolicyy" in errors[0]


@pytest.mark.parametrize("api_version,kind", [("v1", "ConfigMapp"), ("apps/v2", "Deployment")])
def test_a_kind_without_a_schema_is_reported_not_passed(api_version, kind):
    obj = {**copy.deepcopy(next(o for o in builtin_objects() if o["kind"] == "ConfigMap")),
           "apiVersion": api_version, "kind": kind}
    errors = validate_object(obj)
    assert errors == upstream(obj)
    assert len(errors) == 1 and f"no schema for {api_version} {kind}" in errors[0]
