"""Bad input: every error names the field, the value and what is allowed; impossible plans name the constraint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from inputs_factory import INPUTS, inputs_dict, set_path
from topology import CostInputs, PlanningError, plan
from topology import inputs as inputs_module
from topology.loading import InputError, inputs_from_document

ROOT = Path(__file__).resolve().parent.parent


def load(d):
    return inputs_from_document(d, "test.yaml", ROOT)


@pytest.mark.parametrize(
    "path, value, expect",
    [
        ("endpoints.0.slo.ttft_p99_ms", -5, "greater than 0"),
        ("endpoints.0.shape.input_tokens_mean", 0, "greater than or equal to 1"),
        ("endpoints.0.prefix_cache_hit_fraction", 1.2, "less than 1"),
        ("endpoints.0.headroom_fraction", 0.5, "less than or equal to 0.3"),
        ("endpoints.0.engine.0.gpu_kind", "H100-PCIe", "'H100-80GB'"),
        ("endpoints.0.model.precision", "fp4", "'bf16'"),
        ("prices.reserved_discount_fraction", 1.5, "less than 1"),
        ("prices.prices_as_of", "last week", "date"),
        ("endpoints.0.name", "Chat_Bot", "pattern"),
        ("endpoints.0.cold_starts.serverless_snapshot_restore_s", 0, "greater than 0"),
    ],
)
def test_invalid_field_names_field_value_and_allowed(path, value, expect):
    with pytest.raises(InputError) as e:
        load(set_path(INPUTS, path, value))
    msg = str(e.value)
    assert path in msg, msg
    assert repr(value) in msg, msg
    assert expect in msg, msg


def test_missing_price_date_is_an_error():
    d = inputs_dict()
    del d["prices"]["prices_as_of"]
    with pytest.raises(InputError, match=r"prices\.prices_as_of: required, and not given"):
        load(d)


def test_unknown_field_is_rejected_not_ignored():
    d = set_path(INPUTS, "endpoints.0.slo.ttft_p95_ms", 100)
    with pytest.raises(InputError, match=r"endpoints\.0\.slo\.ttft_p95_ms.*unknown field"):
        load(d)


def test_profile_must_have_168_hours_and_no_negatives():
    with pytest.raises(InputError, match="exactly 168 values"):
        load(set_path(INPUTS, "endpoints.0.traffic.hourly_mean_requests_per_s", [1.0] * 24))
    bad = [1.0] * 168
    bad[30] = -2
    with pytest.raises(InputError, match="hour 30 has -2"):
        load(set_path(INPUTS, "endpoints.0.traffic.hourly_mean_requests_per_s", bad))


def test_cross_field_rules_name_both_fields():
    with pytest.raises(InputError, match="input_tokens_p99=100 is below input_tokens_mean=2000"):
        load(set_path(INPUTS, "endpoints.0.shape.input_tokens_p99", 100))
    with pytest.raises(InputError, match="product_max_context_tokens=200000 exceeds model.architecture_max_context_tokens=131072"):
        load(set_path(INPUTS, "endpoints.0.shape.product_max_context_tokens", 200000))
    with pytest.raises(InputError, match="serverless.gpu_kind=A100-80GB has no measured engine capacity"):
        load(set_path(INPUTS, "endpoints.0.serverless.gpu_kind", "A100-80GB"))


def test_model_larger_than_every_gpu_and_slice_names_the_constraint():
    d = set_path(INPUTS, "endpoints.0.model.weights_gb", 400)
    with pytest.raises(PlanningError) as e:
        plan(load(d))
    msg = str(e.value)
    assert "no GPU or MIG slice can serve it" in msg and "weights 400 GB" in msg and "exceed" in msg


def test_ttft_slo_below_prefill_of_the_p99_prompt_names_the_constraint():
    d = set_path(INPUTS, "endpoints.0.slo.ttft_p99_ms", 100)  # 8,000 × 0.7 / 30,000 tok/s ≈ 187 ms of prefill
    with pytest.raises(PlanningError, match=r"ttft_p99_ms=100 is below the p99 prompt's prefill time.*187 ms"):
        plan(load(d))


def test_inter_token_slo_below_the_decode_step_names_the_constraint():
    d = set_path(INPUTS, "endpoints.0.slo.inter_token_p99_ms", 5)  # 70 GB over 6.7 TB/s ≈ 10.4 ms per step
    with pytest.raises(PlanningError, match=r"inter_token_p99_ms=5 is below the decode step floor 10\.4 ms"):
        plan(load(d))


def test_unknown_mig_profile_in_measurements_names_the_gpu_and_profiles():
    d = set_path(INPUTS, "endpoints.0.engine.0.gpus_per_replica", 1)
    d = set_path(d, "endpoints.0.engine.0.mig", [{"profile": "3g.45gb", "decode_tokens_per_s": 1, "prefill_tokens_per_s": 1,
                                                   "max_concurrent_sequences": 1}])
    with pytest.raises(PlanningError, match=r"'3g\.45gb' does not exist on H100-80GB.*3g\.40gb"):
        plan(load(d))


def test_every_input_field_has_a_description_and_units_in_numeric_names():
    unitless_ok = {"count", "rank", "tenants", "replicas"}
    for name in dir(inputs_module):
        obj = getattr(inputs_module, name)
        if not (isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == inputs_module.__name__):
            continue
        for fname, f in obj.model_fields.items():
            assert f.description, f"{obj.__name__}.{fname} has no description"
            if f.annotation in (float, int) and fname not in unitless_ok:
                units = ("_s", "_ms", "_gb", "_mb", "_tokens", "_per_s", "_fraction", "_factor", "_usd", "_billion",
                         "_replicas", "_cap", "_sequences", "_multiplier", "_percent", "_per_token", "_set", "_month",
                         "_hour", "_minutes", "_second", "gpus_", "_tokens_mean", "_tokens_p99")
                assert any(u in fname for u in units), f"{obj.__name__}.{fname} has no unit in its name"


def write(tmp_path, doc, name="inputs.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "topology", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_cli_reports_bad_input_without_a_traceback(tmp_path):
    p = write(tmp_path, set_path(INPUTS, "endpoints.0.slo.ttft_p99_ms", -1))
    r = run_cli("plan", str(p))
    assert r.returncode == 2
    assert "endpoints.0.slo.ttft_p99_ms = -1" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_reports_impossible_plan_and_unreadable_files_without_a_traceback(tmp_path):
    p = write(tmp_path, set_path(INPUTS, "endpoints.0.model.weights_gb", 400))
    r = run_cli("plan", str(p))
    assert r.returncode == 2 and "no GPU or MIG slice" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("plan", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "broken.yaml"
    bad.write_text("config: [unclosed\n")
    r = run_cli("plan", str(bad))
    assert r.returncode == 2 and "not valid YAML" in r.stderr and "Traceback" not in r.stderr


def test_rate_trace_resolves_into_a_profile_scaled_to_the_mean():
    d = inputs_dict()
    d["endpoints"][0]["traffic"] = {
        "timezone": "UTC",
        "rate_trace": {"path": "traces/servegen_m-small_14d_rate.csv", "scale_to_mean_requests_per_s": 5.0},
    }
    inputs = inputs_from_document(d, "t.yaml", ROOT)
    prof = inputs.endpoints[0].traffic.hourly_mean_requests_per_s
    assert prof is not None and len(prof) == 168
    assert sum(prof) / 168 == pytest.approx(5.0, rel=1e-4)
    assert max(prof) / min(prof) > 3  # the weekly rhythm survives scaling


def test_rate_trace_that_is_shorter_than_a_week_is_rejected(tmp_path):
    short = tmp_path / "short.csv"
    short.write_text("window_start_s,total_rate_rps\n0,1\n600,2\n")
    d = inputs_dict()
    d["endpoints"][0]["traffic"] = {"rate_trace": {"path": str(short), "scale_to_mean_requests_per_s": 1.0}}
    with pytest.raises(InputError, match="covers 1 of 168 hours"):
        inputs_from_document(d, "t.yaml", ROOT)


def test_plan_refuses_an_unresolved_rate_trace():
    d = inputs_dict()
    d["endpoints"][0]["traffic"] = {"rate_trace": {"path": "x.csv", "scale_to_mean_requests_per_s": 1.0}}
    with pytest.raises(PlanningError, match="must be resolved"):
        plan(CostInputs.model_validate(d))
