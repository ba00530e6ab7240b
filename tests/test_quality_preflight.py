"""Preflight: the quality-sampling sink exists and is in the cluster's region (moto on 127.0.0.1)."""

from __future__ import annotations

from tests.moto_support import client  # the fixtures moto_endpoint and aws_env: conftest.py
from tests.test_preflight import run, world  # noqa: F401 (fixture)


def test_the_sink_must_exist_in_the_clusters_region(world, moto_endpoint):  # noqa: F811
    stack_file, clients, *_ = world
    checks, text, status = run(stack_file, clients)
    (name,) = [n for n in checks if n.startswith("quality sink ")]
    bucket = name.removeprefix("quality sink ")
    assert checks[name].ok and status == 0 and "is in us-east-1" in checks[name].detail

    s3 = client("s3", moto_endpoint)
    s3.delete_bucket(Bucket=bucket)
    checks, text, status = run(stack_file, clients)
    assert not checks[name].ok and status == 1 and f"aws s3api create-bucket --bucket {bucket}" in text

    client("s3", moto_endpoint, "eu-west-1").create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    checks, text, status = run(stack_file, clients)
    assert not checks[name].ok and status == 1
    assert "is in eu-west-1, the cluster in us-east-1: sampled prompts would leave the region" in text


def test_a_sink_encrypted_with_a_customer_key_the_recorder_cannot_use_is_named(world, moto_endpoint):  # noqa: F811
    """The recorder's role may only s3:PutObject: into a bucket whose default encryption is a customer-managed KMS
    key every put is refused without kms:GenerateDataKey, and the samples are dropped silently for hours."""
    stack_file, clients, *_ = world
    checks, _text, _status = run(stack_file, clients)
    (name,) = [n for n in checks if n.startswith("quality sink ") and not n.endswith(" encryption")]
    bucket = name.removeprefix("quality sink ")
    assert f"{name} encryption" not in checks  # SSE-S3: nothing to grant
    s3 = client("s3", moto_endpoint)
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [
        {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}}]})
    checks, text, status = run(stack_file, clients)
    assert status == 1 and not checks[f"{name} encryption"].ok
    assert key in checks[f"{name} encryption"].detail and "kms:GenerateDataKey" in text
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [
        {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "alias/aws/s3"}}]})
    checks, _text, _status = run(stack_file, clients)
    assert f"{name} encryption" not in checks  # the AWS-managed key: the S3 service uses it for the caller
