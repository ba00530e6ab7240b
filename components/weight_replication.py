"""WeightReplication: the source-of-truth bucket replicates each model prefix into every regional cache.

S3 keeps exactly one replication configuration per source bucket, so the rules for all regions — and for
every stack sharing the source bucket — live in one resource, declared by one stack only (the setting
`llm-serving:weightReplication.ownerStack`; the others declare none). Replication copies
new writes only: the weights already in the source are copied by the WeightSeed step (components/weight_seed.py). The source bucket must have versioning on — it lives outside this stack, so that is a
prerequisite, not something declared here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_aws import iam, s3

from topology.spec import WeightCacheSpec

from ._common import TYPE_PREFIX, child

REPLICATION_POLICY_NAME = "replicate-model-prefixes"

_S3_ASSUME = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "s3.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}, sort_keys=True)


def replication_policy(source_bucket: str, caches: Sequence[WeightCacheSpec]) -> str:
    prefixes = sorted({p for c in caches for p in c.model_prefixes})
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:GetReplicationConfiguration", "s3:ListBucket"],
             "Resource": [f"arn:aws:s3:::{source_bucket}"]},
            {"Effect": "Allow",
             "Action": ["s3:GetObjectVersionForReplication", "s3:GetObjectVersionAcl", "s3:GetObjectVersionTagging"],
             "Resource": [f"arn:aws:s3:::{source_bucket}/{p}*" for p in prefixes]},
            {"Effect": "Allow", "Action": ["s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags"],
             "Resource": sorted(f"arn:aws:s3:::{c.bucket_name}/*" for c in caches)},
        ],
    }, sort_keys=True)


def replication_rules(caches: Sequence[WeightCacheSpec]) -> list[dict]:
    """One rule per (destination bucket, model prefix); the filter keeps other data in the source bucket where
    it is. Ids name the bucket, not the region: several stacks' caches may share a region."""
    rules = []
    for cache in sorted(caches, key=lambda c: c.bucket_name):
        for prefix in sorted(cache.model_prefixes):
            rules.append({
                "id": f"{cache.bucket_name}:{prefix}"[:255],
                "priority": len(rules) + 1,
                "status": "Enabled",
                "filter": {"prefix": prefix},
                # a deletion in the registry must not pull weights from under running replicas
                "delete_marker_replication": {"status": "Disabled"},
                "destination": {"bucket": f"arn:aws:s3:::{cache.bucket_name}", "storage_class": "STANDARD"},
            })
    return rules


@dataclass(frozen=True)
class WeightReplicationArgs:
    source_bucket: str
    source_region: str
    caches: Sequence[WeightCacheSpec]


class WeightReplication(pulumi.ComponentResource):
    def __init__(self, name: str, args: WeightReplicationArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:WeightReplication", name, None, opts)
        sources = {c.source_bucket for c in args.caches}
        if sources != {args.source_bucket}:
            raise ValueError(f"weight caches name source buckets {sorted(sources)}; expected only {args.source_bucket!r}")
        role = iam.Role(
            f"{name}-role",
            description=f"S3 replication of model prefixes from {args.source_bucket} to the regional weight caches",
            assume_role_policy=_S3_ASSUME,
            opts=child(self),
        )
        # a RolePolicy resource, not the Role's `inline_policies` (deprecated in pulumi-aws 7); the exclusive
        # list keeps the old argument's guarantee that no out-of-band inline policy survives on the role
        policy = iam.RolePolicy(f"{name}-role-policy", role=role.id, name=REPLICATION_POLICY_NAME,
                                policy=replication_policy(args.source_bucket, args.caches), opts=child(self))
        iam.RolePoliciesExclusive(f"{name}-role-policies", role_name=role.name,
                                  policy_names=[REPLICATION_POLICY_NAME], opts=child(self))
        config = s3.BucketReplicationConfig(
            f"{name}-config",
            bucket=args.source_bucket,
            region=args.source_region,
            role=role.arn,
            rules=replication_rules(args.caches),
            opts=child(self, depends_on=[policy]),  # S3 checks the role's permissions when replicating
        )
        self.register_outputs({"roleArn": role.arn, "sourceBucket": config.bucket})
