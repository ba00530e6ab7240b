"""What one serverless container bills: its GPUs, the cores and the host memory it reserves (Modal bills all three
per second, times the region multiplier). One place for the planner, the burst spec and the simulator's bill."""

from __future__ import annotations

from dataclasses import dataclass

from .. import costs
from ..inputs import CostInputs, EndpointInputs


@dataclass(frozen=True)
class ContainerPrice:
    gpus: int
    cpu_cores: float
    memory_mib: int
    usd_per_s: float  # GPUs, cores and memory, region multiplier included
    gpu_usd_per_s: float  # the GPUs' share alone, region multiplier included

    @property
    def usd_per_hour(self) -> float:
        return self.usd_per_s * costs.SECONDS_PER_HOUR

    @property
    def host_share(self) -> float:
        """Cores and memory as a share of the container's bill."""
        return 1.0 - self.gpu_usd_per_s / self.usd_per_s if self.usd_per_s > 0 else 0.0


def container_price(inp: CostInputs, ep: EndpointInputs, gpus: int) -> ContainerPrice:
    sls, pr = ep.serverless, inp.prices
    cores, mib = costs.serverless_container_resources(sls.cpu_cores_per_container, sls.memory_gib_per_container, gpus,
                                                      ep.model.weights_gb)
    gpu_s = pr.serverless_usd_per_gpu_second[sls.gpu_kind]
    usd_s = costs.serverless_container_usd_per_s(gpu_s, gpus, cores, pr.serverless_usd_per_cpu_core_second, mib,
                                                 pr.serverless_usd_per_memory_gib_second, sls.price_multiplier)
    return ContainerPrice(gpus, cores, mib, usd_s, gpu_s * gpus * sls.price_multiplier)
