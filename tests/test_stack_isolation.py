"""Stacks that share an AWS account: dev and prod, planned and rendered together, declare no cloud resource
in common (issue #11 item 3), and both configure the AWS provider's region (item 4).

What AWS identifies a resource by is its physical name, not Pulumi's URN: a bucket name; the bucket's one
replication configuration (and versioning, policy, ...); the route tables an S3 gateway endpoint adds its
prefix list to; a node group's (cluster, name); a Pod Identity association's (cluster, namespace, service
account); a Modal app's (environment, name). Two stacks declaring the same one overwrite each other, and
`destroy` of either deletes the other's.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import yaml

from tests.pulumi_support import recording

ROOT = Path(__file__).resolve().parent.parent


def physical_identities(rec) -> list[tuple]:
    cluster = rec.outputs.get("clusterName")
    ids: list[tuple] = []
    for r in rec.resources:
        i, t = r.inputs, r.type
        if not r.custom:
            continue
        if t.startswith("aws:s3/"):
            ids.append((t, i.get("bucket")))
        elif t == "aws:ec2/vpcEndpoint:VpcEndpoint":
            ids.append((t, i["vpcId"], i["serviceName"]))
            ids += [("route-table-s3-prefix-list", rt) for rt in i.get("routeTableIds", [])]
        elif t == "aws:eks/cluster:Cluster":
            ids.append((t, i["name"]))
        elif t == "aws:eks/nodeGroup:NodeGroup":
            ids.append((t, i["clusterName"], i.get("nodeGroupName") or r.urn))  # unnamed: Pulumi auto-names it uniquely
        elif t == "aws:eks/addon:Addon":
            ids.append((t, i["clusterName"], i["addonName"]))
        elif t == "aws:eks/podIdentityAssociation:PodIdentityAssociation":
            ids.append((t, i["clusterName"], i["namespace"], i["serviceAccount"]))
        elif t in ("aws:iam/rolePolicy:RolePolicy", "aws:iam/rolePoliciesExclusive:RolePoliciesExclusive"):
            ids.append((t, str(i.get("role") or i.get("roleName")), i.get("name")))  # an inline policy lives in its role
        elif t.startswith("aws:iam/") and i.get("name"):
            ids.append((t, i["name"]))
        elif t == "aws:autoscaling/tag:Tag":
            ids.append((t, i["autoscalingGroupName"], i["tag"]["key"]))
        elif t == "aws:autoscaling/schedule:Schedule":
            ids.append((t, i["autoscalingGroupName"], i["scheduledActionName"]))
        elif t == "command:local:Command":
            spec = (i.get("environment") or {}).get("LLM_SERVING_BURST_SPEC")
            if spec and spec != "[secret]" and "modal_apps.deploy" in i.get("create", ""):
                burst = json.loads(spec)["burst"]
                ids.append(("modal-app", burst["environment"], burst["app_name"]))
        elif t == "kubernetes:helm.sh/v3:Release":
            ids.append((t, cluster, i.get("namespace"), i.get("name")))
        elif r.is_kubernetes_object:
            md = i.get("metadata", {})
            ids.append(("k8s", cluster, i.get("kind"), md.get("namespace"), md.get("name")))
    return ids


def test_dev_and_prod_declare_no_cloud_resource_in_common():
    dev, prod = physical_identities(recording("dev")), physical_identities(recording("prod"))
    # within one stack each physical resource is declared once, too
    for name, ids in (("dev", dev), ("prod", prod)):
        twice = [k for k, n in Counter(ids).items() if n > 1]
        assert not twice, f"{name} declares these twice: {twice}"
    shared = sorted(set(dev) & set(prod), key=str)
    assert not shared, f"dev and prod both declare: {shared}"


def test_one_stack_owns_the_source_bucket_replication_with_every_stacks_destinations():
    dev, prod = recording("dev"), recording("prod")
    assert dev.of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig") == []
    [config] = prod.of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig")
    assert config.inputs["bucket"] == "acme-model-registry"
    destinations = {r["destination"]["bucket"] for r in config.inputs["rules"]}
    buckets = {b.inputs["bucket"] for rec in (dev, prod) for b in rec.of_type("aws:s3/bucket:Bucket")}
    assert destinations == {f"arn:aws:s3:::{b}" for b in buckets} and len(buckets) == 2
    # every model prefix of each stack's cache reaches that stack's bucket
    for rec in (dev, prod):
        for cache in rec.outputs["spec"]["weight_caches"]:
            got = {r["filter"]["prefix"] for r in config.inputs["rules"]
                   if r["destination"]["bucket"] == f"arn:aws:s3:::{cache['bucket_name']}"}
            assert got == set(cache["model_prefixes"])
    ids = [r["id"] for r in config.inputs["rules"]]
    priorities = [r["priority"] for r in config.inputs["rules"]]
    assert len(set(ids)) == len(ids) and len(set(priorities)) == len(priorities)


def test_the_shared_vpcs_s3_endpoint_is_reused_not_created():
    for stack in ("dev", "prod"):
        assert recording(stack).of_type("aws:ec2/vpcEndpoint:VpcEndpoint") == []


def test_the_stacks_set_the_aws_region_and_the_workflows_do_not_override_it():
    for stack in ("dev", "prod"):
        config = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"]
        assert config["aws:region"] == config["llm-serving:inputs"]["cluster_region"]
    # the stack file is the one source of the region: a workflow that overrode it from a CI secret ran with an empty
    # region when the secret was missing, and with another region than the plan's when it differed
    for name in ("preview.yml", "deploy.yml"):
        wf = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
        steps = [s for job in wf["jobs"].values() for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions")]
        assert steps
        for step in steps:
            config_map = yaml.safe_load(step["with"]["config-map"])
            assert "aws:region" not in config_map, name
            assert all(config_map[k]["secret"] is True for k in ("llm-serving:modalTokenId", "llm-serving:modalTokenSecret"))


def test_s3_endpoint_setting_needs_exactly_one_choice_and_creates_only_when_told():
    import pytest

    from components.stack_settings import stack_settings
    from topology.loading import InputError

    cluster = {"mode": "existing", "name": "c", "nodeRoleArn": "arn:aws:iam::111122223333:role/n", "subnetIds": ["subnet-1"]}
    for bad in ({}, {"existingId": "vpce-0abc", "create": True}, {"existingId": "not-an-endpoint"}):
        with pytest.raises(InputError, match="s3GatewayEndpoint"):
            stack_settings({"cluster": cluster, "s3GatewayEndpoint": bad}, "test")
    assert stack_settings({"cluster": cluster, "s3GatewayEndpoint": {"create": True}}, "t").s3_gateway_endpoint.create

    from offline.mockrun import read_stack_config, run_program

    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml")
    rec = run_program(stack, {**config, "llm-serving:s3GatewayEndpoint": {"create": True}})
    [endpoint] = rec.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["vpcEndpointType"] == "Gateway" and endpoint.inputs["routeTableIds"]
