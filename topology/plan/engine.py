"""The vLLM engine settings both tiers run (responses must not depend on the tier), and LoRA sizing."""

from __future__ import annotations

from ..engines import EngineVersionError, engine_release
from ..inputs import EndpointInputs
from ..spec import Derivation, EngineSpec, LoraSettings
from .errors import PlanningError
from .placement import ACTIVATION_OVERHEAD_GB_PER_GPU, GB_PER_MIB, GPU_MEMORY_UTILIZATION, Placement
from .limits import step_token_budget
from .section import Section
from .weights import weights_prefix

LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def lora_section(ep: EndpointInputs, pl: Placement) -> tuple[LoraSettings | None, list[str], list[Derivation]]:
    if ep.lora is None or ep.lora.count == 0:
        return None, [], []
    lo = ep.lora
    max_loras = min(lo.active_working_set, pl.usable_concurrency)
    rank = next((r for r in LORA_RANKS if r >= lo.rank), LORA_RANKS[-1])
    adapters_gb = max_loras * lo.size_mb / 1000.0
    kv_gb_per_token = ep.model.kv_cache_mib_per_token * GB_PER_MIB
    kv_needed = pl.usable_concurrency * (ep.shape.input_tokens_mean + ep.shape.output_tokens_mean) * kv_gb_per_token
    headroom = pl.memory_gb * GPU_MEMORY_UTILIZATION - ep.model.weights_gb - ACTIVATION_OVERHEAD_GB_PER_GPU * pl.gpus_per_replica - kv_needed
    warnings = []
    if adapters_gb > headroom:
        warnings.append(
            f"{ep.name}: LoRA working set {max_loras} × {lo.size_mb:g} MB = {adapters_gb:.2f} GB exceeds the memory "
            f"headroom {headroom:.2f} GB left after weights and KV for {pl.usable_concurrency} sequences at the "
            "mean context: expect adapter-cache thrash (fewer max_loras, smaller ranks, or more replicas)"
        )
    d = [Derivation(
        figure="lora_memory_headroom_gb", value=round(headroom, 3), unit="GB",
        formula=f"{pl.memory_gb:g}×{GPU_MEMORY_UTILIZATION} − {ep.model.weights_gb:g} − "
        f"{ACTIVATION_OVERHEAD_GB_PER_GPU * pl.gpus_per_replica:g} − KV {kv_needed:.2f}; adapters need {adapters_gb:.2f}",
        inputs=("model.weights_gb", "model.kv_cache_mib_per_token", "lora.size_mb", "lora.active_working_set"),
    )]
    return LoraSettings(
        enable_lora=True, max_loras=max_loras, max_cpu_loras=max(max_loras, min(lo.count, 4 * lo.active_working_set)),
        max_lora_rank=rank, adapters_gb_on_gpu=round(adapters_gb, 3), memory_headroom_gb=round(headroom, 3),
    ), warnings, d


def engine_section(ep: EndpointInputs, pl: Placement) -> Section[EngineSpec]:
    s = ep.shape
    lora, lora_warn, lora_d = lora_section(ep, pl)
    prefix = weights_prefix(ep.model.name, ep.model.revision)
    try:
        vllm_version, release = engine_release(ep.engine_image)
    except EngineVersionError as e:
        raise PlanningError(f"endpoint {ep.name!r}: engine_image: {e}") from None
    engine = EngineSpec(
        image=ep.engine_image, vllm_version=vllm_version, request_log_flags=release.request_log_flags,
        metrics=release.metrics, served_model_name=ep.model.name, model_revision=ep.model.revision,
        tokenizer=ep.model.tokenizer, weights_uri_suffix=prefix, max_model_len=s.product_max_context_tokens,
        max_tokens=s.max_tokens, max_num_seqs=pl.usable_concurrency,
        max_num_batched_tokens=step_token_budget(pl, pl.usable_concurrency),
        tensor_parallel_size=pl.gpus_per_replica,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION, enable_prefix_caching=True,
        cache_salt_per_tenant=len(ep.tenants) > 1, kv_cache_dtype="auto", quantization=None, lora=lora,
    )
    return Section(engine, tuple(lora_d), tuple(lora_warn))
