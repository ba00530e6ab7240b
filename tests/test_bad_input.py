"""Issue #13, class by class: each bad input ends in a one-line error naming the file or field (exit 2),
never a traceback, a hang or nonsense accepted. The fuzz suite (test_fuzz.py) covers the space; these
pin the message of each class."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import math
from pathlib import Path

import pytest
import yaml

from inputs_factory import INPUTS, inputs_dict, set_path
from topology import plan as plan_fn
from topology.cli import main, planning_hint
from topology.errors import InputError
from topology.inputs import CostInputs, prices_age_warning
from topology.loading import check_kubeconfig_config, inputs_from_document, load_inputs
from topology.plan import PlanningError
from topology.reading import MAX_YAML_NODES, read_document
from simulator.traffic import load_trace

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / "stacks" / "Pulumi.dev.yaml"
TODAY = dt.date(2026, 12, 2)


def run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, err.getvalue()


def load(d, today=TODAY):
    return inputs_from_document(d, "in.yaml", ROOT, today)


def refused(d, today=TODAY) -> str:
    with pytest.raises(InputError) as e:
        load(d, today)
    return str(e.value)


# ── tracebacks before ──────────────────────────────────────────────────────────────────────────


def test_a_non_utf8_file_names_the_byte_and_its_offset(tmp_path):
    f = tmp_path / "Pulumi.x.yaml"
    f.write_bytes(b"config:\n  a: \xe9t\xe9\n")
    rc, err = run("plan", str(f))
    assert rc == 2 and err == f"error: {f} is not UTF-8 text (byte 0xe9 at offset 13)\n"


@pytest.mark.parametrize("name, text", [
    ("deep.json", "[" * 1000 + "]" * 1000),
    ("deep.yaml", "a: " + "[" * 1000 + "]" * 1000),
    ("deep2.yaml", "".join("  " * i + f"k{i}:\n" for i in range(1000)) + "  " * 1000 + "x: 1\n"),
])
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path, name, text):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(InputError, match="nests deeper than 64 levels"):
        read_document(f)


def test_a_json_integer_of_5000_digits_is_refused_with_its_line(tmp_path):
    f = tmp_path / "in.json"
    f.write_text('{\n  "environment": ' + "7" * 5000 + "\n}")
    with pytest.raises(InputError, match=r'line 2 \("environment": 777.*an integer of 5,000 digits; at most 30'):
        read_document(f)


def test_a_rate_trace_with_nan_is_refused(tmp_path):
    rows = ["window_start_s,total_rate_rps"] + [f"{i * 600},2" for i in range(1008)]
    rows[5] = "2400,nan"
    (tmp_path / "rate.csv").write_text("\n".join(rows))
    d = set_path(INPUTS, "endpoints.0.traffic", {"rate_trace": {"path": "rate.csv", "scale_to_mean_requests_per_s": 3}})
    with pytest.raises(InputError, match=r"rate\.csv' line 6: .*total_rate_rps='nan': not a number"):
        inputs_from_document(d, "in.yaml", tmp_path, TODAY)


@pytest.mark.parametrize("row", ["600,nan", "nan,1", "600,inf"])
def test_a_servegen_trace_with_nan_or_inf_is_refused(tmp_path, row):
    rows = ["window_start_s,total_rate_rps"] + [f"{i * 600},2" for i in range(1008)]
    rows[2] = row
    (tmp_path / "t.csv").write_text("\n".join(rows))
    with pytest.raises(InputError, match="not a number|whole minutes"):
        load_trace(tmp_path / "t.csv")


@pytest.mark.parametrize("line", ['{"timestamp": NaN, "input_length": 5, "output_length": 5}',
                                  '{"timestamp": 3000, "input_length": Infinity, "output_length": 5}'])
def test_a_request_trace_with_nan_timestamps_or_tokens_is_refused(tmp_path, line):
    rows = [json.dumps({"timestamp": i * 1000, "input_length": 10, "output_length": 5}) for i in range(5)] + [line]
    (tmp_path / "t.jsonl").write_text("\n".join(rows))
    with pytest.raises(InputError, match="not a number"):
        load_trace(tmp_path / "t.jsonl")


def test_simulate_refuses_a_negative_seed_and_an_unwritable_plot_before_planning(tmp_path):
    rc, err = run("simulate", str(DEV), "--seed", "-1")
    assert rc == 2 and err == "error: --seed -1: must be ≥ 0 (numpy seeds are non-negative integers)\n"
    rc, err = run("simulate", str(DEV), "--plot", str(tmp_path / "missing" / "week.png"))
    assert rc == 2 and "folder" in err and "does not exist" in err
    rc, err = run("simulate", str(DEV), "--plot", "/proc/week.png")
    assert rc == 2 and "--plot '/proc/week.png': not writable" in err


def test_render_refuses_bad_stack_files_and_outputs_with_one_line(tmp_path):
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(INPUTS))
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "broken.yaml").write_text("config:\n  a: [1,\n")
    (tmp_path / "afile").write_text("x")
    cases = [
        ((str(tmp_path / "plain.yaml"), "o"), "it looks like a plain inputs file"),
        ((str(tmp_path / "empty.yaml"), "o"), "the file is empty"),
        ((str(tmp_path / "missing.yaml"), "o"), "cannot read (no such file)"),
        ((str(tmp_path), "o"), "cannot read (a directory, not a file)"),
        ((str(tmp_path / "broken.yaml"), "o"), "not valid YAML (syntax error at line 3, column 1)"),
        ((str(DEV), str(tmp_path / "afile")), "is a file, not a folder"),
        ((str(DEV), ""), "--out '': name an output folder"),
    ]
    for (stack, out), expect in cases:
        rc, err = run("render", stack, "--out", out)
        assert rc == 2 and expect in err and err.count("\n") == 1, (expect, err)


def test_render_out_empty_never_touches_the_users_k8s_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "mine.yaml").write_text("keep me")
    for out in ("", "."):
        rc, err = run("render", str(DEV), "--out", out)
        assert rc == 2, err
    assert (tmp_path / "k8s" / "mine.yaml").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["k8s", "mine.yaml"]


def _program_config(**changes):
    config = dict(yaml.safe_load(DEV.read_text())["config"])
    for k, v in changes.items():
        if v is None:
            config.pop(k)
        else:
            config[k] = v
    return config


@pytest.mark.parametrize("changes, expect", [
    ({"llm-serving:inputs": None}, "missing llm-serving:inputs, the cost inputs mapping"),
    ({"llm-serving:inputs": "just text"}, "value 'just text' is not a valid 'JSON object'"),
    # it added "inputs and cluster are mappings" whatever the key was (found by this stop's fuzz)
    ({"llm-serving:gateway": "hello"}, "'llm-serving:gateway' value 'hello' is not a valid 'JSON object'; "
                                       "llm-serving:gateway must be a mapping"),
    ({"llm-serving:kubeconfig": 123}, "llm-serving:kubeconfig is stored in plain text"),
    ({"llm-serving:modalTokenId": "ak-1", "llm-serving:modalTokenSecret": "as-1"},
     "modalTokenId is stored in plain text; a Modal token must be a secret"),
])
def test_the_pulumi_program_ends_bad_config_with_a_run_error(changes, expect):
    import pulumi

    from offline.mockrun import run_program

    with pytest.raises(pulumi.RunError) as e:  # Pulumi prints a RunError's message alone, no traceback
        run_program("dev", _program_config(**changes))
    assert expect in str(e.value)


def test_a_kubeconfig_must_be_secret_and_a_kubeconfig():
    with pytest.raises(InputError, match="not a kubeconfig"):
        check_kubeconfig_config("123", "p:kubeconfig", True)
    with pytest.raises(InputError, match="stored in plain text"):
        check_kubeconfig_config("apiVersion: v1\nclusters: []\n", "p:kubeconfig", False)
    check_kubeconfig_config("apiVersion: v1\nclusters: []\n", "p:kubeconfig", True)
    check_kubeconfig_config('{"secure": "v1:abc"}', "p:kubeconfig", False)  # encrypted, unreadable offline


# ── hangs before ───────────────────────────────────────────────────────────────────────────────


def test_a_yaml_alias_bomb_is_refused_from_its_small_graph(tmp_path):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\nconfig: {llm-serving:inputs: *a9}\n")
    with pytest.raises(InputError, match=f"expands to more than {MAX_YAML_NODES:,} values through YAML aliases"):
        read_document(f)


@pytest.mark.timeout(20)  # before the fix this looped, 3 GB a minute: fail on time, long before memory runs out
@pytest.mark.parametrize("text", ["&a [*a]\n", "config: &c {llm-serving:inputs: {endpoints: [*c]}}\n",
                                  "a: &a {b: [1, {c: *a}]}\n"])
def test_a_recursive_yaml_alias_is_refused_at_once(tmp_path, text):
    """An alias inside its own anchor composes into a cycle (PyYAML builds recursive objects): infinitely many
    values. The alias-bomb count walked it forever, its stack growing by the cycle each turn — every command hung
    on this 8-byte file and took the machine's memory (3 GB a minute; found by FUZZ_SCALE=10). Refused naming
    the line."""
    f = tmp_path / "loop.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match=r"line \d+, column \d+: a YAML alias refers to a node that contains it"):
        read_document(f)


def test_a_shared_alias_is_not_mistaken_for_a_recursive_one(tmp_path):
    f = tmp_path / "shared.yaml"
    f.write_text("base: &b {x: [1, 2]}\nuses: [*b, {y: *b}, [*b, *b]]\n")
    assert read_document(f)["uses"][1]["y"] == {"x": [1, 2]}


def test_a_profile_beyond_every_cap_is_refused_without_sizing_millions_of_replicas(monkeypatch):
    import sys

    plan_module = sys.modules["topology.plan.options"]

    def no_sizing(*a, **k):  # the O(replicas x 168) step the pre-check must avoid at this rate
        raise AssertionError("node_groups ran for a peak no cap allows")

    monkeypatch.setattr(plan_module, "node_groups", no_sizing)
    huge = set_path(INPUTS, "endpoints.0.traffic.hourly_mean_requests_per_s", [1_000_000.0] * 168)
    assert plan_fn(load(huge)).endpoints[0].tier == "managed_api"  # the API has no cap
    no_api = set_path(huge, "endpoints.0.managed_api", None)
    with pytest.raises(PlanningError, match=r"needs .* dedicated replicas .* > max_dedicated_replicas=60"):
        plan_fn(load(no_api))


# ── nonsense accepted before ───────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("path, value, expect", [
    ("endpoints.0.traffic.timezone", "Mars/Olympus", "'Mars/Olympus' is not an IANA timezone"),
    ("endpoints.0.traffic.timezone", "", "is not an IANA timezone"),
    ("endpoints.0.traffic.timezone", "Europe/Berlin\0", "is not an IANA timezone"),
    ("endpoints.0.traffic.timezone", "America/New_Yrok", "did you mean 'America/New_York'"),
    ("endpoints.0.model.revision", "Rev/../x y", "is not a Kubernetes label value"),
    ("cluster_region", "US_EAST 1", "is not an AWS region name"),
    ("regions.0.name", "us-east-1\n", "is not an AWS region name"),
    ("weights_source_bucket", "Acme_Models", "is not an S3 bucket name"),
    ("weights_source_bucket", "192.168.1.1", "is not an S3 bucket name"),
    ("endpoints.0.model.name", "llama\0", "is not a model name"),
    ("endpoints.0.model.name", "llama\nx", "is not a model name"),
    ("endpoints.0.model.name", "../etc", "is not a model name"),
    ("endpoints.0.model.name", "m" * 300, "is not a model name"),
    ("endpoints.0.serverless.region", "", "is not a Modal region"),
])
def test_names_that_reach_kubernetes_s3_and_aws_are_checked_at_input_time(path, value, expect):
    msg = refused(set_path(INPUTS, path, value))
    assert path in msg and expect in msg, msg


def test_prices_in_the_future_are_refused_old_ones_warned_numbers_never_dates():
    for future in ("9999-12-31", "2099-01-01", "2026-12-03"):
        msg = refused(set_path(INPUTS, "prices.prices_as_of", future))
        assert f"prices.prices_as_of = '{future}': {future} is in the future (today is 2026-12-02)" in msg, msg
    msg = refused(set_path(INPUTS, "prices.prices_as_of", 1_700_000_000))
    assert "1700000000 is a number, not a date" in msg
    old = load(set_path(INPUTS, "prices.prices_as_of", "0001-01-01"))
    w = prices_age_warning(old.prices.prices_as_of, TODAY)
    assert w is not None and "739," in w and "prices have likely rotted" in w
    assert prices_age_warning(dt.date(2026, 10, 4), TODAY) is None


def test_plan_warns_about_rotted_prices_on_stderr(tmp_path):
    doc = yaml.safe_load(DEV.read_text())
    doc["config"]["llm-serving:inputs"]["prices"]["prices_as_of"] = "2020-01-01"
    f = tmp_path / "Pulumi.old.yaml"
    f.write_text(yaml.safe_dump(doc))
    rc, err = run("plan", str(f))
    assert rc == 0 and err.startswith("warning: prices.prices_as_of=2020-01-01 is ")


def test_a_mig_profile_listed_twice_is_refused():
    mig = [{"profile": "3g.40gb", "decode_tokens_per_s": 400, "prefill_tokens_per_s": 9000, "max_concurrent_sequences": 16},
           {"profile": "3g.40gb", "decode_tokens_per_s": 900, "prefill_tokens_per_s": 9000, "max_concurrent_sequences": 16}]
    msg = refused(set_path(INPUTS, "endpoints.0.engine.0.mig", mig))
    assert "endpoints.0.engine.0.mig" in msg and "MIG profile '3g.40gb' is listed twice (entries 0 and 1)" in msg


def test_diff_validates_a_saved_spec_as_strictly_as_inputs(tmp_path):
    spec = json.loads(plan_fn(load_inputs(DEV)).to_json())
    cases = {
        "neg": (lambda s: s["endpoints"][0]["floor"].__setitem__("base_replicas", -2),
                "endpoints.0.floor.base_replicas = -2: negative"),
        "nan": (lambda s: s["endpoints"][0]["capacity"].__setitem__("saturated_requests_per_s", math.nan),
                "endpoints.0.capacity.saturated_requests_per_s: not a number"),
        "dup": (lambda s: s["endpoints"].append(s["endpoints"][0]), "endpoints: 'assist' appears more than once"),
        "ver": (lambda s: s.__setitem__("spec_version", "7"), "spec_version = '7': unknown; this version reads '1'"),
    }
    for name, (mutate, expect) in cases.items():
        s = json.loads(json.dumps(spec))
        mutate(s)
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(s))
        rc, err = run("diff", str(DEV), str(f))
        assert rc == 2 and expect in err and str(f) in err, err


def test_render_validation_catches_label_syntax_the_schemas_do_not():
    from offline.names_check import check_manifest

    obj = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "Gate_Way", "namespace": "llm-serving", "labels": {"release": "Bad Value!"}},
           "spec": {"selector": {"app": "x y"}}}
    errors = check_manifest(obj)
    assert any("metadata.name" in e and "DNS-1123 label" in e for e in errors)
    assert any("metadata.labels.release" in e and "'Bad Value!' is not a Kubernetes label value" in e for e in errors)
    assert any("spec.selector.app" in e for e in errors)


def test_monitor_labels_are_checked_as_stack_settings():
    from components.stack_settings import stack_settings

    with pytest.raises(InputError, match="monitorLabels.*'Bad Value!' is not a Kubernetes label value"):
        stack_settings({"cluster": {"mode": "create", "name": "c", "subnetIds": ["subnet-0a", "subnet-0b"]},
                        "monitorLabels": {"release": "Bad Value!"}}, "stack x config")
    # the installed kube-prometheus-stack's own monitors carry release: kube-prometheus-stack: other labels would
    # stop it scraping kube-state-metrics (the floor-not-serving alert's input)
    with pytest.raises(InputError, match=r"monitorLabels \{'team': 'ml'\} with monitoring: install.*kube-state-metrics"
                                         r".*allowed: \{'release': 'kube-prometheus-stack'\}"):
        stack_settings({"cluster": {"mode": "create", "name": "c", "subnetIds": ["subnet-0a", "subnet-0b"]},
                        "monitorLabels": {"team": "ml"}}, "stack x config")
    # a platform Prometheus selects by whatever labels it is set up with
    s = stack_settings({"cluster": {"mode": "create", "name": "c", "subnetIds": ["subnet-0a", "subnet-0b"]}, "monitoring": "platform",
                        "monitorLabels": {"team": "ml"}}, "stack x config")
    assert s.monitor_labels == {"team": "ml"}


# ── messages ───────────────────────────────────────────────────────────────────────────────────


def test_nan_and_inf_are_reported_as_not_a_number_not_as_a_bound():
    for v in (math.nan, math.inf):
        msg = refused(set_path(INPUTS, "endpoints.0.traffic.within_hour_peak_factor", v))
        assert "endpoints.0.traffic.within_hour_peak_factor" in msg and "not a number" in msg
        assert "less than or equal" not in msg


def test_unknown_fields_list_the_allowed_names_closest_first():
    msg = refused(set_path(INPUTS, "endpoints.0.slo.ttft_p95_ms", 5))
    assert "endpoints.0.slo.ttft_p95_ms = 5: unknown field; did you mean 'ttft_p99_ms'? allowed: ttft_p99_ms, inter_token_p99_ms" in msg


def test_cross_field_errors_name_the_fields_not_the_whole_document():
    msg = refused(set_path(INPUTS, "cluster_region", "eu-west-1"))
    assert msg == "in.yaml: cluster_region, regions: cluster_region='eu-west-1' is not among regions ['us-east-1']"
    msg = refused(set_path(INPUTS, "endpoints.0.shape.input_tokens_p99", 100))
    assert msg.startswith("in.yaml: endpoints.0.shape.input_tokens_p99, endpoints.0.shape.input_tokens_mean: ")
    assert "(top level)" not in msg and "{" not in msg


def test_planning_errors_name_the_input_fields_to_change(tmp_path):
    d = set_path(INPUTS, "endpoints.0.model.weights_gb", 400)
    f = tmp_path / "in.yaml"
    f.write_text(yaml.safe_dump(d))
    rc, err = run("plan", str(f))
    assert rc == 2 and err.startswith(f"error: {f}: endpoint chat: no GPU or MIG slice")
    assert "[input fields to change: endpoints.0.model.weights_gb, endpoints.0.model.precision" in err
    inputs = CostInputs.model_validate(INPUTS)
    assert planning_hint("endpoint chat: no option is feasible — dedicated_only: environment dev allows no floor "
                         "replicas; serverless_only: peak needs 90 containers > serverless.max_containers_cap 60",
                         inputs) == " [input fields to change: endpoints.0.serverless.max_containers_cap, floor_replicas_allowed]"


def test_plan_and_render_accept_the_same_value_wrapped_document(tmp_path):
    doc = yaml.safe_load(DEV.read_text())
    doc["config"]["llm-serving:inputs"] = {"value": doc["config"]["llm-serving:inputs"]}
    # and a setting written so (the cluster's said 'cluster.mode: required' first; found by this stop's fuzz)
    doc["config"]["llm-serving:cluster"] = {"value": doc["config"]["llm-serving:cluster"]}
    f = tmp_path / "Pulumi.dev.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert run("plan", str(f))[0] == 0
    from offline.mockrun import run_program

    rec = run_program("dev", doc["config"])  # the program (render) reads the same document
    assert rec.outputs["specSha256"] == plan_fn(load_inputs(DEV)).sha256()


@pytest.mark.parametrize("peak, max_rep, cap", [(3, 16, 60), (40, 4, 5), (400, 60, 0), (2000, 2, 500), (120, 0, 60)])
def test_the_cap_pre_check_never_changes_a_plan(monkeypatch, peak, max_rep, cap):
    import sys

    from inputs_factory import office_profile

    plan_module = sys.modules["topology.plan.options"]
    d = set_path(INPUTS, "endpoints.0.traffic.hourly_mean_requests_per_s", office_profile(peak, peak / 20, peak / 3))
    d = set_path(d, "endpoints.0.max_dedicated_replicas", max_rep)
    d = set_path(d, "endpoints.0.serverless.max_containers_cap", cap)

    def outcome():
        try:
            return plan_fn(load(d)).to_json()
        except PlanningError as e:
            return str(e)

    with_check = outcome()
    monkeypatch.setattr(plan_module, "dedicated_cap_shortfall", lambda *a, **k: None)
    assert outcome() == with_check  # same spec, same reasons: the pre-check only skips work


def test_plan_simulate_refuses_a_negative_seed():
    rc, err = run("plan", str(DEV), "--simulate", "--seed", "-3")
    assert rc == 2 and err == "error: --seed -3: must be ≥ 0 (numpy seeds are non-negative integers)\n"


def test_render_names_the_input_fields_of_an_impossible_plan():
    from offline.mockrun import run_program

    config = _program_config()
    config["llm-serving:inputs"]["endpoints"][0]["model"]["weights_gb"] = 4000
    import pulumi

    with pytest.raises(pulumi.RunError, match=r"no GPU or MIG slice .*\[input fields to change: endpoints\.0\.model\.weights_gb"):
        run_program("dev", config)


def test_a_rollout_candidate_revision_is_checked_like_the_incumbents():
    from pydantic import ValidationError

    from topology.rollout import CandidateVersion

    with pytest.raises(ValidationError, match="is not a Kubernetes label value"):
        CandidateVersion(version="assist-2026-12", weights_revision="a" * 64)
    with pytest.raises(ValidationError, match=r"'\.\.'"):
        CandidateVersion(version="assist-2026-12", weights_revision="rev..x")


def _stack_copy(tmp_path: Path, text: str) -> Path:
    """stacks/Pulumi.dev.yaml under tmp_path holding `text`, beside copies of the traces and evals it names."""
    import shutil

    stack = tmp_path / "stacks" / "Pulumi.dev.yaml"
    stack.parent.mkdir()
    stack.write_text(text)
    for f in ("traces", "evals"):
        if (ROOT / f).exists():
            shutil.copytree(ROOT / f, tmp_path / f)
    return stack


def test_a_mistyped_project_setting_is_refused_not_ignored(tmp_path):
    """Pulumi accepts any config key, so `llm-serving:monitorin: platform` (or `llm-serving:Inputs` beside the
    real one) was ignored and the setting's default deployed. plan, render and the program under Pulumi refuse an
    unknown `llm-serving:` key, naming the closest setting; other projects' keys (aws:region) are the providers'."""
    from offline.mockrun import read_stack_config, run_program
    from topology.loading import load_inputs

    stack_file = ROOT / "stacks" / "Pulumi.dev.yaml"
    text = stack_file.read_text()
    assert "  llm-serving:monitoring: install" in text
    typo = _stack_copy(tmp_path, text.replace("  llm-serving:monitoring: install", "  llm-serving:monitorin: install"))
    with pytest.raises(InputError, match=r"config llm-serving:monitorin \(did you mean llm-serving:monitoring\?\): "
                                         r"not a setting of this project"):
        load_inputs(typo)
    stack, config = read_stack_config(stack_file)
    with pytest.raises(InputError, match=r"llm-serving:Inputs \(did you mean llm-serving:inputs\?\)"):
        run_program(stack, {**config, "llm-serving:Inputs": {"a": 1}})
    load_inputs(stack_file)  # the bundled stack's own keys, aws:region among them, pass


@pytest.mark.parametrize("region", ["abc", "2026-02-30", "US-EAST-1", "us-east"])
def test_an_aws_region_that_is_not_one_is_refused_before_anything_is_declared(region):
    """The AWS provider refuses a bad region only when `up` configures it: a render or a preview under mocks
    accepted `aws:region: abc` (found by fuzzing the stack files)."""
    from offline.mockrun import read_stack_config, run_program

    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")
    with pytest.raises(InputError, match=rf"aws:region='{region}': not an AWS region name"):
        run_program(stack, {**config, "aws:region": region})


def test_a_simulation_of_billions_of_requests_is_refused_before_it_starts(tmp_path, capsys):
    """A profile at the validator's 10^6 req/s every hour (found by fuzzing the stack files) made `simulate
    --hours 0:1` replay 3.6 billion requests, silent for minutes; the CLI promises its checks come before any
    long work. The request count the window would replay is checked first, naming the endpoint and the input;
    the bundled prod week (49 M requests) stays well under the limit."""
    import yaml

    from simulator.cli import MAX_SIMULATED_REQUESTS, expected_requests
    from topology.cli import main as cli
    from topology.loading import load_inputs

    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    ep = doc["config"]["llm-serving:inputs"]["endpoints"][1]
    ep["traffic"]["hourly_mean_requests_per_s"] = [1e6] * 168
    ep["traffic"].pop("rate_trace", None)
    stack = _stack_copy(tmp_path, yaml.safe_dump(doc, sort_keys=False))
    assert cli(["simulate", str(stack), "--hours", "0:1", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "would replay about 3,6" in err and f"endpoint {ep['name']!r} 3,600,000,000" in err
    assert "traffic.hourly_mean_requests_per_s" in err
    prod = load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml")
    assert 40e6 < sum(expected_requests(prod, None, 0, 168).values()) < MAX_SIMULATED_REQUESTS / 10


def test_a_stack_its_replication_owner_does_not_serve_is_refused(tmp_path):
    """dev names prod as the owner of the source bucket's replication configuration; if prod's destinationStacks
    leave dev out (or the owner names no stack file), no stack declares a rule for dev's caches and new weight
    revisions never reach them, while every `up` passes (found by fuzzing the stack files)."""
    from offline.mockrun import read_stack_config, run_program

    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")
    assert config["llm-serving:weightReplication"]["ownerStack"] == "prod"
    run_program(stack, config)  # as bundled: prod lists dev
    with pytest.raises(InputError, match=r"ownerStack names 'qa', but .*Pulumi\.qa\.yaml does not exist"):
        run_program(stack, {**config, "llm-serving:weightReplication": {"ownerStack": "qa"}})
    # the owner's file without dev among its destinations
    import components.stack_settings as ss

    real = ss.check_replication_owner

    def with_owner_file(settings, name, root):
        fake = tmp_path / "stacks"
        fake.mkdir(exist_ok=True)
        text = (ROOT / "stacks" / "Pulumi.prod.yaml").read_text()
        assert "destinationStacks: [dev, prod]" in text
        (fake / "Pulumi.prod.yaml").write_text(text.replace("destinationStacks: [dev, prod]", "destinationStacks: [prod]"))
        return real(settings, name, tmp_path)

    ss_check = ss.check_replication_owner  # the program imports it by name when it runs
    ss.check_replication_owner = with_owner_file
    try:
        with pytest.raises(InputError, match=r"whose destinationStacks \(\['prod'\] .*\) do not list 'dev'"):
            run_program(stack, config)
    finally:
        ss.check_replication_owner = ss_check


@pytest.mark.parametrize("path, value, bound", [
    ("endpoints.0.weight_path.shared_path_gb_per_s", 1e-300, "greater than or equal to 0.001"),
    ("endpoints.0.engine.0.decode_tokens_per_s", 1e-6, "greater than or equal to 1"),
    ("endpoints.0.shape.output_tokens_mean", 0.5, "greater than or equal to 1"),
    ("endpoints.0.model.kv_cache_mib_per_token", 1e-9, "greater than or equal to 0.0001"),
])
def test_physically_impossible_tiny_figures_are_refused(path, value, bound):
    """Fields bounded only by > 0 let 1e-300 GB/s through (found by fuzzing): the plan then printed a weight load of
    3e300 s as a 300-digit integer. Each now has a floor no real deployment goes under, named in the error."""
    msg = refused(set_path(INPUTS, path, value))
    assert path in msg and bound in msg, msg


@pytest.mark.timeout(30)  # a FIFO hung every command that loads the stack
@pytest.mark.parametrize("kind,expect", [
    ("fifo", "cannot read (not a regular file)"),
    ("bomb", "through YAML aliases (an alias bomb?)"),
    ("deep", "nests deeper than 64 levels"),
    ("digits", "an integer of 500,000 digits"),
    ("directory", "cannot read (a directory, not a file)"),
])
def test_an_evaluation_record_file_is_read_by_the_bounded_reader(tmp_path, kind, expect):
    """rollout.eval_records_path was read with open() and yaml.safe_load: a FIFO hung plan, render and simulate,
    an alias bomb took 2 GB, deep nesting and a 500,000-digit integer ended in a traceback (found by this stop's
    fuzz of 1,693 inputs). Now the reader every other file goes through: one line naming the stack file and field."""
    import os

    target = tmp_path / {"fifo": "records", "bomb": "r.yaml", "deep": "r.json", "digits": "r.yaml",
                         "directory": "folder"}[kind]
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "bomb":
        lines = ["a0: &a0 [" + ",".join(["x"] * 10) + "]"]
        lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
        target.write_text("\n".join(lines) + "\nrecords: []\n")
    elif kind == "deep":
        target.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "digits":
        target.write_text("records: [" + "9" * 500_000 + "]\n")
    else:
        target.mkdir()
    stack = ROOT / "stacks" / "Pulumi.prod.yaml"
    text = stack.read_text()
    assert "eval_records_path: evals/prod.yaml" in text
    copy = tmp_path / "Pulumi.prod.yaml"
    copy.write_text(text.replace("eval_records_path: evals/prod.yaml", f"eval_records_path: {target}"))
    with pytest.raises(InputError) as e:
        load_inputs(copy)
    msg = str(e.value)
    assert expect in msg and "endpoints.0.rollout.eval_records_path" in msg and str(copy) in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize("path,value", [
    ("endpoints.0.engine.0.decode_tokens_per_s", True),
    ("endpoints.0.engine.0.gpus_per_replica", True),
    ("endpoints.0.model.weights_gb", True),
    ("endpoints.0.traffic.within_hour_peak_factor", False),
    ("endpoints.0.traffic.hourly_mean_requests_per_s", [True] + [1.0] * 167),
    ("prices.dedicated_on_demand_usd_per_gpu_hour", {"H100-80GB": True}),
])
def test_a_boolean_is_not_taken_for_a_number(path, value):
    """pydantic's lax mode read true as 1: `decode_tokens_per_s: true` became 1 token/s and the plan then said no
    batch keeps the inter-token gap under the SLO (blaming the SLO); `gpus_per_replica: yes` became one GPU and
    'weights exceed 80 GB'. Found by this stop's fuzz."""
    msg = refused(set_path(INPUTS, path, value))
    assert path in msg and "boolean" in msg and "not a number" in msg, msg


@pytest.mark.parametrize("text,line,key", [
    ("config:\n  llm-serving:namespace: a\n  llm-serving:namespace: b\n", 3, "llm-serving:namespace"),
    ("inputs: {environment: dev, environment: prod}\n", 1, "environment"),
])
def test_a_key_given_twice_in_one_mapping_is_refused(tmp_path, text, line, key):
    """YAML keeps the last of two equal keys without a word: a stack with `environment: dev` then
    `environment: prod` planned prod's names (found by this stop's fuzz). Merge keys (<<) may still be overridden."""
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match=rf"line {line}: key '{key}' given twice in one mapping"):
        read_document(f)
    f.write_text("base: &b {x: 1}\nc: {<<: *b, x: 2}\n")
    assert read_document(f)["c"] == {"x": 2}
    # merges nested or anchored inline: PyYAML rewrites a merged mapping in place while constructing, which a check
    # made then took for a key given twice (found by this stop's review); checked on the composed graph instead
    for text in ("base: &base {a: 1, b: 2}\nx:\n  y: &d\n    <<: *base\n    b: 3\nz:\n  <<: *d\n",
                 "base: &base {a: 1, b: 2}\ntop:\n  <<: &mid\n    <<: *base\n    b: 3\n  c: 4\nother: *mid\n"):
        f.write_text(text)
        assert read_document(f) == yaml.safe_load(text)


def test_a_rollout_with_no_dedicated_replicas_names_the_fields_to_change():
    """The planner quotes the endpoint's name in this error ('assist'), and the hint's pattern took the quotes for
    part of the name: the error named no input field (found by this stop's fuzz, a trace scaled to 0.5 req/s)."""
    inputs = load(INPUTS)
    msg = "endpoint 'assist': rollout needs dedicated replicas (...); this endpoint's plan has none"
    name = inputs.endpoints[0].name
    hint = planning_hint(msg.replace("assist", name), inputs)
    assert hint == " [input fields to change: endpoints.0.rollout, endpoints.0.traffic, floor_replicas_allowed]"


def test_a_replica_larger_than_any_node_is_not_planned():
    """engine.gpus_per_replica 16 on H100s (8 to a node at most) planned 'H100-80GB×16, 1 replica(s)/node' on a
    p5.48xlarge and Modal containers of 16 GPUs: pods no node can schedule (found by this stop's fuzz)."""
    d = set_path(INPUTS, "endpoints.0.engine.0.gpus_per_replica", 16)
    with pytest.raises(PlanningError, match=r"gpus_per_replica=16 is more than the largest .* node holds .*8 GPUs"):
        plan_fn(load(d))


def test_an_output_p99_above_max_tokens_is_refused():
    """max_tokens caps every output (the gateway's check, and vLLM's --override-generation-config max_new_tokens):
    output_tokens_p99 1000 with max_tokens 256 was planned for outputs that never happen (found by this stop's
    fuzz)."""
    d = set_path(set_path(INPUTS, "endpoints.0.shape.max_tokens", 256), "endpoints.0.shape.output_tokens_p99", 1000)
    d = set_path(d, "endpoints.0.shape.output_tokens_mean", 200)
    msg = refused(d)
    assert "endpoints.0.shape.output_tokens_p99, endpoints.0.shape.max_tokens" in msg, msg
    assert "output_tokens_p99=1000 is above max_tokens=256" in msg


def test_a_promotion_dated_in_the_future_is_refused():
    """rollout.promoted_on 2027-01-01 was planned as 'N−1 warm until 2027-01-08 (warm now)' (found by this stop's
    fuzz); prices_as_of in the future was already refused."""
    from tests.test_rollout import rollout

    d = inputs_dict(rollout=rollout(stage="promoted", promoted_on="2027-01-01"))
    msg = refused(d)
    assert "endpoints.0.rollout.promoted_on" in msg and "2027-01-01 is in the future (today is 2026-12-02)" in msg, msg


@pytest.mark.parametrize("zone", ["localtime", "Factory"])
def test_a_timezone_that_names_no_place_is_refused(zone):
    """Debian's tz files include 'localtime' (a link to the planning machine's own zone), which passed (found by this
    stop's fuzz): the week's profile would shift with whichever machine plans it."""
    msg = refused(set_path(INPUTS, "endpoints.0.traffic.timezone", zone))
    assert "endpoints.0.traffic.timezone" in msg and "is not an IANA timezone" in msg, msg


def _settings_error(**cluster_or_top) -> str:
    from components.stack_settings import stack_settings

    body = {"cluster": {"mode": "create", "name": "c", "subnetIds": ["subnet-0a", "subnet-0b"]}}
    for k, v in cluster_or_top.items():
        if k.startswith("cluster_"):
            body["cluster"] = {**body["cluster"], k.removeprefix("cluster_"): v}
        else:
            body[k] = v
    with pytest.raises(InputError) as e:
        stack_settings(body, "s.yaml")
    return str(e.value)


@pytest.mark.parametrize("changes, expect", [
    # an internal error before (a ValueError deep in the Cluster Autoscaler's values) on a stack with GPU pools
    ({"cluster_kubernetesVersion": "1.36"}, "cluster.kubernetesVersion = '1.36': allowed 1.33, 1.34, 1.35"),
    ({"cluster_name": "has space"}, "is not an EKS cluster name"),
    ({"cluster_mode": "existing", "cluster_nodeRoleArn": "arn:aws:s3:::bucket"}, "is not an IAM role ARN"),
    ({"cluster_subnetIds": ["subnet-0a", "subnet-0a"]}, "lists a subnet twice"),
    ({"cluster_subnetIds": ["sg-0a", "subnet-0b"]}, "'sg-0a' is not a subnet ID"),
    ({"cluster_publicAccessCidrs": ["10.0.0.0/33"]}, "'10.0.0.0/33' is not a CIDR block"),
    ({"cluster_systemInstanceType": "banana"}, "'banana' is not an EC2 instance type"),
    ({"cluster_adminPrincipalArns": ["arn:aws:iam::111122223333:role/ci"] * 2}, "lists a principal twice"),
    ({"weightReplication": {"ownerStack": "a" * 10_000}}, "is not a stack name"),  # an OSError before
    ({"prometheusUrl": "http://a.b.svc:99999"}, "not an http(s) URL with a host and a port in 1-65535"),
    ({"prometheusUrl": "http://"}, "not an http(s) URL with a host"),
    ({"namespace": "kube-system"}, "a namespace of the cluster's own"),
    ({"qualityRecorderImage": "UPPER/img:1"}, "is not an image reference"),
    ({"qualityRecorderImage": "img@sha256:abc"}, "is not an image reference"),
    # settings of a cluster the stack creates were silently ignored on an existing one
    ({"cluster_mode": "existing", "cluster_nodeRoleArn": "arn:aws:iam::111122223333:role/n",
      "cluster_publicAccessCidrs": ["203.0.113.0/24"]}, "publicAccessCidrs apply to mode 'create' only"),
])
def test_stack_settings_a_real_up_would_fail_on_are_refused(changes, expect):
    """Found by this stop's fuzz of the stack settings (855 stack files through render and preflight): each was
    accepted by render and would have failed at `pulumi up` or in the cluster (EKS's name and version rules, an
    access entry given twice, a ScaledObject that can never query, an image the kubelet refuses, a system namespace
    adopted and then deleted by destroy)."""
    msg = _settings_error(**changes)
    assert expect in msg, msg


def test_a_replication_owner_must_agree_with_its_owner():
    """Two ways no stack, or two stacks, declare the source bucket's one replication configuration, both accepted
    before (found by this stop's fuzz): prod naming dev as owner while dev names prod (no stack declares it), and
    dev claiming ownership while prod owns it and lists dev (the two `up`s overwrite each other)."""
    from components.stack_settings import SETTINGS_KEYS, check_replication_owner, stack_settings
    from offline.mockrun import read_stack_config

    def settings_of(name: str) -> dict:  # as the program reads a stack's settings
        _, config = read_stack_config(ROOT / "stacks" / f"Pulumi.{name}.yaml")
        return {k: config.get(f"llm-serving:{k}") for k in SETTINGS_KEYS}

    for name, owner, expect in (("prod", "dev", "that stack's own ownerStack is 'prod'"),
                                ("dev", "dev", "'prod' owns the replication configuration too and lists 'dev'")):
        body = settings_of(name)
        body["weightReplication"] = {**body["weightReplication"], "ownerStack": owner}
        with pytest.raises(InputError, match=expect):
            check_replication_owner(stack_settings(body, "s.yaml"), name, ROOT)
    # as bundled, both agree
    for name in ("prod", "dev"):
        check_replication_owner(stack_settings(settings_of(name), "s.yaml"), name, ROOT)


@pytest.mark.parametrize("changes, expect", [
    ({"llm-serving:platformProvides": 5}, "llm-serving:platformProvides = 5: a list of API group names"),
    ({"llm-serving:platformProvides": [None]}, "a list of API group names"),
])
def test_render_refuses_a_platform_provides_that_is_no_list(tmp_path, changes, expect):
    """`platformProvides: 5` ended the render in a TypeError (exit 70); `[null]` became the group 'None'."""
    config = _program_config(**changes)
    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text(yaml.safe_dump({"config": config}))
    rc, err = run("render", str(stack), "--out", str(tmp_path / "out"))
    assert rc == 2 and expect in err, err


def test_render_takes_config_as_the_pulumi_cli_hands_it(tmp_path):
    """An unquoted planningDate (a YAML date) ended the render in a JSON TypeError (exit 70); a Modal token stored
    encrypted ({secure: ...}, as `pulumi config set --secret` writes it) was called plain text; a key YAML reads
    as a number ended render and preflight in an AttributeError (found by this stop's fuzz)."""
    text = DEV.read_text()
    dated = tmp_path / "a" / "Pulumi.dev.yaml"
    dated.parent.mkdir()
    assert "planningDate" not in text
    added = ("config:\n  llm-serving:planningDate: 2026-12-02\n"
             "  llm-serving:modalTokenId: {secure: AAABAAAA}\n  llm-serving:modalTokenSecret: {secure: AAACAA}\n")
    dated.write_text(text.replace("config:\n", added, 1))
    rc, err = run("render", str(dated), "--out", str(tmp_path / "o1"))
    assert rc == 0, err
    numbered = tmp_path / "b" / "Pulumi.dev.yaml"
    numbered.parent.mkdir()
    numbered.write_text(text.replace("config:\n", "config:\n  123: x\n", 1))
    for cmd in (["render", str(numbered), "--out", str(tmp_path / "o2")], ["plan", str(numbered)]):
        rc, err = run(*cmd)
        assert rc == 2 and "config key 123 is not '<project>:<name>'" in err, err


@pytest.mark.parametrize("changes, expect", [
    ({"namespace": "Bad NS"}, "'Bad NS' is not a DNS-1123 label: at most 63 of a-z, 0-9, '-'"),
    ({"s3GatewayEndpoint": {"existingId": "x"}}, "'x' is not a VPC endpoint ID (vpce- and hex digits"),
    ({"qualityRecorderImage": "img"}, "'img' is not an image reference with a tag or digest"),
])
def test_stack_setting_errors_say_what_is_allowed_in_words(changes, expect):
    """The settings' errors quoted pydantic's regular expressions (String should match pattern '^[a-z0-9]([-a-z0-9]
    *[a-z0-9])?$'), left at the last stop and found again by this stop's fuzz."""
    msg = _settings_error(**changes)
    assert expect in msg and "should match pattern" not in msg, msg
