"""Seed a region-local weight cache: copy the existing objects under each model prefix from the source bucket.

    python -m ops.seed_weights --source-bucket acme-model-registry --source-region us-east-1 \\
        --dest-bucket llm-serving-prod-weights-us-east-1 --dest-region us-east-1 --prefix models/<model>/<rev>/

S3 replication copies only new writes, so a new cache bucket starts empty; this copies what is already
there. `pulumi up` runs it (components/weight_seed.py) before the engine Deployments and the Modal
weights sync, which depend on it. Each prefix holds a `SHA256SUMS` manifest (`sha256sum` format) written
when the weights were published. The copy is:

- verified: every object's bytes are hashed on the way through and compared with the manifest; an object
  is written (single PUT) or completed (multipart) only when they match, and carries its digest as
  `x-amz-meta-sha256`. A source object that does not match is reported and not copied (exit status 1).
- resumable: an object already in the cache with the manifest's digest and size is skipped, so a second
  run copies nothing. A large object is copied in parts (multipart upload); after an interruption the
  next run finds the unfinished upload, checks the parts already uploaded against the source bytes (each
  part's ETag is its MD5) and uploads only the remaining ranges.
- complete-last: the prefix's `SHA256SUMS` is written last, so a cache holding the manifest holds every
  file it lists (`--verify-all` re-reads cache objects and re-copies any whose bytes no longer match).

Why a project command rather than S3 Batch Replication: Batch Replication needs a manifest or inventory
job, an extra IAM role for Batch Operations and a job to poll, and it checks nothing against SHA256SUMS;
this command is idempotent (safe to run on every `up`), verifies every byte, and runs the same in tests
against a real S3 API (moto server).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

MANIFEST_NAME = "SHA256SUMS"
DIGEST_METADATA = "sha256"  # x-amz-meta-sha256
MIN_PART_BYTES = 5 * 1024 * 1024  # S3's smallest part (all but the last)
DEFAULT_PART_BYTES = 64 * 1024 * 1024
READ_CHUNK_BYTES = 1024 * 1024


class SeedError(RuntimeError):
    """A seed that cannot proceed: the message says what is wrong and how to proceed."""


@dataclass
class SeedReport:
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)  # source objects that do not match SHA256SUMS
    bytes_uploaded: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def uploaded(self, n: int) -> None:
        with self._lock:  # objects are copied from several threads
            self.bytes_uploaded += n


def parse_manifest(text: str, where: str) -> dict[str, str]:
    from modal_apps.weights import WeightsError
    from modal_apps.weights import parse_manifest as parse

    try:
        return parse(text, where)
    except WeightsError as e:
        raise SeedError(str(e)) from None


def list_sizes(client: Any, bucket: str, prefix: str) -> dict[str, int]:
    """Every key under the prefix → size (paginated: a prefix may hold more than 1,000 objects)."""
    sizes: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            sizes[obj["Key"]] = obj["Size"]
    return sizes


def _read_range(client: Any, bucket: str, key: str, start: int, end: int):
    """Bytes [start, end) of an object, in chunks."""
    body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"]
    yield from body.iter_chunks(READ_CHUNK_BYTES)


def _digest_of(client: Any, bucket: str, key: str) -> str:
    h = hashlib.sha256()
    for chunk in client.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(READ_CHUNK_BYTES):
        h.update(chunk)
    return h.hexdigest()


def _open_upload(dst: Any, bucket: str, key: str) -> str | None:
    """The newest unfinished multipart upload of this key (left by an interrupted run), if any."""
    uploads = [u for u in dst.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", []) if u["Key"] == key]
    if not uploads:
        return None
    return max(uploads, key=lambda u: u["Initiated"])["UploadId"]


def _done_parts(dst: Any, bucket: str, key: str, upload_id: str) -> list[dict]:
    parts: list[dict] = []
    for page in dst.get_paginator("list_parts").paginate(Bucket=bucket, Key=key, UploadId=upload_id):
        parts += page.get("Parts", [])
    return sorted(parts, key=lambda p: p["PartNumber"])


def _copy_multipart(src, dst, source_bucket, dest_bucket, key, size, digest, part_bytes, report) -> bool:
    """Copy one large object in parts, resuming an unfinished upload; True when it matched the manifest."""
    n_parts = -(-size // part_bytes)
    upload_id = _open_upload(dst, dest_bucket, key)
    done: list[dict] = []
    if upload_id is not None:
        done = _done_parts(dst, dest_bucket, key, upload_id)
        # usable only as a prefix of whole parts of this part size
        expected = [min(part_bytes, size - i * part_bytes) for i in range(n_parts)]
        if [p["PartNumber"] for p in done] != list(range(1, len(done) + 1)) or any(
                p["Size"] != expected[p["PartNumber"] - 1] for p in done):
            dst.abort_multipart_upload(Bucket=dest_bucket, Key=key, UploadId=upload_id)
            upload_id, done = None, []
    h = hashlib.sha256()
    etags: list[dict] = []
    # Parts already uploaded: re-read their source bytes for the running digest (the hash state cannot be
    # saved) and check them against the part's MD5 ETag; nothing is uploaded again.
    for p in done:
        start = (p["PartNumber"] - 1) * part_bytes
        md5 = hashlib.md5(usedforsecurity=False)
        for chunk in _read_range(src, source_bucket, key, start, start + p["Size"]):
            h.update(chunk)
            md5.update(chunk)
        if p["ETag"].strip('"') != md5.hexdigest():
            dst.abort_multipart_upload(Bucket=dest_bucket, Key=key, UploadId=upload_id)
            return _copy_multipart(src, dst, source_bucket, dest_bucket, key, size, digest, part_bytes, report)
        etags.append({"PartNumber": p["PartNumber"], "ETag": p["ETag"]})
    if done:
        report.resumed.append(key)
    if upload_id is None:
        upload_id = dst.create_multipart_upload(
            Bucket=dest_bucket, Key=key, Metadata={DIGEST_METADATA: digest}, ServerSideEncryption="AES256",
        )["UploadId"]
    for number in range(len(done) + 1, n_parts + 1):
        start = (number - 1) * part_bytes
        data = b"".join(_read_range(src, source_bucket, key, start, min(size, start + part_bytes)))
        h.update(data)
        part = dst.upload_part(Bucket=dest_bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data)
        report.uploaded(len(data))
        etags.append({"PartNumber": number, "ETag": part["ETag"]})
    if h.hexdigest() != digest:
        dst.abort_multipart_upload(Bucket=dest_bucket, Key=key, UploadId=upload_id)
        return False
    dst.complete_multipart_upload(Bucket=dest_bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": etags})
    return True


def _copy_single(src, dst, source_bucket, dest_bucket, key, digest, report) -> bool:
    data = src.get_object(Bucket=source_bucket, Key=key)["Body"].read()
    if hashlib.sha256(data).hexdigest() != digest:
        return False
    dst.put_object(Bucket=dest_bucket, Key=key, Body=data, Metadata={DIGEST_METADATA: digest},
                   ServerSideEncryption="AES256")
    report.uploaded(len(data))
    return True


def seed_prefix(
    src: Any,
    dst: Any,
    source_bucket: str,
    dest_bucket: str,
    prefix: str,
    *,
    part_bytes: int = DEFAULT_PART_BYTES,
    verify_all: bool = False,
    concurrency: int = 8,
    report: SeedReport | None = None,
    log=print,
) -> SeedReport:
    """Copy every file SHA256SUMS lists under `prefix` from source to dest, verified; the manifest last."""
    if part_bytes < MIN_PART_BYTES:
        raise SeedError(f"part size {part_bytes} B is below S3's minimum part of {MIN_PART_BYTES} B")
    if not prefix.endswith("/"):
        raise SeedError(f"prefix {prefix!r} must end with '/' (a model revision's folder)")
    report = report if report is not None else SeedReport()
    where = f"s3://{source_bucket}/{prefix}"
    try:
        manifest_text = src.get_object(Bucket=source_bucket, Key=prefix + MANIFEST_NAME)["Body"].read()
    except src.exceptions.NoSuchKey:
        raise SeedError(f"{where}: no {MANIFEST_NAME}; publish the weights with their manifest "
                        f"(`sha256sum` of every file, paths relative to the prefix) first") from None
    manifest = parse_manifest(manifest_text.decode(), where)
    source_sizes = list_sizes(src, source_bucket, prefix)
    missing = sorted(rel for rel in manifest if prefix + rel not in source_sizes)
    if missing:
        raise SeedError(f"{where}: {len(missing)} file(s) in {MANIFEST_NAME} are not in the bucket, e.g. {missing[0]}")
    dest_sizes = list_sizes(dst, dest_bucket, prefix)

    def one(rel: str) -> None:
        digest = manifest[rel]
        key, size = prefix + rel, source_sizes[prefix + rel]
        if dest_sizes.get(key) == size:
            recorded = dst.head_object(Bucket=dest_bucket, Key=key).get("Metadata", {}).get(DIGEST_METADATA)
            # an object S3 replication wrote carries no digest: read it once rather than upload it again
            if (recorded == digest and not verify_all) or (
                    (recorded in (None, digest)) and _digest_of(dst, dest_bucket, key) == digest):
                report.skipped.append(key)
                return
            if verify_all or recorded is None:
                log(f"corrupt in the cache: s3://{dest_bucket}/{key} does not match {MANIFEST_NAME}; copying it again")
                report.repaired.append(key)
        ok = (_copy_multipart(src, dst, source_bucket, dest_bucket, key, size, digest, part_bytes, report)
              if size > part_bytes else _copy_single(src, dst, source_bucket, dest_bucket, key, digest, report))
        if ok:
            if key not in report.repaired:
                report.copied.append(key)
        else:
            log(f"corrupt at the source: s3://{source_bucket}/{key} does not match {MANIFEST_NAME}; not copied")
            report.corrupt.append(key)

    # Objects are independent: copy several at once (boto3 clients are thread-safe; list appends are atomic).
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for _ in pool.map(one, sorted(manifest)):
            pass
    for part in (report.copied, report.skipped, report.repaired, report.corrupt, report.resumed):
        part.sort()

    if not any(k.startswith(prefix) for k in report.corrupt):
        manifest_key = prefix + MANIFEST_NAME
        manifest_digest = hashlib.sha256(manifest_text).hexdigest()
        head = dst.head_object(Bucket=dest_bucket, Key=manifest_key) if manifest_key in dest_sizes else {}
        if head.get("Metadata", {}).get(DIGEST_METADATA) != manifest_digest:
            dst.put_object(Bucket=dest_bucket, Key=manifest_key, Body=manifest_text,
                           Metadata={DIGEST_METADATA: manifest_digest}, ServerSideEncryption="AES256")
            report.copied.append(manifest_key)
        else:
            report.skipped.append(manifest_key)
    return report


def _client(region: str):
    import boto3  # endpoint: AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 when set (boto3's own variables)

    return boto3.client("s3", region_name=region)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.seed_weights", description=__doc__.splitlines()[0])
    parser.add_argument("--source-bucket", required=True)
    parser.add_argument("--source-region", required=True)
    parser.add_argument("--dest-bucket", required=True)
    parser.add_argument("--dest-region", required=True)
    parser.add_argument("--prefix", action="append", required=True, help="model revision prefix (repeatable)")
    parser.add_argument("--part-mib", type=int, default=DEFAULT_PART_BYTES // (1024 * 1024),
                        help="multipart part size in MiB (min 5)")
    parser.add_argument("--concurrency", type=int, default=8, help="objects copied at once")
    parser.add_argument("--verify-all", action="store_true", help="re-read cache objects and re-copy any that do not match")
    args = parser.parse_args(argv)

    src, dst = _client(args.source_region), _client(args.dest_region)
    report = SeedReport()
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    try:
        for prefix in args.prefix:
            seed_prefix(src, dst, args.source_bucket, args.dest_bucket, prefix, part_bytes=args.part_mib * 1024 * 1024,
                        verify_all=args.verify_all, concurrency=max(1, args.concurrency),
                        report=report, log=log)
    except SeedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    summary = {k: (len(v) if isinstance(v, list) else v) for k, v in vars(report).items() if not k.startswith("_")}
    print(json.dumps({"dest": f"s3://{args.dest_bucket}", **summary}, sort_keys=True))
    if report.corrupt:
        print(f"error: {len(report.corrupt)} source object(s) do not match {MANIFEST_NAME}, e.g. "
              f"s3://{args.source_bucket}/{report.corrupt[0]}; re-publish them (and their manifest line), then re-run",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
