"""Property-based fuzzing of every command and every file the project reads (issue #13).

For generated bad input — garbage bytes, non-UTF-8, deep nesting, huge integers, YAML alias bombs,
NaN/inf, bad names, mutated fields of real stacks and specs, poisoned traces and manifests — every
command must answer with exit status 2 and a short message naming the file (and the field, where there
is one): never a traceback, never a write outside its output folder. Most cases call the CLI's `main()`
in-process (fast); a few run the real command in a subprocess with a timeout as the hang guard.

Bounded: each property has a fixed example budget and a fixed seed (`derandomize`), so the suite runs
the same cases in well under a minute on two cores. FUZZ_SCALE=10 runs ten times as many.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from topology.cli import main as topology_main

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT / "stacks" / "Pulumi.dev.yaml"
PROD = ROOT / "stacks" / "Pulumi.prod.yaml"
SCALE = int(os.environ.get("FUZZ_SCALE", "1"))


def budget(n: int):
    # no shrinking: a failure prints the generated case as is, and the suite stays bounded even then
    return settings(max_examples=n * SCALE, deadline=None, database=None, derandomize=True,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def run(argv: list[str], main=topology_main) -> tuple[int, str, str]:
    """Run a CLI main() in-process; argparse's own exits count as their status."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def errors_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]


def assert_clean_refusal(rc: int, err: str, *names: str) -> None:
    """Exit 2; no traceback; a short message whose every line names one of `names` (the file or option)."""
    assert "Traceback" not in err and "internal error" not in err, err
    assert rc == 2, (rc, err)
    lines = errors_of(err)
    assert 1 <= len(lines) <= 20, err
    for line in lines:
        assert any(n in line for n in names), (names, line)


@contextlib.contextmanager
def sandbox():
    """A fresh working directory; yields it. Used to check that nothing is written next to the inputs."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
        os.chdir(d)
        try:
            yield Path(d)
        finally:
            os.chdir(old)


def listing(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def dev_document() -> dict:
    return yaml.safe_load(DEV.read_text())


_SPEC_JSON: list[str] = []


def prod_spec_json() -> str:
    if not _SPEC_JSON:
        rc, out, err = run(["plan", str(PROD), "--json"])
        assert rc == 0, err
        _SPEC_JSON.append(out)
    return _SPEC_JSON[0]


# ── hostile file contents ──────────────────────────────────────────────────────────────────────


def _deep_json(n: int) -> bytes:
    return ("[" * n + "]" * n).encode()


def _deep_yaml(n: int) -> bytes:
    return ("config:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, n)) + "  " * n + "x: 1\n").encode()


def _flow_yaml(n: int) -> bytes:
    return ("a: " + "[" * n + "]" * n + "\n").encode()


def _alias_bomb(levels: int) -> bytes:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"config: {{llm-serving:inputs: *a{levels}}}")
    return ("\n".join(lines) + "\n").encode()


def _huge_int(digits: int) -> bytes:
    return f"config:\n  llm-serving:inputs:\n    environment: {'9' * digits}\n".encode()


hostile_bytes = st.one_of(
    st.binary(max_size=300),
    st.binary(min_size=1, max_size=40).map(lambda b: b"\xff\xfe" + b + b"config: {}\n"),
    st.builds(lambda a, b: a.encode() + b"\x80" + b.encode(), st.text(max_size=30), st.text(max_size=30)),
    st.integers(65, 3000).map(_deep_json),
    st.integers(65, 1500).map(_deep_yaml),
    st.integers(65, 3000).map(_flow_yaml),
    st.integers(5, 9).map(_alias_bomb),
    st.integers(31, 6000).map(_huge_int),
    st.sampled_from([b"", b"   \n\n", b"\xef\xbb\xbf", b"config: [unclosed\n", b"a: b: c\n", b"- 1\n- 2\n",
                     b"null\n", b"42\n", b'"just a string"\n', b"config: 12\n", b"config: {x: 2026-13-45}\n",
                     b"\x00\x00\x00", b"config:\n\tbad: tab\n", b"? [a]\n: b\n", b"&a [*a]\n",
                     b"config: {llm-serving:inputs: .nan}\n", b"config: {llm-serving:inputs: {value: 3}}\n"]),
)


@budget(60)
@given(data=hostile_bytes, suffix=st.sampled_from([".yaml", ".json", ".yml", ""]),
       command=st.sampled_from(["plan", "diff", "simulate", "render"]))
def test_every_command_refuses_a_hostile_file_cleanly(data, suffix, command):
    with sandbox() as d:
        f = d / f"Pulumi.fuzz{suffix}"
        f.write_bytes(data)
        argv = {"plan": ["plan", f.name], "diff": ["diff", f.name, str(DEV)],
                "simulate": ["simulate", f.name, "--hours", "0:1", "--no-progress"],
                "render": ["render", f.name, "--out", "out"]}[command]
        before = listing(d)
        rc, _out, err = run(argv)
        assert_clean_refusal(rc, err, f.name)
        assert listing(d) == before  # nothing written, not even the output folder


# ── mutated fields of a real stack ─────────────────────────────────────────────────────────────


def _leaf_paths(value, prefix=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaf_paths(v, prefix + (k,))
    elif isinstance(value, list) and value and not all(isinstance(x, (int, float)) for x in value):
        for i, v in enumerate(value):
            yield from _leaf_paths(v, prefix + (i,))
    else:
        yield prefix


_INPUTS = dev_document()["config"]["llm-serving:inputs"]
INPUT_PATHS = sorted(_leaf_paths(_INPUTS), key=str)
BAD_VALUES = [math.nan, math.inf, -math.inf, -1, 0, 10**40, "", "\0", "../x", "Bad Value!", "x" * 300,
              [], {}, None, True, "9999-01-01", 1_700_000_000, "nan", "Mars/Olympus", "US_EAST 1", {"value": 1}]


def _set(doc, path, value):
    d = doc
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


@budget(40)
@given(path=st.sampled_from(INPUT_PATHS), value=st.sampled_from(BAD_VALUES), command=st.sampled_from(["plan", "diff"]))
def test_a_bad_value_in_any_input_field_is_refused_naming_the_field(path, value, command):
    doc = dev_document()
    _set(doc["config"]["llm-serving:inputs"], path, value)
    with sandbox() as d:
        f = d / "Pulumi.fuzz.yaml"
        f.write_text(yaml.safe_dump(doc))
        argv = ["plan", f.name] if command == "plan" else ["diff", str(DEV), f.name]
        rc, _out, err = run(argv)
        assert "Traceback" not in err and "internal error" not in err, err
        assert rc in (0, 2), err
        if isinstance(value, float) and not math.isfinite(value):
            assert rc == 2
        if rc == 2:
            assert_clean_refusal(rc, err, f.name)
            # the message names the field, or the object/cross-field rule it belongs to
            names = {".".join(map(str, path[:k])) for k in range(1, len(path) + 1)}
            names.add(f"{path[-1]}: ")  # read errors quote the offending line, key in view
            assert any(n in err for n in names) or "endpoint " in err, (path, err)
            if isinstance(value, float) and not math.isfinite(value) and path[-1] != "prices_as_of":
                assert "not a number" in err or ".".join(map(str, path)) in err, err


# ── rate traces (inputs) and --trace files (simulate) ─────────────────────────────────────────

poison = st.sampled_from(["nan", "inf", "-inf", "NaN", "1e999", "x", "", "1e400", "\x00", "\udcff"])
number = st.floats(min_value=0, max_value=1e6, allow_nan=False).map(lambda x: f"{x:g}")


@st.composite
def rate_csv(draw) -> bytes:
    rows = draw(st.lists(st.tuples(number, number), min_size=0, max_size=30))
    k = draw(st.integers(0, max(len(rows), 1)))
    bad = draw(poison)
    lines = ["window_start_s,total_rate_rps"] + [f"{a},{b}" for a, b in rows]
    lines.insert(min(k + 1, len(lines)), draw(st.sampled_from([f"{bad},1", f"0,{bad}", f"{bad},{bad}"])))
    return "\n".join(lines).encode("utf-8", "surrogateescape")


@budget(25)
@given(trace=rate_csv())
def test_a_poisoned_rate_trace_in_the_inputs_is_refused(trace):
    doc = dev_document()
    traffic = doc["config"]["llm-serving:inputs"]["endpoints"][0]["traffic"]
    traffic.pop("hourly_mean_requests_per_s", None)
    traffic.pop("rate_trace", None)
    traffic["rate_trace"] = {"path": "rate.csv", "scale_to_mean_requests_per_s": 2}
    with sandbox() as d:
        (d / "rate.csv").write_bytes(trace)
        doc_plain = doc["config"]["llm-serving:inputs"]  # a plain inputs file resolves traces next to itself
        (d / "inputs.yaml").write_text(yaml.safe_dump(doc_plain))
        rc, _out, err = run(["plan", "inputs.yaml"])
        assert_clean_refusal(rc, err, "rate.csv", "inputs.yaml")


@st.composite
def request_trace(draw) -> tuple[str, bytes]:
    kind = draw(st.sampled_from(["azure", "mooncake", "servegen"]))
    n = draw(st.integers(0, 12))
    bad = draw(poison)
    if kind == "mooncake":
        rows = [json.dumps({"timestamp": i * 1000, "input_length": 100, "output_length": 10}) for i in range(n)]
        rows.insert(draw(st.integers(0, n)), draw(st.sampled_from([
            f'{{"timestamp": {bad if bad in ("NaN", "Infinity") else "NaN"}, "input_length": 1, "output_length": 1}}',
            '{"timestamp": 1, "input_length": Infinity, "output_length": 1}',
            "[" * 2000 + "]" * 2000, '{"timestamp": ' + "9" * 5000 + "}", f"not json {bad}"])))
        return "t.jsonl", "\n".join(rows).encode("utf-8", "surrogateescape")
    if kind == "azure":
        rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [f"2023-11-16 18:{i:02d}:00,100,10" for i in range(n)]
        rows.insert(draw(st.integers(1, n + 1)), f"2023-11-16 18:00:00,{bad},10")
        return "t.csv", "\n".join(rows).encode("utf-8", "surrogateescape")
    rows = ["window_start_s,total_rate_rps"] + [f"{i * 600},1.5" for i in range(n)]
    rows.insert(draw(st.integers(1, n + 1)), draw(st.sampled_from([f"{bad},1", f"600,{bad}"])))
    return "t.csv", "\n".join(rows).encode("utf-8", "surrogateescape")


@budget(30)
@given(trace=st.one_of(request_trace(), st.tuples(st.just("t.csv"), hostile_bytes)))
def test_simulate_refuses_a_poisoned_trace_before_simulating(trace):
    name, data = trace
    with sandbox() as d:
        (d / name).write_bytes(data)
        rc, _out, err = run(["simulate", str(DEV), "--trace", name, "--hours", "0:1", "--no-progress"])
        assert_clean_refusal(rc, err, name)


# ── simulate's options ─────────────────────────────────────────────────────────────────────────


@budget(30)
@given(opt=st.sampled_from([
    ("--seed", st.integers(max_value=-1).map(str)),
    ("--hours", st.sampled_from(["", "x", "5:1", "-1:2", "0:nan", "nan:1", "0:inf", "0:1000", "1", "1:2:3"])),
    ("--plot", st.sampled_from(["", "/", "/nonexistent-dir/week.png", "week.xyz", "/proc/week.png", "."])),
    ("--spike-factor", st.sampled_from(["nan", "inf", "-1", "0.5", "1e9"])),
    ("--detect-minutes", st.sampled_from(["nan", "-inf", "-5"])),
    ("--endpoint", st.sampled_from(["nope", "", "../x"])),
    ("--drill", st.sampled_from(["nope", ""])),
]), data=st.data())
def test_simulate_refuses_bad_options_before_the_work(opt, data):
    flag, values = opt
    value = data.draw(values)
    drill = {"--spike-factor": ["--drill", "spike"], "--detect-minutes": ["--drill", "rollback"]}.get(flag, [])
    with sandbox():
        rc, _out, err = run(["simulate", str(DEV), "--hours", "0:1", "--no-progress", *drill, f"{flag}={value}"])
    assert_clean_refusal(rc, err, flag, "usage:")


# ── diff on a saved spec ───────────────────────────────────────────────────────────────────────


def _numeric_paths(value, prefix=()):
    if isinstance(value, dict):
        for k, v in value.items():
            if k != "derivations":
                yield from _numeric_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numeric_paths(v, prefix + (i,))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield prefix


@budget(40)
@given(data=st.data())
def test_diff_refuses_a_spec_with_impossible_figures(data):
    spec = json.loads(prod_spec_json())
    paths = sorted(_numeric_paths(spec), key=str)
    how = data.draw(st.sampled_from(["negative", "nan", "version", "duplicate", "string", "huge"]))
    if how == "version":
        spec["spec_version"] = data.draw(st.sampled_from(["2", "", "0", "1.0", None, 1]))
    elif how == "duplicate":
        spec["endpoints"].append(copy.deepcopy(spec["endpoints"][0]))
    else:
        path = data.draw(st.sampled_from(paths))
        bad = {"negative": -data.draw(st.integers(1, 10**6)), "nan": data.draw(st.sampled_from(["NaN", "Infinity"])),
               "string": "lots", "huge": "9" * data.draw(st.integers(31, 5000))}[how]
        _set(spec, path, f"@@{bad}@@" if how in ("nan", "huge") else bad)
    text = json.dumps(spec).replace('"@@', "").replace('@@"', "")
    with sandbox() as d:
        (d / "spec.json").write_text(text)
        rc, _out, err = run(["diff", "spec.json", str(PROD)])
    assert_clean_refusal(rc, err, "spec.json")


# ── weights sync: SHA256SUMS and the stack it plans ────────────────────────────────────────────

manifest_line = st.one_of(
    st.builds(lambda name: "0" * 64 + "  " + name, st.sampled_from(["missing.bin", "../escape", "/abs", ".llm-serving/x"])),
    st.text(max_size=80).filter(lambda s: "\n" not in s and "\r" not in s),
    st.just("g" * 64 + "  model.safetensors"),
)


@budget(20)
@given(manifest=st.one_of(
    st.lists(manifest_line, min_size=0, max_size=6).map(lambda ls: "\n".join(ls).encode()),
    st.binary(max_size=200).map(lambda b: b"\xff" + b),
))
def test_weights_sync_refuses_a_bad_manifest_cleanly(manifest):
    from modal_apps import weights as W

    with sandbox() as d:
        (d / "src").mkdir()
        (d / "src" / "SHA256SUMS").write_bytes(manifest)
        rc, out, err = run(["sync", "--stack", str(DEV), "--endpoint", "assist", "--source-dir", "src",
                            "--dest-dir", "vol", "--no-progress"], main=W.main)
    assert "Traceback" not in err, err
    # a malformed manifest is bad input (2); a well-formed one naming a file the folder lacks stops the sync (1)
    assert rc in (1, 2), (rc, out, err)
    lines = errors_of(err)
    assert len(lines) == 1 and ("SHA256SUMS" in lines[0] or "src" in lines[0]), err


@budget(15)
@given(data=hostile_bytes)
def test_weights_sync_refuses_a_hostile_stack_file(data):
    from modal_apps import weights as W

    with sandbox() as d:
        (d / "Pulumi.x.yaml").write_bytes(data)
        rc, _out, err = run(["sync", "--stack", "Pulumi.x.yaml", "--endpoint", "assist", "--dest-dir", "vol"],
                            main=W.main)
    assert_clean_refusal(rc, err, "Pulumi.x.yaml")


# ── render's output folder ─────────────────────────────────────────────────────────────────────


@budget(12)
@given(out=st.sampled_from(["", " ", ".", "k8s", "afile", "user", "user/k8s", "./"]))
def test_render_never_writes_into_or_deletes_a_folder_it_does_not_own(out):
    with sandbox() as d:
        (d / "afile").write_text("mine")
        (d / "k8s").mkdir()
        (d / "k8s" / "notes.yaml").write_text("mine")
        (d / "user").mkdir()
        (d / "user" / "k8s").mkdir()
        (d / "user" / "k8s" / "a.yaml").write_text("mine")
        before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
        rc, _out, err = run(["render", str(DEV), "--out", out])
        assert_clean_refusal(rc, err, "--out")
        assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before


# ── a few real processes: the hang guard is the timeout ────────────────────────────────────────


@pytest.mark.parametrize("content, args", [
    (_alias_bomb(9), ["plan"]),
    (_deep_json(5000), ["plan"]),
    (b"\xff\xfe\x00garbage", ["render", "--out", "out"]),
    (_huge_int(5000), ["diff", str(DEV)]),
])
def test_real_processes_refuse_hostile_files_quickly(tmp_path, content, args):
    f = tmp_path / ("in.json" if content.startswith(b"[") else "in.yaml")
    f.write_bytes(content)
    argv = [sys.executable, "-m", "topology", args[0], str(f), *args[1:]]
    r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_clean_refusal(r.returncode, r.stderr, str(f))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f.name]


def test_a_real_process_refuses_a_negative_seed_and_an_unwritable_plot(tmp_path):
    for extra, name in ((["--seed", "-1"], "--seed"), (["--plot", "/proc/week.png"], "--plot")):
        r = subprocess.run([sys.executable, "-m", "topology", "simulate", str(DEV), "--hours", "0:1", *extra],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert_clean_refusal(r.returncode, r.stderr, name)
