"""The weight caches: one protected bucket per region, holding every served model revision and a
rollout candidate's (both stay while a rollout is declared: either may serve after one config change)."""

from __future__ import annotations

from ..inputs import CostInputs
from ..spec import WeightCacheSpec


def bucket_name(inp: CostInputs, region: str) -> str:
    return f"{inp.project}-{inp.environment}-weights-{region}"


def weights_prefix(model_name: str, revision: str) -> str:
    """Where one model revision's weights live in every weight cache (and its adapters, below it)."""
    return f"models/{model_name}/{revision}/"


def weight_caches(inputs: CostInputs) -> tuple[WeightCacheSpec, ...]:
    prefixes = sorted({weights_prefix(e.model.name, e.model.revision) for e in inputs.endpoints}
                      | {weights_prefix(e.model.name, e.rollout.candidate.weights_revision)
                         for e in inputs.endpoints if e.rollout is not None})
    return tuple(
        WeightCacheSpec(
            region=r.name, bucket_name=bucket_name(inputs, r.name), source_bucket=inputs.weights_source_bucket,
            source_region=inputs.weights_source_region or inputs.cluster_region,
            model_prefixes=tuple(prefixes), vpc_id=r.vpc_id, protect=True,
        )
        for r in inputs.regions
    )
