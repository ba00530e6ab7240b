"""Seeding a region-local weight cache (ops/seed_weights.py) against a real S3 API: moto in server mode.

The cases the issue names: more than 1,000 keys (S3 lists 1,000 per page), a ranged resume after an
interruption (only the parts not yet uploaded are sent), a corrupted object detected, a second run that
copies nothing. Objects are tiny except one 11 MiB object: the smallest that needs three 5 MiB parts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
import sys
from pathlib import Path

import pytest

from ops import seed_weights as S
from tests.moto_support import client  # the fixtures moto_endpoint and aws_env: conftest.py

ROOT = Path(__file__).resolve().parent.parent
PART = S.MIN_PART_BYTES
PREFIX = "models/tiny/" + "b" * 40 + "/"


@pytest.fixture
def buckets(moto_endpoint, request):
    s3 = client("s3", moto_endpoint)
    name = request.node.name.replace("_", "-").lower()[:40]
    src, dst = f"src-{name}", f"dst-{name}"
    for b in (src, dst):
        s3.create_bucket(Bucket=b)
    return s3, src, dst


def publish(s3, bucket, files: dict[str, bytes], prefix=PREFIX, lie: dict[str, bytes] | None = None):
    """Write the files and their SHA256SUMS; `lie` puts other bytes in the bucket than the manifest names."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: s3.put_object(Bucket=bucket, Key=prefix + item[0], Body=(lie or {}).get(*item)),
                      files.items()))
    s3.put_object(Bucket=bucket, Key=prefix + S.MANIFEST_NAME,
                  Body="".join(f"{hashlib.sha256(d).hexdigest()}  {r}\n" for r, d in sorted(files.items())).encode())


def keys(s3, bucket, prefix=PREFIX) -> dict[str, int]:
    return S.list_sizes(s3, bucket, prefix)


@pytest.mark.slow  # ~4,000 S3 requests to moto: about a minute on 2 cores
def test_more_than_a_page_of_keys_is_copied_and_a_second_run_copies_nothing(buckets):
    s3, src, dst = buckets
    files = {f"shard/{i:05d}.bin": i.to_bytes(4, "big") * 4 for i in range(1_001)}
    publish(s3, src, files)
    # the listing is paginated: one call does not see every key
    assert s3.list_objects_v2(Bucket=src, Prefix=PREFIX)["IsTruncated"] is True

    first = S.seed_prefix(s3, s3, src, dst, PREFIX, part_bytes=PART, log=lambda m: None)
    assert len(first.copied) == 1_002 and first.corrupt == []
    assert keys(s3, dst) == keys(s3, src)
    body = s3.get_object(Bucket=dst, Key=PREFIX + "shard/01000.bin")
    assert body["Body"].read() == files["shard/01000.bin"]
    assert body["Metadata"]["sha256"] == hashlib.sha256(files["shard/01000.bin"]).hexdigest()

    second = S.seed_prefix(s3, s3, src, dst, PREFIX, part_bytes=PART, log=lambda m: None)
    assert second.copied == [] and second.bytes_uploaded == 0 and len(second.skipped) == 1_002


class Interrupted(Exception):
    pass


class FailingUploads:
    """The destination client, cut off after `allowed` part uploads (a killed `pulumi up`)."""

    def __init__(self, real, allowed):
        self._real, self._allowed = real, allowed

    def upload_part(self, **kw):
        if self._allowed == 0:
            raise Interrupted("connection lost")
        self._allowed -= 1
        return self._real.upload_part(**kw)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_an_interrupted_large_copy_resumes_with_only_the_missing_ranges(buckets):
    s3, src, dst = buckets
    big = os.urandom(2 * PART + 1024 * 1024)  # 11 MiB: three parts
    files = {"model.safetensors": big, "config.json": b"{}"}
    publish(s3, src, files)

    with pytest.raises(Interrupted):
        S.seed_prefix(s3, FailingUploads(s3, allowed=1), src, dst, PREFIX, part_bytes=PART, log=lambda m: None)
    assert PREFIX + "model.safetensors" not in keys(s3, dst)  # never visible half-copied
    assert PREFIX + S.MANIFEST_NAME not in keys(s3, dst)

    report = S.seed_prefix(s3, s3, src, dst, PREFIX, part_bytes=PART, log=lambda m: None)
    assert report.resumed == [PREFIX + "model.safetensors"]
    assert PREFIX + "config.json" in report.skipped  # copied before the interruption
    assert report.bytes_uploaded == len(big) - PART  # part 1 was not sent again
    got = s3.get_object(Bucket=dst, Key=PREFIX + "model.safetensors")["Body"].read()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(big).hexdigest()
    assert s3.list_multipart_uploads(Bucket=dst).get("Uploads", []) == []


def test_a_corrupted_source_object_is_detected_and_not_copied(buckets, aws_env):
    s3, src, dst = buckets
    big = os.urandom(PART + 4096)
    files = {"a.bin": b"good", "b.bin": b"also good", "big.bin": big}
    flipped = bytearray(big)
    flipped[-1] ^= 0xFF
    publish(s3, src, files, lie={"b.bin": b"ALSO GOOD", "big.bin": bytes(flipped)})

    # the command `pulumi up` runs: exit 1, naming the object and what to do
    env = {**os.environ, **aws_env, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "ops.seed_weights", "--source-bucket", src, "--source-region", "us-east-1",
                        "--dest-bucket", dst, "--dest-region", "us-east-1", "--prefix", PREFIX, "--part-mib", "5"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    assert f"corrupt at the source: s3://{src}/{PREFIX}b.bin" in r.stderr and "re-publish" in r.stderr
    assert json.loads(r.stdout)["corrupt"] == 2
    # only the good object is in the cache, and no manifest: the prefix is not complete
    assert set(keys(s3, dst)) == {PREFIX + "a.bin"}
    assert s3.list_multipart_uploads(Bucket=dst).get("Uploads", []) == []


def test_verify_all_repairs_a_cache_object_whose_bytes_changed(buckets):
    s3, src, dst = buckets
    files = {"w.bin": b"weights!"}
    publish(s3, src, files)
    S.seed_prefix(s3, s3, src, dst, PREFIX, part_bytes=PART, log=lambda m: None)
    digest = hashlib.sha256(b"weights!").hexdigest()
    s3.put_object(Bucket=dst, Key=PREFIX + "w.bin", Body=b"WEIGHTS!", Metadata={"sha256": digest})  # bit rot, same size

    report = S.seed_prefix(s3, s3, src, dst, PREFIX, part_bytes=PART, verify_all=True, log=lambda m: None)
    assert report.repaired == [PREFIX + "w.bin"]
    assert s3.get_object(Bucket=dst, Key=PREFIX + "w.bin")["Body"].read() == b"weights!"


def test_an_object_replication_wrote_without_a_digest_is_read_not_uploaded_again(buckets):
    s3, src, dst = buckets
    publish(s3, src, {"r.bin": b"replicated"})
    s3.put_object(Bucket=dst, Key=PREFIX + "r.bin", Body=b"replicated")  # as S3 replication writes it
    report = S.seed_prefix(s3, s3, src, dst, PREFIX, part_bytes=PART, log=lambda m: None)
    assert PREFIX + "r.bin" in report.skipped and report.copied == [PREFIX + S.MANIFEST_NAME]


def test_a_prefix_without_a_manifest_is_refused_with_what_to_do(buckets):
    s3, src, dst = buckets
    s3.put_object(Bucket=src, Key=PREFIX + "x.bin", Body=b"x")
    with pytest.raises(S.SeedError, match=r"no SHA256SUMS; publish the weights with their manifest"):
        S.seed_prefix(s3, s3, src, dst, PREFIX, part_bytes=PART)


def test_the_modal_volume_sync_reads_the_cache_through_s3_with_a_ranged_resume(buckets, tmp_path):
    """modal_apps.weights' S3Source against the same S3 API: a partial file continues with a ranged GET."""
    from modal_apps import weights as W

    s3, src, _dst = buckets
    big = os.urandom(300_000)
    publish(s3, src, {"model.safetensors": big, "config.json": b"{}"})
    target = W.WeightsTarget("tiny", "b" * 40, PREFIX)
    partial = tmp_path / PREFIX / "model.safetensors.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(big[:100_000])  # an interrupted earlier sync

    source = W.S3Source(src, PREFIX, "us-east-1", _client=s3)
    report = W.sync_weights(source, tmp_path, target, progress=False)
    assert report.resumed == ["model.safetensors"]
    assert report.bytes_copied == len(big) - 100_000 + 2
    assert (tmp_path / PREFIX / "model.safetensors").read_bytes() == big
    assert W.sync_weights(source, tmp_path, target, progress=False).copied == []
