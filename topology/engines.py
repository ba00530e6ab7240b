"""Engine versions: the vLLM command-line flags and metric names that depend on the pinned engine image.

One row per supported vLLM release series, read in each release's own source (the `vllm` wheels from
PyPI: vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py, vllm/v1/metrics/loggers.py,
vllm/plugins/lora_resolvers/filesystem_resolver.py). The engine image's tag picks the row, so an image
bump changes the flags the pods run with and the metric names the alerts and autoscaler read together;
a version without a row is refused at planning time.

What differs between the series, and why the rows say what they say:
- Request logging. 0.10.0 logs every request unless `--disable-log-requests` is passed
  (`disable_log_requests: bool = False`). From 0.10.2 the default is off (`enable_log_requests: bool =
  False`) and `--disable-log-requests` is deprecated ("will be removed in v0.12.0"); 0.12.0 and 0.13.0 still
  parse it (argparse `deprecated=True`) but nothing reads it. So 0.11+ rows pass nothing: the same quiet log,
  with no deprecated flag on the command line.
- Inter-token latency. 0.10.0 exports only `vllm:time_per_output_token_seconds`; 0.10.2 adds
  `vllm:inter_token_latency_seconds` (fed the same observations); 0.11 deprecates the old name, 0.12 hides
  it behind `--show-hidden-metrics-for-version=0.11`, 0.13 keeps it hidden (the 0.11 switch no longer
  matches the previous minor). The 0.10 row reads the name every 0.10.x has; 0.11+ rows read the new one.
- KV-cache usage is `vllm:kv_cache_usage_perc` in every supported series (`vllm:gpu_cache_usage_perc`
  is deprecated from 0.9, hidden in 0.11, gone in 0.12); the prefix-cache counters are
  `vllm:prefix_cache_{queries,hits}` (the `gpu_`-prefixed ones likewise).
- Unchanged across 0.10.0–0.13.0, checked: every other flag the project passes (`--served-model-name`,
  `--tokenizer`, `--max-model-len`, `--max-num-seqs`, `--max-num-batched-tokens`, `--tensor-parallel-size`,
  `--gpu-memory-utilization`,
  `--kv-cache-dtype`, `--generation-config`, `--override-generation-config`, `--port`,
  `--[no-]enable-prefix-caching`, `--quantization`, `--enable-lora`, `--max-loras`, `--max-cpu-loras`,
  `--max-lora-rank`, and on the burst tier `--host`, `--enable-sleep-mode`), the `lora_filesystem_resolver`
  plugin entry point with `VLLM_LORA_RESOLVER_CACHE_DIR`, `VLLM_SERVER_DEV_MODE` and the `/sleep`,
  `/wake_up` routes.

prometheus_client exposes a Counter `x` as `x_total` and a Histogram's buckets as `x_bucket`: the table
holds the series names as Prometheus stores them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .spec import EngineMetrics

DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.11.0"


class EngineVersionError(ValueError):
    """The engine image names no vLLM version, or one without a row in the table."""


@dataclass(frozen=True)
class EngineRelease:
    """What the project passes to, and reads from, one vLLM release series."""

    series: str
    checked_releases: tuple[str, ...]
    request_log_flags: tuple[str, ...]
    metrics: EngineMetrics


def _metrics(inter_token_family: str) -> EngineMetrics:
    return EngineMetrics(
        requests_waiting="vllm:num_requests_waiting",
        requests_running="vllm:num_requests_running",
        kv_cache_usage="vllm:kv_cache_usage_perc",
        preemptions_total="vllm:num_preemptions_total",
        prefix_cache_queries_total="vllm:prefix_cache_queries_total",
        prefix_cache_hits_total="vllm:prefix_cache_hits_total",
        prompt_tokens_bucket="vllm:request_prompt_tokens_bucket",
        ttft_seconds_bucket="vllm:time_to_first_token_seconds_bucket",
        inter_token_seconds_bucket=f"{inter_token_family}_bucket",
    )


ENGINE_RELEASES: dict[str, EngineRelease] = {
    r.series: r
    for r in (
        EngineRelease("0.10", ("0.10.0", "0.10.2"), ("--disable-log-requests",),
                      _metrics("vllm:time_per_output_token_seconds")),
        EngineRelease("0.11", ("0.11.0",), (), _metrics("vllm:inter_token_latency_seconds")),
        EngineRelease("0.12", ("0.12.0",), (), _metrics("vllm:inter_token_latency_seconds")),
        EngineRelease("0.13", ("0.13.0",), (), _metrics("vllm:inter_token_latency_seconds")),
    )
}

_VERSION_TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[-+][0-9A-Za-z.+-]*)?$")


def image_vllm_version(image: str) -> str:
    """The vLLM version an image tag pins (`vllm/vllm-openai:v0.11.0[@sha256:…]` -> '0.11.0')."""
    ref = image.split("@", 1)[0]
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # no tag at all (a ':' only in a registry host:port)
        raise EngineVersionError(
            f"engine image {image!r} has no version tag: pin a vLLM release tag such as "
            f"{DEFAULT_ENGINE_IMAGE!r}, which picks the engine flags and metric names"
        )
    m = _VERSION_TAG.match(tag)
    if m is None:
        raise EngineVersionError(
            f"engine image {image!r}: tag {tag!r} is not a vLLM release version (vX.Y.Z); "
            f"supported series: {', '.join(supported_series())}"
        )
    return f"{int(m[1])}.{int(m[2])}.{int(m[3])}"


def supported_series() -> list[str]:
    return [f"{s}.x" for s in ENGINE_RELEASES]


def engine_release(image: str) -> tuple[str, EngineRelease]:
    """(pinned version, its row) for an engine image; EngineVersionError names the image and what is allowed."""
    version = image_vllm_version(image)
    series = ".".join(version.split(".")[:2])
    release = ENGINE_RELEASES.get(series)
    if release is None:
        raise EngineVersionError(
            f"engine image {image!r} pins vLLM {version}, which has no row in topology/engines.py; "
            f"supported: {', '.join(supported_series())} (flags and metric names were checked per series)"
        )
    return version, release
