"""The weights command against local directories standing in for the bucket prefix and for the volume."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import sys
from types import SimpleNamespace

import pytest

from modal_apps import weights as W
from modal_apps.settings import ENV_ENDPOINT, ENV_SPEC, ENV_SPEC_FILE, ENV_STACK, REVISION_MARKER, BurstAppConfig

TARGET = W.WeightsTarget("tiny-model", "a" * 40, "models/tiny-model/" + "a" * 40 + "/")
FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "model-00001-of-00002.safetensors": os.urandom(300_000),
    "model-00002-of-00002.safetensors": os.urandom(200_000),
    "tokenizer/tokenizer.json": os.urandom(50_000),
}


def publish(bucket, files=FILES):
    """Lay out a bucket prefix with its SHA256SUMS, as the publishing step writes it."""
    for rel, data in files.items():
        (bucket / rel).parent.mkdir(parents=True, exist_ok=True)
        (bucket / rel).write_bytes(data)
    (bucket / W.MANIFEST_NAME).write_text(
        "".join(f"{hashlib.sha256(d).hexdigest()}  {rel}\n" for rel, d in sorted(files.items())))


class CountingSource(W.LocalDirSource):
    """Records every read: which file, from which offset, how many bytes."""

    def __init__(self, root):
        super().__init__(root)
        self.reads: list[tuple[str, int, int]] = []

    def read_from(self, rel, offset):
        n = 0
        for chunk in super().read_from(rel, offset):
            n += len(chunk)
            yield chunk
        self.reads.append((rel, offset, n))


@pytest.fixture
def bucket(tmp_path):
    root = tmp_path / "bucket" / TARGET.prefix
    root.mkdir(parents=True)
    publish(root)
    return root


@pytest.fixture
def volume(tmp_path):
    v = tmp_path / "volume"
    v.mkdir()
    return v


def sync(bucket, volume, **kw):
    source = CountingSource(bucket)
    report = W.sync_weights(source, volume, TARGET, progress=False, **kw)
    return source, report


def assert_complete(volume):
    for rel, data in FILES.items():
        assert (volume / TARGET.prefix / rel).read_bytes() == data
    assert not list((volume / TARGET.prefix).rglob("*.partial"))
    marker = json.loads((volume / REVISION_MARKER).read_text())
    assert (marker["model"], marker["revision"], marker["files"]) == (TARGET.model, TARGET.revision, len(FILES))


def test_fresh_sync_copies_and_marks_the_revision(bucket, volume):
    source, report = sync(bucket, volume)
    assert sorted(report.copied) == sorted(FILES) and report.bytes_copied == sum(map(len, FILES.values()))
    assert {r[1] for r in source.reads} == {0}
    assert_complete(volume)


def test_rerun_skips_verified_files_without_reading_or_rehashing(bucket, volume, monkeypatch):
    sync(bucket, volume)
    hashed = []
    real_hash = W.file_sha256
    monkeypatch.setattr(W, "file_sha256", lambda p: hashed.append(p) or real_hash(p))
    source, report = sync(bucket, volume)
    assert source.reads == [] and hashed == [] and sorted(report.skipped) == sorted(FILES)
    # --verify-all re-hashes everything, still reading nothing from the bucket.
    source, report = sync(bucket, volume, verify_all=True)
    assert source.reads == [] and len(hashed) == len(FILES)


def test_partial_file_continues_where_it_stopped(bucket, volume):
    rel = "model-00001-of-00002.safetensors"
    half = len(FILES[rel]) // 2
    dest = volume / TARGET.prefix / rel
    dest.parent.mkdir(parents=True)
    dest.with_name(dest.name + ".partial").write_bytes(FILES[rel][:half])
    source, report = sync(bucket, volume)
    assert (rel, half, len(FILES[rel]) - half) in source.reads, "only the missing bytes are read"
    assert report.resumed == [rel]
    assert_complete(volume)


def test_interrupted_sync_resumes_with_the_files_already_verified(bucket, volume):
    class Failing(CountingSource):
        def read_from(self, rel, offset):
            if rel.startswith("model-00002"):
                yield FILES[rel][:1000]
                raise ConnectionError("connection reset")
            yield from super().read_from(rel, offset)

    with pytest.raises(ConnectionError):
        W.sync_weights(Failing(bucket), volume, TARGET, progress=False)
    assert not (volume / REVISION_MARKER).exists(), "no marker until every file is verified"
    source, report = sync(bucket, volume)
    assert sorted(report.skipped) == ["config.json", "model-00001-of-00002.safetensors"]
    assert report.resumed == ["model-00002-of-00002.safetensors"]
    assert ("model-00002-of-00002.safetensors", 1000, 199_000) in source.reads
    assert_complete(volume)


def test_corrupted_file_in_the_volume_is_detected_and_fetched_again(bucket, volume):
    sync(bucket, volume)
    rel = "model-00002-of-00002.safetensors"
    f = volume / TARGET.prefix / rel
    data = bytearray(f.read_bytes())
    data[1234] ^= 0xFF  # same size, one flipped bit
    st = f.stat()
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime...
    source, report = sync(bucket, volume, verify_all=True)  # ...a full verification catches it
    assert report.repaired == [rel] and [r[0] for r in source.reads] == [rel]
    assert_complete(volume)
    f.write_bytes(b"truncated")  # a plain corruption (new size and mtime) is caught without --verify-all
    source, report = sync(bucket, volume)
    assert report.repaired == [rel]
    assert_complete(volume)


def test_corrupt_partial_is_discarded_and_refetched(bucket, volume):
    rel = "config.json"
    dest = volume / TARGET.prefix / rel
    dest.parent.mkdir(parents=True)
    dest.with_name(dest.name + ".partial").write_bytes(b"garbage")
    source, _ = sync(bucket, volume)
    assert [(r, o) for r, o, _ in source.reads if r == rel] == [(rel, 7), (rel, 0)]
    assert_complete(volume)


def test_corrupt_bucket_copy_is_reported_and_nothing_is_marked(bucket, volume):
    rel = "model-00001-of-00002.safetensors"
    (bucket / rel).write_bytes(os.urandom(len(FILES[rel])))
    expected = hashlib.sha256(FILES[rel]).hexdigest()
    with pytest.raises(W.ChecksumMismatch, match=f"{rel}: sha256 is .* SHA256SUMS says {expected}"):
        sync(bucket, volume)
    assert not (volume / TARGET.prefix / rel).exists()
    assert not (volume / REVISION_MARKER).exists()


def test_another_revision_is_refused_without_the_flag(bucket, volume):
    sync(bucket, volume)
    newer = W.WeightsTarget(TARGET.model, "b" * 40, "models/tiny-model/" + "b" * 40 + "/")
    other_bucket = bucket.parent / ("b" * 40)
    other_bucket.mkdir()
    publish(other_bucket)
    conflict = f"serves tiny-model@{'a' * 40}, not tiny-model@{'b' * 40}.*--force-revision"
    with pytest.raises(W.RevisionConflict, match=conflict):
        W.sync_weights(W.LocalDirSource(other_bucket), volume, newer, progress=False)
    assert not (volume / newer.prefix).exists(), "refused before copying anything"
    W.sync_weights(W.LocalDirSource(other_bucket), volume, newer, progress=False, force_revision=True)
    assert json.loads((volume / REVISION_MARKER).read_text())["revision"] == "b" * 40


@pytest.mark.parametrize("line, needle", [
    ("nothex  config.json", "expected '<64 hex digits>  <path>'"),
    (f"{'0' * 64}  ../../etc/passwd", "must stay inside the prefix"),
    (f"{'0' * 64}  /abs/path", "must stay inside the prefix"),
    ("", "lists no files"),
])
def test_bad_manifest_lines_are_named(line, needle):
    with pytest.raises(W.WeightsError, match=needle):
        W.parse_manifest(line + "\n", "s3://b/p")


def test_manifest_accepts_sha256sum_binary_mode():
    assert W.parse_manifest(f"{'A' * 64} *model.safetensors\n", "x") == {"model.safetensors": "a" * 64}


def test_progress_is_shown(bucket, volume, capsys):
    W.sync_weights(W.LocalDirSource(bucket), volume, TARGET, progress=True)
    assert f"tiny-model@{'a' * 8}" in capsys.readouterr().err


# --- the command line, against the prod stack's assist endpoint ------------------------------------


def test_cli_syncs_what_the_burst_server_accepts(planned_stacks, root, tmp_path, monkeypatch, capsys):
    endpoint = planned_stacks["prod"][1].endpoint("assist")
    prefix = endpoint.engine.weights_uri_suffix
    bucket = tmp_path / "cache" / prefix
    bucket.mkdir(parents=True)
    publish(bucket)
    volume = tmp_path / "vol"
    args = ["sync", "--stack", str(root / "stacks/Pulumi.prod.yaml"), "--endpoint", "assist",
            "--source-dir", str(bucket), "--dest-dir", str(volume), "--no-progress"]
    assert W.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["revision"], out["copied"], out["skipped"]) == (endpoint.model_revision, len(FILES), 0)
    assert W.main(args) == 0 and json.loads(capsys.readouterr().out)["skipped"] == len(FILES)

    # The burst server's own start-up check accepts the result.
    for var in (ENV_SPEC_FILE, ENV_STACK, ENV_ENDPOINT):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ENV_SPEC, BurstAppConfig.from_endpoint(endpoint).to_json())
    sys.modules.pop("modal_apps.burst", None)
    importlib.import_module("modal_apps.burst").check_weights_revision(volume)


def test_cli_errors_are_clear(root, tmp_path, capsys):
    assert W.main(["sync", "--stack", str(root / "stacks/Pulumi.prod.yaml"), "--endpoint", "guard",
                   "--dest-dir", str(tmp_path)]) == 2
    assert "'dedicated_only' and no burst capacity" in capsys.readouterr().err
    assert W.main(["sync", "--stack", str(root / "stacks/Pulumi.dev.yaml"), "--endpoint", "assist",
                   "--source-dir", str(tmp_path / "empty"), "--dest-dir", str(tmp_path / "v")]) == 1
    assert "no SHA256SUMS manifest" in capsys.readouterr().err
    assert W.main(["sync", "--stack", "stacks/Pulumi.dev.yaml", "--dest-dir", str(tmp_path)]) == 2
    assert "needs --endpoint" in capsys.readouterr().err


# --- the upload into the Modal Volume, against a stand-in with the same methods --------------------


class FakeVolume:
    """A directory behind the subset of modal.Volume the upload uses (listdir, read_file, batch_upload)."""

    def __init__(self, root, drop: str | None = None):
        self.root, self.drop, self.batches = root, drop, []

    def listdir(self, path, recursive=False):
        base = self.root / path
        if not base.exists():
            raise FileNotFoundError(path)
        return [SimpleNamespace(path=p.relative_to(self.root).as_posix(), size=p.stat().st_size)
                for p in sorted(base.rglob("*")) if p.is_file()]

    def read_file(self, path):
        if not (self.root / path).exists():
            raise FileNotFoundError(path)
        yield (self.root / path).read_bytes()

    @contextlib.contextmanager
    def batch_upload(self, force=False):
        puts = []
        yield SimpleNamespace(put_file=lambda local, remote: puts.append((local, remote)))
        self.batches.append(sorted(r for _, r in puts))
        for local, remote in puts:  # committed together when the context exits
            if remote.endswith(self.drop or "\0"):
                continue  # a file lost on the way
            (self.root / remote).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, self.root / remote)


def test_upload_sends_what_the_volume_lacks_and_the_marker_last(bucket, tmp_path):
    staging = tmp_path / "staging"
    W.sync_weights(W.LocalDirSource(bucket), staging, TARGET, progress=False)
    vol = FakeVolume(tmp_path / "modal-volume")
    assert W.read_volume_marker(vol) is None
    assert W.upload_to_volume(vol, staging, TARGET) == len(FILES)
    assert vol.batches == [sorted(TARGET.prefix + rel for rel in FILES), [REVISION_MARKER]]
    assert_complete(vol.root)
    assert W.read_volume_marker(vol)["revision"] == TARGET.revision
    # Nothing to send the second time; a file shortened in the volume is sent again.
    assert W.upload_to_volume(vol, staging, TARGET) == 0
    (vol.root / TARGET.prefix / "config.json").write_bytes(b"{}")
    assert W.upload_to_volume(vol, staging, TARGET) == 1
    assert_complete(vol.root)


def test_incomplete_upload_is_reported_and_leaves_no_marker(bucket, tmp_path):
    staging = tmp_path / "staging"
    W.sync_weights(W.LocalDirSource(bucket), staging, TARGET, progress=False)
    vol = FakeVolume(tmp_path / "modal-volume", drop="model-00002-of-00002.safetensors")
    with pytest.raises(W.WeightsError, match="upload incomplete, 1 file.*model-00002-of-00002.safetensors"):
        W.upload_to_volume(vol, staging, TARGET)
    assert W.read_volume_marker(vol) is None


def test_a_volume_holding_this_revision_is_recognised_before_anything_is_staged(bucket, tmp_path):
    """The fill runs again on every change of the burst's settings; a volume already complete for this revision is
    recognised from its marker, the published manifest and the sizes listed, so nothing is downloaded again."""
    staging = tmp_path / "staging"
    vol = FakeVolume(tmp_path / "modal-volume")
    source = W.LocalDirSource(bucket)
    assert not W.volume_is_current(vol, source, TARGET)  # empty
    W.sync_weights(source, staging, TARGET, progress=False)
    W.upload_to_volume(vol, staging, TARGET)
    assert W.volume_is_current(vol, source, TARGET)
    other = W.WeightsTarget(TARGET.model, "b" * 40, TARGET.prefix)
    assert not W.volume_is_current(vol, source, other)  # the marker names another revision
    (vol.root / TARGET.prefix / "config.json").write_bytes(b"{}")  # a file short in the volume
    assert not W.volume_is_current(vol, source, TARGET)


def test_the_cli_fills_a_volume_once_and_then_finds_it_current_without_staging(planned_stacks, root, tmp_path,
                                                                               monkeypatch, capsys):
    """The Command's second run (a burst setting changed, not the weights): the volume is recognised as current
    and nothing is downloaded or uploaded; the first run staged and uploaded everything."""
    import modal

    endpoint = planned_stacks["prod"][1].endpoint("assist")
    prefix = endpoint.engine.weights_uri_suffix
    bucket = tmp_path / "cache" / prefix
    bucket.mkdir(parents=True)
    publish(bucket)
    vol = FakeVolume(tmp_path / "modal-volume")
    monkeypatch.setattr(modal.Volume, "from_name", lambda *a, **k: vol)
    staging = tmp_path / "staging"
    args = ["sync", "--stack", str(root / "stacks/Pulumi.prod.yaml"), "--endpoint", "assist",
            "--source-dir", str(bucket), "--staging-dir", str(staging), "--no-progress"]
    assert W.main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["uploaded_to_volume"] == len(FILES) and staging.exists()
    shutil.rmtree(staging)  # a runner with an empty cache
    assert W.main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["current"] is True and second["uploaded_to_volume"] == 0 and not staging.exists()


def test_a_file_republished_at_the_same_size_reaches_the_volume(bucket, tmp_path):
    """A retrained adapter or an edited config republished at the same size: the staging copy is fetched again
    (its hash no longer matches), and the volume gets it too — told by the digests the volume's marker records,
    or, under a marker from before it recorded them, by the staging copy having changed. Compared by size alone
    it kept the old bytes under a marker that called the volume current. A fresh runner (empty staging) still
    sends only what changed."""
    staging = tmp_path / "staging"
    vol = FakeVolume(tmp_path / "modal-volume")
    source = W.LocalDirSource(bucket)
    W.sync_weights(source, staging, TARGET, progress=False)
    W.upload_to_volume(vol, staging, TARGET, previous=W.read_volume_marker(vol))
    assert_complete(vol.root)
    # the tokenizer republished: same size, other bytes
    files = {**FILES, "tokenizer/tokenizer.json": bytes(b ^ 0xFF for b in FILES["tokenizer/tokenizer.json"])}
    publish(bucket, files)
    assert not W.volume_is_current(vol, source, TARGET)  # the manifest changed
    previous = W.read_volume_marker(vol)
    report = W.sync_weights(source, staging, TARGET, progress=False, marker=previous)
    assert report.repaired == ["tokenizer/tokenizer.json"]
    assert W.upload_to_volume(vol, staging, TARGET, previous=previous, changed=frozenset(report.repaired)) == 1
    assert (vol.root / TARGET.prefix / "tokenizer/tokenizer.json").read_bytes() == files["tokenizer/tokenizer.json"]
    assert W.volume_is_current(vol, source, TARGET)
    # a fresh runner (no staging) and another same-size change: the marker's digests pick the one file
    files2 = {**files, "config.json": FILES["config.json"].replace(b"Llama", b"Qwen2")[: len(FILES["config.json"])]
              .ljust(len(FILES["config.json"]), b" ")}
    publish(bucket, files2)
    fresh = tmp_path / "fresh-staging"
    previous = W.read_volume_marker(vol)
    report = W.sync_weights(source, fresh, TARGET, progress=False, marker=previous)
    assert report.repaired == [] and len(report.copied) == len(files2)  # all fetched, none "changed" locally
    assert W.upload_to_volume(vol, fresh, TARGET, previous=previous, changed=frozenset(report.repaired)) == 1
    assert (vol.root / TARGET.prefix / "config.json").read_bytes() == files2["config.json"]
    # a marker written before digests were recorded: the staging copy fetched again says what changed
    old_style = {k: v for k, v in W.read_volume_marker(vol).items() if k != "sha256"}
    publish(bucket, {**files2, "tokenizer/tokenizer.json": FILES["tokenizer/tokenizer.json"]})
    report = W.sync_weights(source, fresh, TARGET, progress=False, marker=old_style)
    assert W.upload_to_volume(vol, fresh, TARGET, previous=old_style, changed=frozenset(report.repaired)) == 1
    assert (vol.root / TARGET.prefix / "tokenizer/tokenizer.json").read_bytes() == FILES["tokenizer/tokenizer.json"]
    # --verify-all repairs the volume: every file sent
    assert W.upload_to_volume(vol, fresh, TARGET, previous=W.read_volume_marker(vol), everything=True) == len(FILES)
