"""WeightSeed: copy the weights already in the source bucket into a new region-local cache, on `pulumi up`.

S3 replication copies only new writes, so a cache bucket created by this stack starts empty and floor
pods would find no weights. A `pulumi_command.local.Command` runs `python -m ops.seed_weights` (resumable,
verified against each prefix's SHA256SUMS, a no-op when the cache is complete) for every model prefix the
cache holds; the engine Deployments and the Modal weights sync depend on it.

- `update` runs the same command as `create`: a change of prefixes copies the new revision in place; the
  default (replace) would run create-new-then-delete-old.
- No `delete`: the cache is protected and keeps its weights when the step goes.
- Triggers: the buckets, the prefixes, and the seeding code.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_command as command

from topology.spec import WeightCacheSpec

from ._common import TYPE_PREFIX, child
from .modal_burst import default_python

_ROOT = Path(__file__).resolve().parent.parent
SEED_SOURCES = ("ops/seed_weights.py", "modal_apps/weights.py")


def seed_code_sha256(root: Path = _ROOT) -> str:
    h = hashlib.sha256()
    for rel in SEED_SOURCES:
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    return h.hexdigest()


def seed_command(cache: WeightCacheSpec, python: str) -> str:
    args = [python, "-m", "ops.seed_weights",
            "--source-bucket", cache.source_bucket, "--source-region", cache.source_region,
            "--dest-bucket", cache.bucket_name, "--dest-region", cache.region]
    for prefix in sorted(cache.model_prefixes):
        args += ["--prefix", prefix]
    return " ".join(shlex.quote(a) for a in args)


@dataclass(frozen=True)
class WeightSeedArgs:
    cache: WeightCacheSpec
    python: str | None = None


class WeightSeed(pulumi.ComponentResource):
    command: command.local.Command

    def __init__(self, name: str, args: WeightSeedArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:WeightSeed", name, None, opts)
        cmd = seed_command(args.cache, args.python or default_python())
        self.command = command.local.Command(
            f"{name}-copy",
            create=cmd,
            update=cmd,
            triggers=[args.cache.bucket_name, args.cache.source_bucket, *sorted(args.cache.model_prefixes),
                      seed_code_sha256()],
            opts=child(self),
        )
        self.register_outputs({"summary": self.command.stdout})
