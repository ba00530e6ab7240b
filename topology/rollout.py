"""Model rollout inputs and model-version identity: eval gate → shadow → canary by user → promote, N−1 warm.

A model version is what produces outputs: the weights revision, the engine image and the engine settings
that can change outputs. An engine bump on the same weights is a new version and rolls out like one.
These are input models (validated at the boundary, like `inputs.py`) and pure helpers; the planner's
decisions about a rollout live in `topology/plan/rollout.py`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .input_model import InputModel, not_after_today

from .names import check_revision

VERSION_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"  # a Kubernetes label value: it labels the pods of each version
# Engine settings that can change what a model answers (numerics, tokenisation, parallel reduction order);
# settings that only change speed or admission (max_num_seqs, prefix caching, memory share) are left out.
OUTPUT_SETTINGS = ("tokenizer", "tensor_parallel_size", "kv_cache_dtype", "quantization", "max_model_len")
Stage = Literal["shadow", "canary", "promoted", "rolled_back"]


_Inputs = InputModel  # NaN, infinity and booleans for numbers refused as in every other input


def engine_settings_sha256(settings: dict[str, object]) -> str:
    """16 hex digits over the output-changing engine settings, canonical JSON (key order never matters)."""
    missing = [k for k in OUTPUT_SETTINGS if k not in settings]
    if missing:
        raise ValueError(f"engine settings lack {missing}")
    body = json.dumps({k: settings[k] for k in OUTPUT_SETTINGS}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def identity_sha256(weights_revision: str, engine_image: str, settings_sha256: str) -> str:
    """16 hex digits naming one model version: weights + engine image + output-changing settings."""
    return hashlib.sha256(f"{weights_revision}\n{engine_image}\n{settings_sha256}".encode()).hexdigest()[:16]


class CandidateVersion(_Inputs):
    """The candidate model version: what differs from the incumbent (unset fields keep the incumbent's)."""

    version: str = Field(pattern=VERSION_PATTERN, description="Version name (a new name for any change), e.g. 'assist-2026-12'.")
    weights_revision: str = Field(min_length=1, description="Pinned weights revision of the candidate.")
    engine_image: str | None = Field(default=None, min_length=1, description="Engine image (default: the incumbent's).")
    kv_cache_dtype: Literal["auto", "fp8"] | None = Field(default=None, description="KV-cache dtype (default: the incumbent's).")
    quantization: Literal["fp8"] | None = Field(
        default=None, description="Online quantization of bf16 weights (default: the incumbent's, usually none)."
    )

    @field_validator("weights_revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        return check_revision(v)  # a pod label value and an S3 prefix segment, like the incumbent's


class OutcomeMetric(_Inputs):
    """What the canary is judged by: an outcome users act on, compared between the two arms."""

    name: str = Field(min_length=1, max_length=80, description="Outcome metric, e.g. 'draft_acceptance_rate' or 'edit_distance'.")
    higher_is_better: bool = Field(description="Direction of improvement.")
    comparison_window_hours: int = Field(
        ge=1, le=24 * 30, description="Hours of canary traffic compared before a promotion decision (cover a weekly rhythm if possible)."
    )


class QualitySampling(_Inputs):
    """A share of production requests and responses per model version, kept for offline evaluation."""

    sample_fraction: float = Field(gt=0, le=0.05, description="Share of requests sampled (at most 5%: prompts are customer data).")
    sink_uri: str = Field(
        pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([A-Za-z0-9._/-]+/)?$",
        description="Evaluation sink: s3://bucket/prefix/ (each version writes under <prefix><endpoint>/<version>/).",
    )


class EvalRecord(_Inputs):
    """One offline evaluation of one model version, as the evaluation pipeline writes it."""

    version: str = Field(pattern=VERSION_PATTERN, description="Version name evaluated.")
    weights_revision: str = Field(min_length=1, description="Weights revision evaluated.")
    engine_image: str = Field(min_length=1, description="Engine image evaluated.")
    engine_settings_sha256: str = Field(pattern=r"^[0-9a-f]{16}$", description="Output-changing engine settings evaluated (see the plan report).")
    metric: str = Field(min_length=1, max_length=80, description="Metric name.")
    value: float = Field(description="Measured value.")
    threshold: float = Field(description="Pass threshold.")
    higher_is_better: bool = Field(description="Direction: pass means value ≥ threshold (or ≤ when false).")
    dataset: str = Field(min_length=1, max_length=200, description="Dataset name and version.")
    evaluated_on: dt.date = Field(description="Date of the evaluation.")

    @property
    def passed(self) -> bool:
        return self.value >= self.threshold if self.higher_is_better else self.value <= self.threshold


class EvalRecordsFile(_Inputs):
    """The evaluation-record file named by `rollout.eval_records_path`."""

    records: list[EvalRecord] = Field(min_length=1, max_length=1000, description="Evaluation records.")


class RolloutInputs(_Inputs):
    """One endpoint's model rollout. Promotion and rollback are each one change of `stage`."""

    incumbent_version: str = Field(pattern=VERSION_PATTERN, description="Version name of what the endpoint serves now.")
    incumbent_identity_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{16}$",
        description="Pinned identity of the incumbent (from the plan report); planning fails if the served weights, "
        "engine image or settings no longer match it — such a change is a new version.",
    )
    candidate: CandidateVersion = Field(description="The version being rolled out.")
    stage: Stage = Field(
        description="shadow: mirrored requests, responses discarded; canary: a share of users; promoted: the "
        "candidate serves everyone and the incumbent is kept warm; rolled_back: the incumbent serves everyone."
    )
    eval_records_path: str = Field(
        min_length=1, description="File of offline evaluation records (YAML/JSON, `records:`), relative to the project root."
    )
    eval_records: tuple[EvalRecord, ...] | None = Field(
        default=None, description="Filled by the loader from eval_records_path; not written by hand."
    )
    shadow_percent: float = Field(default=5, gt=0, le=20, description="Share of requests mirrored to the candidate in shadow.")
    canary_percent: float = Field(default=5, gt=0, le=50, description="Share of users (stable hash) served by the candidate in canary.")
    canary_hash_key: Literal["user", "session"] = Field(default="user", description="What the canary hash reads: user or session id.")
    outcome_metric: OutcomeMetric = Field(description="Outcome metric the canary is judged by, and its comparison window.")
    promoted_on: dt.date | None = Field(default=None, description="Date of promotion (required when stage is promoted).")
    previous_warm_replicas: int = Field(
        default=1, ge=1, le=64, description="Replicas of the previous version kept warm after promotion (rollback without a cold start)."
    )
    previous_warm_days: int = Field(default=7, ge=1, le=30, description="Days the previous version is kept warm after promotion.")
    quality_sampling: QualitySampling | None = Field(default=None, description="Production sampling into an evaluation sink.")

    @field_validator("promoted_on")
    @classmethod
    def _promoted_in_the_past(cls, v: dt.date | None, info: ValidationInfo) -> dt.date | None:
        # a promotion dated ahead kept the previous version "warm now" until a week past that date
        return not_after_today(v, info, "the date the candidate was promoted")

    @model_validator(mode="after")
    def _promotion_date(self) -> "RolloutInputs":
        if self.stage == "promoted" and self.promoted_on is None:
            raise ValueError("rollout.stage=promoted needs rollout.promoted_on (the date of promotion, YYYY-MM-DD)")
        if self.stage in ("shadow", "canary") and self.promoted_on is not None:
            raise ValueError(f"rollout.promoted_on={self.promoted_on} is set but rollout.stage={self.stage!r}: "
                             "a version in shadow or canary has not been promoted")
        return self
