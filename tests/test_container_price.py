"""What a serverless container bills: its GPUs, the cores and the host memory it reserves, all times the region
multiplier (Modal bills each per second at the greater of reservation and use, and applies the region multiplier to
all three: modal.com/docs/guide/resources and /docs/guide/region-selection). The plan, the deployed app and the
simulator's bill must agree on it, and a plan that priced the GPU alone undercounted every serverless option."""

from __future__ import annotations

import pytest

from pathlib import Path

from topology import costs, plan
from topology.loading import InputError, inputs_from_document
from topology.plan.container_price import container_price
from topology.report import terminal
from simulator.simulate import simulate_endpoint

from inputs_factory import inputs_dict, set_path

ROOT = Path(__file__).resolve().parent.parent


def test_hand_worked_container_price():
    # Modal list prices: H100 $0.001097/s, a physical core $0.0000131/s, a GiB $0.00000222/s; 3 cores, 64 GiB,
    # pinned to a broad region (1.5×): 3.9492 + 0.14148 + 0.511488 = $4.602168/h before the multiplier
    usd_s = costs.serverless_container_usd_per_s(0.001097, 1, 3.0, 0.0000131, 65536, 0.00000222, 1.5)
    assert usd_s * 3600 == pytest.approx(4.602168 * 1.5, rel=1e-12)
    # the GPU alone was what the plan priced before: $5.9238/h, 14.2% under the bill
    assert (usd_s * 3600 - 5.9238) / (usd_s * 3600) == pytest.approx(0.1419, abs=1e-4)


def test_default_reservation_is_vllms_minimum_cores_and_the_weights():
    # vLLM: 2 + N physical cores (API server, engine core, one worker per GPU); memory: the served weights,
    # 70 GB = 66,757.2 MiB rounded up to whole MiB
    assert costs.serverless_container_resources(None, None, 2, 70.0) == (4.0, 66758)
    assert costs.serverless_container_resources(6.0, 16.0, 2, 70.0) == (6.0, 16384)


def _inputs(**over):
    d = inputs_dict()
    for path, value in over.items():
        d = set_path(d, path, value)
    return inputs_from_document(d, "test.yaml", ROOT)


def test_plan_prices_the_container_and_the_burst_spec_reserves_it(planned_stacks):
    for name in planned_stacks:
        inp, spec = planned_stacks[name]
        for ep in inp.endpoints:
            e = spec.endpoint(ep.name)
            if e.burst is None:
                continue
            gpus = e.burst.gpus_per_container
            cores, mib = costs.serverless_container_resources(None, None, gpus, ep.model.weights_gb)
            assert (e.burst.cpu_cores, e.burst.memory_mib) == (cores, mib) and cores == 2 + gpus
            p = inp.prices
            by_hand = (p.serverless_usd_per_gpu_second[ep.serverless.gpu_kind] * gpus
                       + cores * p.serverless_usd_per_cpu_core_second
                       + mib / 1024 * p.serverless_usd_per_memory_gib_second) * ep.serverless.price_multiplier * 3600
            assert e.burst.usd_per_container_hour == pytest.approx(by_hand, abs=1e-4)
            d = next(d for d in e.derivations if d.figure == "burst_usd_per_container_hour")
            assert "cores" in d.formula and "GiB" in d.formula and "serverless.cpu_cores_per_container" in d.inputs
            # and the report says what a running container bills
            line = next(x for x in terminal(spec).splitlines() if x.strip().startswith("burst: Modal")
                        and f"${e.burst.usd_per_container_hour:.2f}/h" in x)
            assert f"{cores:g} cores and {mib / 1024:.1f} GiB reserved" in line


def _serverless_only(inp):
    e = plan(inp).endpoints[0]
    return next(a for a in e.alternatives if a.option == "serverless_only")


def test_serverless_options_cost_what_the_container_bills():
    """The same traffic keeps the same containers alive: the serverless-only bill scales with the container's
    price exactly, and pricing the cores and memory at zero gives back the GPU-only figure."""
    free_host = _inputs(**{"prices.serverless_usd_per_cpu_core_second": 0.0,
                           "prices.serverless_usd_per_memory_gib_second": 0.0})
    billed = _inputs()
    a, b = _serverless_only(free_host), _serverless_only(billed)
    assert a.feasible and b.feasible
    ep = billed.endpoints[0]
    gpus = next(x.gpus_per_replica for x in ep.engine if x.gpu_kind == ep.serverless.gpu_kind)
    pa, pb = container_price(free_host, ep, gpus), container_price(billed, ep, gpus)
    assert pa.usd_per_s == pytest.approx(pa.gpu_usd_per_s, rel=1e-15)
    ratio = b.breakdown_usd["serverless"] / a.breakdown_usd["serverless"]
    assert ratio == pytest.approx(pb.usd_per_s / pa.usd_per_s, rel=1e-6)
    assert ratio > 1.05


def test_simulator_bills_the_reserved_cores_and_memory(planned_stacks):
    inputs, spec = planned_stacks["dev"]
    ep = spec.endpoint("assist")
    assert ep.burst is not None
    free = inputs.model_copy(update={"prices": inputs.prices.model_copy(update={
        "serverless_usd_per_cpu_core_second": 0.0, "serverless_usd_per_memory_gib_second": 0.0})})
    billed = simulate_endpoint(inputs, spec, "assist", seed=3, start_h=9, end_h=12)
    gpu_only = simulate_endpoint(free, spec, "assist", seed=3, start_h=9, end_h=12)
    assert billed.cost_usd["serverless"] > 0
    b = ep.burst
    p = inputs.prices
    gpu = p.serverless_usd_per_gpu_second[b.gpu_kind] * b.gpus_per_container
    whole = gpu + b.cpu_cores * p.serverless_usd_per_cpu_core_second + b.memory_mib / 1024 * p.serverless_usd_per_memory_gib_second
    mult = inputs.endpoints[0].serverless.price_multiplier
    # the same containers in both runs (prices steer nothing), so the bills stand as the container prices do; the
    # results are rounded to the cent, hence the tolerance (±0.005 on each of ~$35)
    assert gpu_only.gpu_hours == billed.gpu_hours and billed.gpu_hours["serverless"] > 0
    assert billed.cost_usd["serverless"] / gpu_only.cost_usd["serverless"] == pytest.approx(whole / gpu, rel=3e-4)
    assert b.usd_per_container_hour == pytest.approx(whole * mult * 3600, abs=1e-4)


@pytest.mark.parametrize("field,value,fragment", [
    ("endpoints.0.serverless.cpu_cores_per_container", 0.05, "cpu_cores_per_container"),
    ("endpoints.0.serverless.memory_gib_per_container", 0, "memory_gib_per_container"),
    ("prices.serverless_usd_per_cpu_core_second", -1e-5, "serverless_usd_per_cpu_core_second"),
    ("prices.serverless_usd_per_memory_gib_second", "cheap", "serverless_usd_per_memory_gib_second"),
])
def test_bad_reservation_or_price_is_named(field, value, fragment):
    d = set_path(inputs_dict(), field, value)
    with pytest.raises(InputError) as e:
        inputs_from_document(d, "test.yaml", ROOT)
    assert fragment in str(e.value)


@pytest.mark.parametrize("region,multiplier", [("us", 1.5), ("eu", 1.5), ("us-east", 1.75), ("eu-west", 1.75)])
def test_region_multiplier_defaults_to_modals_for_the_region(region, multiplier, recwarn):
    """Modal: a broad region (one word) 1.5×, a narrow one 1.75×; dev pinned us-east and priced it at 1.5×,
    16.7% under the bill."""
    inp = _inputs(**{"endpoints.0.serverless.region": region})
    sls = inp.endpoints[0].serverless
    assert sls.price_multiplier == multiplier and sls.region_price_multiplier is None  # resolved, not pinned
    assert not [w for w in recwarn if "region_price_multiplier" in str(w.message)]
    # a copy in another region prices at that region's (nothing stale is kept from validation)
    other = "us" if "-" in region else "us-east"
    assert sls.model_copy(update={"region": other}).price_multiplier == (1.5 if other == "us" else 1.75)


def test_a_multiplier_other_than_modals_is_kept_with_a_notice():
    from topology.errors import InputNotice

    with pytest.warns(InputNotice, match=r"region_price_multiplier=1\.5 for region 'us-east': Modal lists 1\.75×"):
        inp = _inputs(**{"endpoints.0.serverless.region": "us-east",
                         "endpoints.0.serverless.region_price_multiplier": 1.5})
    assert inp.endpoints[0].serverless.price_multiplier == 1.5


def test_a_spec_saved_before_the_reservation_fields_still_reads(planned_stacks, tmp_path):
    """`topology diff` against a spec saved before the burst carried cpu_cores / memory_mib / usd_per_container_hour
    (e.g. `pulumi stack output spec` of the deployed stack): it reads as Modal's own default reservation, which is
    what that spec deployed."""
    import json

    from topology.loading import load_spec_or_inputs

    _, spec = planned_stacks["prod"]
    doc = json.loads(spec.to_json())
    for e in doc["endpoints"]:
        if e.get("burst"):
            for k in ("cpu_cores", "memory_mib", "usd_per_container_hour"):
                del e["burst"][k]
    f = tmp_path / "old-spec.json"
    f.write_text(json.dumps(doc))
    old = load_spec_or_inputs(f)
    b = old.endpoint("assist").burst
    assert (b.cpu_cores, b.memory_mib) == (0.125, 128)
