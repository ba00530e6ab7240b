"""The endpoint's economics by the GPU-time-per-request method (whole-GPU, measured figures: the doctrine's
method): $/request dedicated and reserved at saturation, against the managed API, the break-even duty cycles,
and the serverless premium."""

from __future__ import annotations

from ..inputs import CostInputs, EndpointInputs
from ..spec import Derivation, Economics
from .. import costs
from .container_price import container_price
from .demand import Demand
from .placement import Placement
from .section import Section


def economics_section(inp: CostInputs, ep: EndpointInputs, demand: Demand, ok: list[Placement], pl: Placement) -> Section[Economics]:
    s = ep.shape
    prices = inp.prices
    od = prices.dedicated_on_demand_usd_per_gpu_hour[pl.gpu_kind]
    reserved = od * (1 - prices.reserved_discount_fraction)
    ref = next((p for p in ok if p.gpu_kind == pl.gpu_kind and p.mig_profile is None), pl)
    gpu_s = ref.gpu_s_per_request
    ded_req = costs.dedicated_usd_per_request(gpu_s, od)
    res_req = costs.dedicated_usd_per_request(gpu_s, reserved)
    api_req = None
    be_od = be_res = None
    if ep.managed_api is not None:
        api_req = costs.api_usd_per_request(
            s.input_tokens_mean, s.output_tokens_mean,
            ep.managed_api.usd_per_million_input_tokens, ep.managed_api.usd_per_million_output_tokens,
        )
        be_od = costs.break_even_duty_cycle(ded_req, api_req)
        be_res = costs.break_even_duty_cycle(res_req, api_req)
    sls_kind = ep.serverless.gpu_kind
    # a serverless GPU-second as billed: the container's cores and memory shared over its GPUs
    sls_gpus = next((p.gpus_per_replica for p in ok if p.gpu_kind == sls_kind and p.mig_profile is None), 1)
    sls_price = container_price(inp, ep, sls_gpus)
    premium = costs.serverless_premium(sls_price.usd_per_s / sls_gpus, prices.dedicated_on_demand_usd_per_gpu_hour[sls_kind])
    be_hours = costs.serverless_break_even_busy_hours_per_day(premium)
    weekly_req = costs.weekly_requests(demand.mean_rps)
    econ = Economics(
        gpu_s_per_request=round(gpu_s, 4),
        dedicated_usd_per_request_at_saturation=round(ded_req, 7),
        reserved_usd_per_request_at_saturation=round(res_req, 7),
        api_usd_per_request=None if api_req is None else round(api_req, 7),
        break_even_duty_cycle_on_demand=None if be_od is None else round(be_od, 4),
        break_even_duty_cycle_reserved=None if be_res is None else round(be_res, 4),
        serverless_premium=round(premium, 3),
        serverless_break_even_busy_hours_per_day=round(be_hours, 2),
        weekly_requests=round(weekly_req, 1),
        mean_requests_per_s=round(float(demand.mean_rps.mean()), 4),
        peak_requests_per_s=round(float(demand.peak_rps.max()), 4),
    )
    h = ep.prefix_cache_hit_fraction
    derivs = [
        Derivation(
            figure="gpu_s_per_request", value=econ.gpu_s_per_request, unit="GPU-s",
            formula=f"{ref.gpus_per_replica} × ({s.output_tokens_mean:g}/{ref.decode_tokens_per_s:.0f} + "
            f"{s.input_tokens_mean:g}×(1−{h:g})/{ref.prefill_tokens_per_s:g})",
            inputs=("shape.output_tokens_mean", "shape.input_tokens_mean", "engine.decode_tokens_per_s",
                    "engine.prefill_tokens_per_s", "prefix_cache_hit_fraction", "engine.gpus_per_replica"),
        ),
        Derivation(
            figure="dedicated_usd_per_request_at_saturation", value=econ.dedicated_usd_per_request_at_saturation,
            unit="USD", formula=f"{gpu_s:.3f} GPU-s × ${od:g}/GPU-h / 3600",
            inputs=("prices.dedicated_on_demand_usd_per_gpu_hour",),
        ),
        Derivation(
            figure="serverless_break_even_busy_hours_per_day", value=econ.serverless_break_even_busy_hours_per_day,
            unit="h/day", formula=f"24 / premium {premium:.2f} (= (${prices.serverless_usd_per_gpu_second[sls_kind]:g}/GPU-s + "
            f"({sls_price.cpu_cores:g} cores × ${prices.serverless_usd_per_cpu_core_second:g} + "
            f"{sls_price.memory_mib / 1024:.2f} GiB × ${prices.serverless_usd_per_memory_gib_second:g}) / {sls_gpus}) × "
            f"{ep.serverless.price_multiplier:g} × 3600 / ${prices.dedicated_on_demand_usd_per_gpu_hour[sls_kind]:g}/GPU-h; "
            f"cores and memory shared over the container's {sls_gpus} GPU)",
            inputs=("prices.serverless_usd_per_gpu_second", "prices.serverless_usd_per_cpu_core_second",
                    "prices.serverless_usd_per_memory_gib_second", "serverless.region_price_multiplier",
                    "prices.dedicated_on_demand_usd_per_gpu_hour"),
        ),
    ]
    if api_req is not None and ep.managed_api is not None:
        derivs += [
            Derivation(
                figure="api_usd_per_request", value=econ.api_usd_per_request or 0.0, unit="USD",
                formula=f"({s.input_tokens_mean:g} × ${ep.managed_api.usd_per_million_input_tokens:g} + "
                f"{s.output_tokens_mean:g} × ${ep.managed_api.usd_per_million_output_tokens:g}) / 1e6",
                inputs=("managed_api.usd_per_million_input_tokens", "managed_api.usd_per_million_output_tokens"),
            ),
            Derivation(
                figure="break_even_duty_cycle_on_demand", value=econ.break_even_duty_cycle_on_demand or 0.0,
                unit="fraction", formula=f"{ded_req:.6f} / {api_req:.6f}", inputs=(),
            ),
        ]
    return Section(econ, tuple(derivs))
