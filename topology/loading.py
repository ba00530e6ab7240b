"""Reading inputs: a Pulumi stack file (inputs under one structured config key) or a plain YAML/JSON file.

File reading lives here, outside the planner: `load_inputs` resolves rate traces into the 168-hour
profile so `plan()` stays a pure function of its arguments.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .inputs import HOURS_PER_WEEK, CostInputs, RateTrace
from .spec import TopologySpec

CONFIG_KEY_SUFFIX = ":inputs"
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class InputError(ValueError):
    """Bad input: the message names the field, the value and what is allowed."""


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: {err.error_count()} invalid field(s)"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        value = e.get("input")
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; allowed fields are in the README's input tables)"
        lines.append(f"  {loc} = {shown}: {msg}")
    return "\n".join(lines)


def _read_document(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from e
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from e


def stack_inputs_document(doc: Any, source: str) -> dict[str, Any]:
    """The inputs object from a stack file's `config: {<project>:inputs: {...}}`, or the document itself."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: expected a mapping at the top level, got {type(doc).__name__}")
    config = doc.get("config")
    if isinstance(config, dict):
        keys = [k for k in config if str(k).endswith(CONFIG_KEY_SUFFIX)]
        if len(keys) != 1:
            raise InputError(
                f"{source}: a stack file needs exactly one '<project>{CONFIG_KEY_SUFFIX}' key under config; found {keys}"
            )
        inner = config[keys[0]]
        if isinstance(inner, dict) and "value" in inner and len(inner) == 1:
            inner = inner["value"]  # `pulumi config set --path` may write {value: ...} for objects
        if not isinstance(inner, dict):
            raise InputError(f"{source}: config.{keys[0]} must be a mapping")
        return inner
    return doc


def rate_trace_profile(path: Path, trace: RateTrace) -> list[float]:
    """Hour-of-week mean requests/s from a rate trace of windows (window 0 at local midnight), scaled."""
    sums = [0.0] * HOURS_PER_WEEK
    counts = [0] * HOURS_PER_WEEK
    offset_h = WEEKDAYS.index(trace.start_weekday) * 24
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or not {"window_start_s", "total_rate_rps"} <= set(reader.fieldnames):
                raise InputError(
                    f"traffic.rate_trace.path={str(path)!r}: needs columns window_start_s,total_rate_rps; "
                    f"has {reader.fieldnames}"
                )
            for i, row in enumerate(reader, start=2):
                try:
                    t, r = float(row["window_start_s"]), float(row["total_rate_rps"])
                except (TypeError, ValueError) as e:
                    raise InputError(f"{path}:{i}: window_start_s/total_rate_rps must be numbers: {row}") from e
                h = (offset_h + int(t // 3600)) % HOURS_PER_WEEK
                sums[h] += r
                counts[h] += 1
    except OSError as e:
        raise InputError(f"traffic.rate_trace.path={str(path)!r}: cannot read ({e.strerror})") from e
    missing = [h for h in range(HOURS_PER_WEEK) if counts[h] == 0]
    if missing:
        raise InputError(
            f"traffic.rate_trace.path={str(path)!r} covers {HOURS_PER_WEEK - len(missing)} of 168 hours of the week; "
            "a rate trace must cover at least one full week"
        )
    profile = [s / c for s, c in zip(sums, counts)]
    mean = sum(profile) / HOURS_PER_WEEK
    if mean <= 0:
        raise InputError(f"traffic.rate_trace.path={str(path)!r}: the trace has no traffic")
    k = trace.scale_to_mean_requests_per_s / mean
    return [round(x * k, 6) for x in profile]


def resolve_traces(inputs: CostInputs, base_dir: Path) -> CostInputs:
    """Replace every endpoint's rate_trace by the 168-hour profile it implies."""
    endpoints = []
    changed = False
    for ep in inputs.endpoints:
        tr = ep.traffic.rate_trace
        if tr is None:
            endpoints.append(ep)
            continue
        path = Path(tr.path)
        if not path.is_absolute():
            path = base_dir / path
        profile = rate_trace_profile(path, tr)
        traffic = ep.traffic.model_copy(update={"hourly_mean_requests_per_s": profile, "rate_trace": None})
        endpoints.append(ep.model_copy(update={"traffic": traffic}))
        changed = True
    return inputs.model_copy(update={"endpoints": endpoints}) if changed else inputs


def inputs_from_document(doc: Any, source: str, base_dir: Path) -> CostInputs:
    body = stack_inputs_document(doc, source)
    try:
        inputs = CostInputs.model_validate(body)
    except ValidationError as e:
        raise InputError(format_validation_error(e, source)) from None
    from .rollout_loading import resolve_eval_records  # imports this module's InputError

    return resolve_eval_records(resolve_traces(inputs, base_dir), base_dir)


def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def load_inputs(path: str | Path) -> CostInputs:
    """Inputs from a stack file or a plain YAML/JSON file; rate-trace paths resolve against the project root
    for stack files (so `stacks/` can name `traces/...`) and against the file's folder otherwise."""
    p = Path(path)
    doc = _read_document(p)
    base = project_root() if isinstance(doc, dict) and "config" in doc else p.parent
    return inputs_from_document(doc, str(p), base)


def load_spec_or_inputs(path: str | Path) -> TopologySpec | CostInputs:
    """For `diff`: a saved spec (JSON with spec_version) or any inputs file."""
    p = Path(path)
    doc = _read_document(p)
    if isinstance(doc, dict) and "spec_version" in doc:
        try:
            return TopologySpec.model_validate(doc)
        except ValidationError as e:
            raise InputError(format_validation_error(e, str(p))) from None
    base = project_root() if isinstance(doc, dict) and "config" in doc else p.parent
    return inputs_from_document(doc, str(p), base)
