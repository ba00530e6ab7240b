"""The weight-fetch init container against an S3 API (moto on 127.0.0.1) with a real AWS CLI doing the copies.

The floor's image runs aws-cli 2.27.50; this machine's Python carries aws-cli 1.45 (the python machine's image,
`.library/env`), whose `s3 sync` decides what to copy with the same sync strategies (awscli/customizations/s3/
syncstrategy: a download skips a same-size file unless its local time is newer than the object's, or, with
--exact-timestamps, unless the times differ). Skipped where no `aws` is on PATH.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.moto_support import FAKE_CREDENTIALS, client

FETCH = Path(__file__).resolve().parent.parent / "components" / "fetch_weights.sh"
BUCKET, PREFIX = "cache-real-cli", "models/m/rev/"


def _put(s3, files: dict[str, bytes]) -> None:
    """Publish files, then the manifest over every file under the prefix (as the seed writes it, last)."""
    for rel, data in files.items():
        s3.put_object(Bucket=BUCKET, Key=PREFIX + rel, Body=data)
    listed = {o["Key"][len(PREFIX):]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
              for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"] if not o["Key"].endswith("SHA256SUMS")}
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "SHA256SUMS",
                  Body="".join(f"{hashlib.sha256(d).hexdigest()}  {rel}\n" for rel, d in sorted(listed.items())).encode())


def test_an_adapter_republished_at_the_same_size_replaces_the_nodes_copy(tmp_path, moto_endpoint):
    """A node holds tenant-a's adapter; the adapter is retrained at the same rank (same size, other bytes) and
    published under its name. At the next pod start on that node the floor serves the new bytes. aws s3 sync
    alone kept the old copy for good (the download had set the local time to the object's, and a same-size file
    that is not newer locally is skipped); the adapters are now synced with --exact-timestamps."""
    aws = shutil.which("aws")
    if aws is None:
        pytest.skip("no aws CLI on PATH (the python machine's image has aws-cli 1.45)")
    s3 = client("s3", moto_endpoint)
    s3.create_bucket(Bucket=BUCKET)
    config = json.dumps({"peft_type": "LORA", "base_model_name_or_path": "meta-llama/Llama-3.3-70B-Instruct"})
    _put(s3, {"model.safetensors": b"weights" * 100, "config.json": b"{}",
              "adapters/tenant-a/adapter_config.json": config.encode(),
              "adapters/tenant-a/adapter_model.safetensors": b"A" * 4096})
    local = tmp_path / "nvme" / "m" / "rev"
    env = {**os.environ, **FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": moto_endpoint, "AWS_DEFAULT_REGION": "us-east-1",
           "WEIGHTS_URI": f"s3://{BUCKET}/{PREFIX}", "LOCAL_DIR": str(local), "START_JITTER_S": "0",
           "STALE_LOCK_S": "120", "LOCK_WAIT_MAX_S": "60", "LOCK_POLL_S": "1",
           "LORA_DIR": f"{local}.lora", "LORA_SRC": f"{local}/adapters", "ADAPTERS_URI": f"s3://{BUCKET}/{PREFIX}adapters/"}
    env.pop("AWS_PROFILE", None)

    def start() -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", str(FETCH)], env=env, capture_output=True, text=True, timeout=120)

    r = start()
    assert r.returncode == 0, r.stdout + r.stderr
    served = Path(f"{local}.lora") / "tenant-a" / "adapter_model.safetensors"
    assert served.read_bytes() == b"A" * 4096
    time.sleep(1.1)  # S3 times are whole seconds: the re-published object is strictly newer
    _put(s3, {"adapters/tenant-a/adapter_model.safetensors": b"B" * 4096})
    r = start()
    assert r.returncode == 0 and "already on this node" in r.stdout, r.stdout + r.stderr
    assert (local / "adapters" / "tenant-a" / "adapter_model.safetensors").read_bytes() == b"B" * 4096
    assert served.read_bytes() == b"B" * 4096
