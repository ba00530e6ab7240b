"""WeightCache: one region's copy of the served weights — the only place serving pods load from.

A private, versioned, encrypted S3 bucket (protected against deletion by default: re-filling 70B of
weights across regions is an outage, not a redeploy), the VPC's S3 gateway endpoint so pods pull over
the VPC rather than NAT (reused by id; created only when told, since a route table carries the S3 prefix
list to one gateway endpoint and stacks sharing a VPC would collide), and per endpoint a read-only role, bound to the endpoint's service account by EKS
Pod Identity, that can read exactly its model's prefix. Replication into the bucket is declared by
WeightReplication (a source bucket has a single replication configuration for all regions).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
from pulumi_aws import ec2, eks, iam, s3

from topology.spec import WeightCacheSpec

from ._common import TYPE_PREFIX, child

READER_POLICY_NAME = "read-model-prefix"
INCOMPLETE_UPLOAD_DAYS = 7  # a seed interrupted longer than this starts its large objects over

_POD_IDENTITY_ASSUME = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
                   "Action": ["sts:AssumeRole", "sts:TagSession"]}],
}, sort_keys=True)


@dataclass(frozen=True)
class WeightReader:
    """A service account allowed to read its endpoint's model prefixes (the served revision, and a canary's)."""

    endpoint: str
    namespace: str
    service_account: str
    prefixes: tuple[str, ...]


def reader_policy(bucket: str, prefixes: tuple[str, ...]) -> str:
    """Read-only access to the given prefixes: list them, get their objects; nothing else in the bucket."""
    ordered = sorted(set(prefixes))  # the canary or the previous version may serve the stable revision
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ReadModelPrefix", "Effect": "Allow", "Action": ["s3:GetObject"],
             "Resource": [f"arn:aws:s3:::{bucket}/{p}*" for p in ordered]},
            {"Sid": "ListModelPrefix", "Effect": "Allow", "Action": ["s3:ListBucket"],
             "Resource": [f"arn:aws:s3:::{bucket}"],
             "Condition": {"StringLike": {"s3:prefix": [x for p in ordered for x in (p, f"{p}*")]}}},
        ],
    }, sort_keys=True)


def tls_only_policy(bucket: str) -> str:
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
                       "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                       "Condition": {"Bool": {"aws:SecureTransport": "false"}}}],
    }, sort_keys=True)


@dataclass(frozen=True)
class WeightCacheArgs:
    cache: WeightCacheSpec
    cluster_name: pulumi.Input[str] | None = None  # Pod Identity associations need it; None: no readers
    cluster_region: str | None = None
    readers: Sequence[WeightReader] = field(default=())
    tags: dict[str, str] | None = None
    # The VPC's S3 gateway endpoint: reuse its id, or create one only when told (a route table takes one).
    s3_endpoint_id: str | None = None
    create_s3_endpoint: bool = False


class WeightCache(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    versioning: s3.BucketVersioning
    reader_role_arns: dict[str, pulumi.Output[str]]
    pod_identity: dict[str, eks.PodIdentityAssociation]

    def __init__(self, name: str, args: WeightCacheArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:WeightCache", name, None, opts)
        c = args.cache
        for r in args.readers:
            missing = [p for p in r.prefixes if p not in c.model_prefixes]
            if missing or not r.prefixes:
                raise ValueError(
                    f"reader {r.endpoint!r} asks for prefixes {missing or '(none)'}, which weight cache {c.bucket_name} "
                    f"does not hold; it holds {list(c.model_prefixes)}"
                )
        tags = {"serving.llm/weight-cache": c.region, **(args.tags or {})}
        bucket = s3.Bucket(
            f"{name}-bucket",
            bucket=c.bucket_name,
            region=c.region,
            force_destroy=False,
            tags=tags,
            opts=child(self, protect=c.protect),
        )
        # the bucket's settings outlive a destroy with it: `pulumi destroy --exclude-protected` keeps the protected
        # bucket (and what it depends on) but deletes what depends on it, and deleting BucketVersioning suspends
        # versioning, the others drop the public access block, the TLS-only policy and default encryption of the
        # bucket that stays (pulumi destroy.go getProtectedExcludes; pulumi_aws s3/bucket_versioning.py)
        keep = {"retain_on_delete": True} if c.protect else {}
        self.versioning = s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket.bucket,
            region=c.region,
            versioning_configuration={"status": "Enabled"},  # replication requires it; keeps overwritten revisions
            opts=child(self, **keep),
        )
        encryption = s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=bucket.bucket,
            region=c.region,
            # SSE-S3: replicas need no KMS grants and readers no kms:Decrypt
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}, "bucket_key_enabled": True}],
            opts=child(self, **keep),
        )
        block = s3.BucketPublicAccessBlock(
            f"{name}-public-access-block",
            bucket=bucket.bucket,
            region=c.region,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child(self, **keep),
        )
        tls_only = s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.bucket,
            region=c.region,
            policy=tls_only_policy(c.bucket_name),
            opts=child(self, depends_on=[block], **keep),
        )
        # an interrupted weight seed (ops/seed_weights.py copies large objects in parts, and resumes an unfinished
        # upload on its next run) leaves its parts stored, and billed, until the upload is completed or aborted: S3
        # aborts those older than this. No rule expires an object or an older version of one (protection)
        s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket.bucket,
            region=c.region,
            rules=[{"id": "abort-incomplete-uploads", "status": "Enabled", "filter": {},  # every key
                    "abort_incomplete_multipart_upload": {"days_after_initiation": INCOMPLETE_UPLOAD_DAYS}}],
            opts=child(self, **keep),
        )
        self.s3_endpoint_id: pulumi.Output[str] | None = (
            pulumi.Output.from_input(args.s3_endpoint_id) if args.s3_endpoint_id else None
        )
        if c.vpc_id is not None and not args.create_s3_endpoint and args.s3_endpoint_id is None:
            pulumi.log.warn(
                f"{name}: no S3 gateway endpoint for {c.vpc_id} is named (llm-serving:s3GatewayEndpoint); weight pulls "
                "go through NAT unless the VPC has one", resource=self)
        if c.vpc_id is not None and args.create_s3_endpoint:
            route_tables = ec2.get_route_tables_output(vpc_id=c.vpc_id, region=c.region)
            endpoint = ec2.VpcEndpoint(
                f"{name}-s3-gateway-endpoint",
                vpc_id=c.vpc_id,
                region=c.region,
                service_name=f"com.amazonaws.{c.region}.s3",
                vpc_endpoint_type="Gateway",  # free, and keeps weight pulls off the NAT gateway
                route_table_ids=route_tables.ids,
                tags=tags,
                opts=child(self),
            )
            self.s3_endpoint_id = endpoint.id

        self.reader_role_arns = {}
        self.pod_identity = {}
        if args.readers and args.cluster_name is None:
            raise ValueError(f"weight cache {c.bucket_name}: readers need cluster_name for their Pod Identity associations")
        for r in sorted(args.readers, key=lambda r: r.endpoint):
            role = iam.Role(
                f"{name}-reader-{r.endpoint}",
                description=f"read {c.bucket_name}/{{{','.join(sorted(set(r.prefixes)))}}} for {r.namespace}/{r.service_account}",
                assume_role_policy=_POD_IDENTITY_ASSUME,
                tags=tags,
                opts=child(self),
            )
            # a RolePolicy resource, not the Role's `inline_policies` (deprecated in pulumi-aws 7); the exclusive
            # list keeps the old argument's guarantee that no out-of-band inline policy survives on the role
            iam.RolePolicy(f"{name}-reader-{r.endpoint}-policy", role=role.id, name=READER_POLICY_NAME,
                           policy=reader_policy(c.bucket_name, r.prefixes), opts=child(self))
            iam.RolePoliciesExclusive(f"{name}-reader-{r.endpoint}-policies", role_name=role.name,
                                      policy_names=[READER_POLICY_NAME], opts=child(self))
            self.pod_identity[r.endpoint] = eks.PodIdentityAssociation(
                f"{name}-reader-{r.endpoint}-pod-identity",
                cluster_name=args.cluster_name,
                region=args.cluster_region or c.region,
                namespace=r.namespace,
                service_account=r.service_account,
                role_arn=role.arn,
                opts=child(self),
            )
            self.reader_role_arns[r.endpoint] = role.arn

        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        # the bucket ready to be written (what the weight seed waits for; not the readers, which need the cluster)
        self.storage: list[pulumi.Resource] = [bucket, self.versioning, encryption, block, tls_only]
        self.uris = {p: c.uri(p) for p in c.model_prefixes}
        self.register_outputs({
            "bucketName": self.bucket_name,
            "bucketArn": self.bucket_arn,
            "uris": self.uris,
            "readerRoleArns": self.reader_role_arns,
        })
