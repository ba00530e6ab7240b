"""Fill a burst endpoint's Modal Volume from the region-local weight cache.

    python -m modal_apps.weights sync --stack stacks/Pulumi.prod.yaml --endpoint assist
    python -m modal_apps.weights sync ... --force-revision   # replace the revision the volume serves

The source is the weight cache named by the endpoint's burst spec: s3://<weights_bucket>/<weights_uri_suffix>
in <weights_region>, which must hold a SHA256SUMS manifest (`sha256sum` format, paths relative to the
prefix) written when the weights were published. The copy is:

- verified: every file is hashed against the manifest; a mismatch is re-fetched once, then reported;
- resumable: verified files are skipped (their size and mtime are remembered, so a re-run does not
  re-hash 70 GB), and a partial file continues from where it stopped with a ranged read;
- guarded: the volume's revision marker names the one revision it serves; syncing another revision
  is refused unless --force-revision (the burst server refuses to start on a revision the spec does not
  name, so a volume switched by mistake would take the burst tier down).

The core (`sync_weights`) copies from a `Source` into a local directory. For the Modal Volume, that
directory is a staging area, uploaded with `Volume.batch_upload` at the end (the marker last, once
every file is listed in the volume at its size). Tests use local directories for the bucket and for the volume.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

from tqdm import tqdm

from modal_apps.settings import REVISION_MARKER, BurstAppConfig, BurstConfigError

MANIFEST_NAME = "SHA256SUMS"
VERIFIED_STATE = ".llm-serving/verified.json"
CHUNK_BYTES = 8 * 1024 * 1024


class WeightsError(RuntimeError):
    """A sync that must stop: the message says what is wrong and how to proceed."""


class RevisionConflict(WeightsError):
    pass


class ChecksumMismatch(WeightsError):
    pass


class ManifestError(WeightsError):
    """The SHA256SUMS manifest itself is malformed (not UTF-8, too large, a bad line): bad input, exit 2."""


MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # ~100,000 files; a model has a few hundred


def _manifest_text(data: bytes, where: str) -> str:
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}/{MANIFEST_NAME}: larger than {MAX_MANIFEST_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(
            f"{where}/{MANIFEST_NAME} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


# --- sources ---------------------------------------------------------------------------------------


class Source(Protocol):
    description: str

    def read_manifest_text(self) -> str: ...
    def size(self, rel: str) -> int: ...
    def read_from(self, rel: str, offset: int) -> Iterator[bytes]: ...


@dataclass
class LocalDirSource:
    """A directory laid out like the bucket prefix (tests; or a local copy of the weights)."""

    root: Path

    @property
    def description(self) -> str:
        return str(self.root)

    def read_manifest_text(self) -> str:
        try:
            with open(self.root / MANIFEST_NAME, "rb") as f:
                return _manifest_text(f.read(MAX_MANIFEST_BYTES + 1), str(self.root))
        except FileNotFoundError:
            raise WeightsError(f"{self.root}: no {MANIFEST_NAME} manifest") from None
        except OSError as e:
            raise ManifestError(f"{self.root}/{MANIFEST_NAME}: cannot read ({e.strerror})") from None

    def size(self, rel: str) -> int:
        try:
            return (self.root / rel).stat().st_size
        except OSError:
            raise WeightsError(f"{self.root}: {rel} is in {MANIFEST_NAME} but not in the folder") from None

    def read_from(self, rel: str, offset: int) -> Iterator[bytes]:
        with open(self.root / rel, "rb") as f:
            f.seek(offset)
            while chunk := f.read(CHUNK_BYTES):
                yield chunk


@dataclass
class S3Source:
    """s3://bucket/prefix in one region, read with boto3 (credentials from the usual AWS chain)."""

    bucket: str
    prefix: str
    region: str
    _client: object = field(default=None, repr=False)
    _sizes: dict[str, int] | None = field(default=None, repr=False)

    @property
    def description(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} ({self.region})"

    @property
    def client(self):
        if self._client is None:
            try:
                import boto3
            except ImportError:
                raise WeightsError("reading the weight cache needs boto3: pip install boto3") from None
            self._client = boto3.client("s3", region_name=self.region)
        return self._client

    def read_manifest_text(self) -> str:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + MANIFEST_NAME)["Body"]
            return _manifest_text(body.read(MAX_MANIFEST_BYTES + 1), self.description)
        except self.client.exceptions.NoSuchKey:
            raise WeightsError(f"{self.description}: no {MANIFEST_NAME} manifest") from None

    def size(self, rel: str) -> int:
        if self._sizes is None:
            sizes: dict[str, int] = {}
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", []):
                    sizes[obj["Key"][len(self.prefix):]] = obj["Size"]
            self._sizes = sizes
        if rel not in self._sizes:
            raise WeightsError(f"{self.description}: {rel} is in {MANIFEST_NAME} but not in the bucket")
        return self._sizes[rel]

    def read_from(self, rel: str, offset: int) -> Iterator[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + rel, Range=f"bytes={offset}-")["Body"]
        yield from body.iter_chunks(CHUNK_BYTES)


# --- the manifest and the marker -------------------------------------------------------------------


def parse_manifest(text: str, source: str) -> dict[str, str]:
    """`sha256sum` output → {relative path: sha256}; refuses paths that could escape the prefix."""
    entries: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep:
            digest, sep, name = line.partition(" *")  # sha256sum's binary-mode marker
        digest = digest.strip().lower()
        path = PurePosixPath(name.strip())
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or not name.strip():
            raise ManifestError(f"{source}/{MANIFEST_NAME} line {n}: expected '<64 hex digits>  <path>', got {line!r}")
        if path.is_absolute() or ".." in path.parts or path.parts[0] == ".llm-serving":
            raise ManifestError(f"{source}/{MANIFEST_NAME} line {n}: path {name.strip()!r} must stay inside the prefix")
        entries[str(path)] = digest
    if not entries:
        raise ManifestError(f"{source}/{MANIFEST_NAME} lists no files")
    return entries


def manifest_sha256(manifest: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def check_revision(marker: dict | None, model: str, revision: str, force: bool) -> None:
    if marker is None or (marker.get("model"), marker.get("revision")) == (model, revision):
        return
    if not force:
        raise RevisionConflict(
            f"the volume serves {marker.get('model')}@{marker.get('revision')}, not {model}@{revision}; "
            "re-run with --force-revision to switch it (the burst server then serves only the new revision)"
        )


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


# --- the copy --------------------------------------------------------------------------------------


@dataclass
class SyncReport:
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)  # present but corrupt, fetched again
    resumed: list[str] = field(default_factory=list)
    bytes_copied: int = 0


@dataclass
class WeightsTarget:
    """What is being synced: from the endpoint's burst and engine spec."""

    model: str
    revision: str
    prefix: str  # e.g. "models/llama-3.3-70b-instruct/<revision>/", the layout of the weight cache

    @classmethod
    def from_config(cls, config: BurstAppConfig) -> "WeightsTarget":
        return cls(config.model_name, config.model_revision, config.engine.weights_uri_suffix)


def read_marker(root: Path) -> dict | None:
    path = root / REVISION_MARKER
    if not path.exists():
        return None
    try:
        marker = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise WeightsError(f"{path}: not a revision marker ({e}); remove it to sync afresh") from None
    if not isinstance(marker, dict):
        raise WeightsError(f"{path}: not a revision marker (a {type(marker).__name__}); remove it to sync afresh")
    return marker


def _read_verified(path: Path) -> dict[str, dict]:
    try:
        state = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError):
        return {}  # a damaged record of verifications only costs a re-hash
    return state if isinstance(state, dict) and all(isinstance(v, dict) for v in state.values()) else {}


def sync_weights(
    source: Source,
    dest_root: Path,
    target: WeightsTarget,
    *,
    force_revision: bool = False,
    verify_all: bool = False,
    progress: bool = True,
    marker: dict | None = None,
) -> SyncReport:
    """Copy the manifest's files into dest_root/<prefix>/, verified, resuming; then write the marker.

    `marker` is the destination's current revision marker when it lives elsewhere (the Modal Volume);
    by default it is read from dest_root.
    """
    current = read_marker(dest_root) if marker is None else marker
    check_revision(current, target.model, target.revision, force_revision)
    manifest = parse_manifest(source.read_manifest_text(), source.description)
    base = dest_root / target.prefix
    state_path = dest_root / VERIFIED_STATE
    verified: dict[str, dict] = {} if verify_all or not state_path.exists() else _read_verified(state_path)
    report = SyncReport()

    todo: list[tuple[str, int]] = []
    for rel, digest in sorted(manifest.items()):
        final = base / rel
        key = target.prefix + rel
        if final.exists():
            st = final.stat()
            seen = verified.get(key)
            if seen and seen == {"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}:
                report.skipped.append(rel)
                continue
            if file_sha256(final) == digest:
                verified[key] = {"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
                report.skipped.append(rel)
                continue
            print(f"corrupt: {rel} does not match {MANIFEST_NAME}; fetching it again", file=sys.stderr)
            final.unlink()
            report.repaired.append(rel)
        todo.append((rel, source.size(rel)))

    total = sum(size for _, size in todo)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"{target.model}@{target.revision[:8]}",
              disable=not progress) as bar:
        for rel, size in todo:
            final = base / rel
            _fetch_verified(source, rel, size, manifest[rel], final, bar, report)
            st = final.stat()
            verified[target.prefix + rel] = {"sha256": manifest[rel], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            _write_json(state_path, verified)  # after each file: an interrupted run resumes from here

    _write_json(state_path, verified)
    _write_json(dest_root / REVISION_MARKER, {
        "model": target.model,
        "revision": target.revision,
        "prefix": target.prefix,
        "files": len(manifest),
        "manifest_sha256": manifest_sha256(manifest),
        # each file's digest as verified here: the next upload sends a file whose content changed at the same size
        "sha256": {target.prefix + rel: digest for rel, digest in sorted(manifest.items())},
    })
    return report


def _fetch_verified(source: Source, rel: str, size: int, digest: str, final: Path, bar: tqdm, report: SyncReport):
    partial = final.with_name(final.name + ".partial")
    final.parent.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):
        offset = partial.stat().st_size if partial.exists() else 0
        if offset > size:  # a leftover of some other content: start over
            partial.unlink()
            offset = 0
        if offset and attempt == 1:
            report.resumed.append(rel)
        bar.update(offset)  # bytes already here count as done
        read = 0
        with open(partial, "ab") as out:
            for chunk in source.read_from(rel, offset):
                out.write(chunk)
                read += len(chunk)
                bar.update(len(chunk))
        report.bytes_copied += read
        got = file_sha256(partial)
        if got == digest:
            os.replace(partial, final)
            if rel not in report.repaired:
                report.copied.append(rel)
            return
        # The partial may hold bytes of an earlier, broken run: fetch the whole file once more.
        partial.unlink()
        bar.update(-(offset + read))
    raise ChecksumMismatch(
        f"{source.description}/{rel}: sha256 is {got} after a full fetch, {MANIFEST_NAME} says {digest}; "
        "the cache copy is corrupt: re-replicate it from the source bucket"
    )


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


# --- the Modal Volume (thin: needs a token and the network) -----------------------------------------


def read_volume_marker(volume) -> dict | None:
    try:
        return json.loads(b"".join(volume.read_file(REVISION_MARKER)))
    except FileNotFoundError:  # what Volume.read_file raises for a missing path
        return None


def _remote_sizes(volume, prefix: str) -> dict[str, int]:
    import modal

    try:
        return {e.path.lstrip("/"): e.size for e in volume.listdir(prefix, recursive=True)}
    except (FileNotFoundError, modal.exception.NotFoundError):
        return {}


def volume_is_current(volume, source: Source, target: WeightsTarget) -> bool:
    """The volume already holds exactly this revision: its marker names the model, revision and prefix and the
    manifest the source publishes now, and it lists every file of that manifest at the source's size. Checked
    before anything is staged: the fill runs again on every change of the burst's settings (its Command's
    environment), and from a runner with an empty staging cache it downloaded the whole revision (73 GB for
    assist) only to find the volume complete. Sizes, not hashes: the fill that wrote the marker verified every
    file against the manifest (`--verify-all` re-hashes everything instead)."""
    marker = read_volume_marker(volume)
    if not marker or (marker.get("model"), marker.get("revision"), marker.get("prefix")) != (
            target.model, target.revision, target.prefix):
        return False
    manifest = parse_manifest(source.read_manifest_text(), source.description)
    if marker.get("manifest_sha256") != manifest_sha256(manifest):
        return False
    remote = _remote_sizes(volume, target.prefix)
    return all(remote.get(target.prefix + rel) == source.size(rel) for rel in manifest)


def upload_to_volume(volume, staging: Path, target: WeightsTarget, previous: dict | None = None,
                     changed: frozenset[str] = frozenset(), everything: bool = False) -> int:
    """Upload the staged files the volume lacks or holds in another version, then the revision marker.

    Another version: at another size; or at the same size with another content — a retrained adapter, an edited
    config — told by the digests the volume's previous marker (`previous`) recorded for what it holds, or, where
    that marker records none (written before it did), by the staging copy having been fetched again in this run
    (`changed`: the copies the manifest no longer matched). Sizes alone kept a same-size adapter's old bytes in the
    volume for good, under a marker that called it current. `everything`: send every file (--verify-all: repair).
    The staged files were verified against the manifest; afterwards every one must be listed in the volume at its
    size, or the upload is reported as incomplete (and the next run uploads the rest).
    """
    remote = _remote_sizes(volume, target.prefix)
    staged = {
        path.relative_to(staging).as_posix(): path
        for path in sorted((staging / target.prefix).rglob("*"))
        if path.is_file() and not path.name.endswith(".partial")
    }
    new_digests = (read_marker(staging) or {}).get("sha256") or {}
    old_digests = (previous or {}).get("sha256") if isinstance((previous or {}).get("sha256"), dict) else None
    same_revision = previous is not None and (previous.get("model"), previous.get("revision"), previous.get("prefix")) == (
        target.model, target.revision, target.prefix)

    def stale(rel: str, path: Path) -> bool:
        if everything or remote.get(rel) != path.stat().st_size:
            return True
        if old_digests is not None and same_revision:
            return old_digests.get(rel) != new_digests.get(rel)
        return rel.removeprefix(target.prefix) in changed

    todo = {rel: path for rel, path in staged.items() if stale(rel, path)}
    if todo:
        with volume.batch_upload(force=True) as batch:
            for rel, path in todo.items():
                batch.put_file(path, rel)
    after = _remote_sizes(volume, target.prefix)
    missing = [rel for rel, path in staged.items() if after.get(rel) != path.stat().st_size]
    if missing:
        raise WeightsError(f"upload incomplete, {len(missing)} file(s) missing or short in the volume, "
                           f"e.g. {missing[0]}; run the sync again")
    # The marker last, once the weights are all there: the server starts only on a complete copy.
    with volume.batch_upload(force=True) as batch:
        batch.put_file(staging / REVISION_MARKER, REVISION_MARKER)
    return len(todo)


# --- command line ----------------------------------------------------------------------------------


def _load_config(args) -> BurstAppConfig:
    from modal_apps.settings import ENV_ENDPOINT, ENV_STACK, load_config

    environ = dict(os.environ)
    if args.stack and not args.endpoint:
        raise BurstConfigError(f"--stack {args.stack} needs --endpoint <name> (an endpoint with burst capacity)")
    if args.stack:
        environ = {ENV_STACK: args.stack, ENV_ENDPOINT: args.endpoint or ""}
    elif args.endpoint:
        environ[ENV_ENDPOINT] = args.endpoint
    return load_config(environ)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modal_apps.weights", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sync", help="copy the endpoint's weights from its region-local cache into its Modal Volume")
    p.add_argument("--stack", help="stack file to plan, e.g. stacks/Pulumi.prod.yaml (default: LLM_SERVING_* vars)")
    p.add_argument("--endpoint", help="endpoint with burst capacity (e.g. assist)")
    p.add_argument("--environment", help="Modal environment of the volume (default: the spec's burst.environment)")
    p.add_argument("--force-revision", action="store_true", help="switch a volume that serves another revision")
    p.add_argument("--verify-all", action="store_true",
                   help="re-hash every staged file, ignoring remembered verifications, and upload every file to the "
                        "volume again (a repair)")
    p.add_argument("--staging-dir", type=Path, help="local staging directory (default: ~/.cache/llm-serving/<volume>)")
    p.add_argument("--source-dir", type=Path, help="read a local copy of the prefix instead of the bucket")
    p.add_argument("--dest-dir", type=Path, help="write to a local directory instead of the Modal Volume")
    p.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    try:
        config = _load_config(args)
    except BurstConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    burst, target = config.burst, WeightsTarget.from_config(config)
    source: Source = (
        LocalDirSource(args.source_dir) if args.source_dir
        else S3Source(burst.weights_bucket, target.prefix, burst.weights_region)
    )
    try:
        if args.dest_dir:
            report = sync_weights(source, args.dest_dir, target, force_revision=args.force_revision,
                                  verify_all=args.verify_all, progress=not args.no_progress)
            uploaded = None
        else:
            import modal

            volume = modal.Volume.from_name(burst.volume_name, create_if_missing=True, version=2,
                                            environment_name=args.environment or burst.environment)
            if not args.force_revision and not args.verify_all and volume_is_current(volume, source, target):
                print(json.dumps({"volume": burst.volume_name, "model": target.model, "revision": target.revision,
                                  "current": True, "uploaded_to_volume": 0}))
                return 0
            staging = args.staging_dir or Path.home() / ".cache" / "llm-serving" / burst.volume_name
            in_volume = read_volume_marker(volume)
            report = sync_weights(source, staging, target, force_revision=args.force_revision,
                                  verify_all=args.verify_all, progress=not args.no_progress,
                                  marker=in_volume or read_marker(staging))
            uploaded = upload_to_volume(volume, staging, target, previous=in_volume,
                                        changed=frozenset(report.repaired), everything=args.verify_all)
    except ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except WeightsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"volume": str(args.dest_dir or burst.volume_name), "model": target.model,
                      "revision": target.revision, "copied": len(report.copied), "resumed": len(report.resumed),
                      "repaired": len(report.repaired), "skipped": len(report.skipped),
                      "bytes_copied": report.bytes_copied, "uploaded_to_volume": uploaded}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
