"""Reading inputs: a Pulumi stack file (inputs under one structured config key) or a plain YAML/JSON file.

File reading lives here, outside the planner: `load_inputs` resolves rate traces into the 168-hour
profile so `plan()` stays a pure function of its arguments. Every file goes through `topology.reading`
(bounded size, depth and aliases; UTF-8; one-line errors naming the file).
"""

from __future__ import annotations

import csv
import datetime as dt
import difflib
import math
import types
import typing
import warnings
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from .errors import FieldsError, InputError, InputNotice
from .inputs import HOURS_PER_WEEK, CostInputs, RateTrace
from .reading import find_non_finite, open_text_lines, read_document
from .spec import TopologySpec, saved_spec_problems
from .timebase import SECONDS_PER_HOUR

CONFIG_KEY_SUFFIX = ":inputs"
# Every `<project>:<key>` the program, the policy pack and the workflows read. Pulumi accepts any key, so a typo
# (`llm-serving:Inputs`, `monitorLabel`) was silently ignored and the setting's default deployed instead.
PROJECT_CONFIG_KEYS = frozenset({
    "inputs", "cluster", "gateway", "namespace", "prometheusUrl", "monitorLabels", "weightReplication",
    "s3GatewayEndpoint", "monitoring", "qualityRecorderImage", "planningDate", "kubeconfig", "modalTokenId",
    "modalTokenSecret", "platformProvides", "networkPolicy",
})


def closest_name(name: str, known: Sequence[str]) -> str | None:
    """The known name a misspelt one most likely meant (for a "did you mean"), or None."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6) or [c for c in known if c.lower() == name.lower()]
    return close[0] if close else None


def check_project_config_keys(keys: Any, project: str, source: str) -> None:
    """Refuse a `<project>:<key>` of the stack's config that nothing reads (another project's keys, `aws:region`
    say, are the providers' business)."""
    prefix = f"{project}:"
    odd = [k for k in keys if not isinstance(k, str)]
    if odd:  # YAML reads `123:`, `true:` or `null:` as a number, a boolean or nothing, which no config key is
        raise InputError(f"{source}: config key {odd[0]!r} is not '<project>:<name>' (a {type(odd[0]).__name__}, "
                         "not text); quote it or remove it")
    unknown = sorted(str(k).removeprefix(prefix) for k in keys
                     if str(k).startswith(prefix) and str(k).removeprefix(prefix) not in PROJECT_CONFIG_KEYS)
    if unknown:
        known = sorted(PROJECT_CONFIG_KEYS)
        hints = [f"{prefix}{name}" + (f" (did you mean {prefix}{c}?)" if (c := closest_name(name, known)) else "")
                 for name in unknown]
        raise InputError(f"{source}: config {', '.join(hints)}: not a setting of this project, which reads "
                         f"{', '.join(prefix + k for k in known)}")
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

__all__ = ["InputError", "InputNotice", "format_validation_error", "load_inputs", "load_spec_or_inputs", "inputs_from_document"]

# root models whose errors can list the allowed field names (ValidationError.title is the class name)
_ROOT_MODELS: dict[str, type[BaseModel]] = {"CostInputs": CostInputs, "TopologySpec": TopologySpec}


def _loc_text(loc: tuple[Any, ...]) -> str:
    return ".".join(str(x) for x in loc)


def _unwrap(t: Any) -> Any:
    """The model (or container) type inside Optional[...] / X | None."""
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        return (models or args or [t])[0]
    return t


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class a validation-error location points into (None when it is not a model)."""
    t: Any = root
    for part in loc:
        t = _unwrap(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            fields = {(f.alias or n): f for n, f in t.model_fields.items()}
            f = fields.get(part) or t.model_fields.get(part)
            if f is None:
                return None
            t = f.annotation
            continue
        origin, args = typing.get_origin(t), typing.get_args(t)
        if origin in (list, tuple, set, frozenset) and args:
            t = args[0]
        elif origin is dict and len(args) == 2:
            t = args[1]
        else:
            return None
    t = _unwrap(t)
    return t if isinstance(t, type) and issubclass(t, BaseModel) else None


def _allowed_names(model: type[BaseModel], given: str) -> list[str]:
    names = [f.alias or n for n, f in model.model_fields.items()]
    return sorted(names, key=lambda n: (-difflib.SequenceMatcher(None, given.lower(), n.lower()).ratio(), n))


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def format_validation_error(err: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    """One line per problem, each naming the file and the field: `FILE: field = value: what is allowed`."""
    root = model or _ROOT_MODELS.get(err.title)
    lines = []
    for e in err.errors():
        loc, msg, kind = tuple(e["loc"]), e["msg"], e["type"]
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, FieldsError):
            # a rule across fields: name them, not the whole object they sit in
            fields = ", ".join(_loc_text(loc + tuple(f.split("."))) for f in cause.fields)
            lines.append(f"{source}: {fields}: {cause}")
            continue
        where = _loc_text(loc) or "(top level)"
        if kind == "extra_forbidden":
            parent = _model_at(root, loc[:-1]) if root is not None else None
            if parent is not None:
                allowed = _allowed_names(parent, str(loc[-1]))
                msg = f"unknown field; did you mean {allowed[0]!r}? allowed: {', '.join(allowed)}"
            else:
                msg = "unknown field (check the spelling; allowed fields are in the README's input tables)"
        elif kind == "finite_number" or (
            isinstance(e.get("input"), float) and not math.isfinite(e["input"])
        ):
            msg = "not a number (NaN or infinity); give a finite value"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif kind == "missing":
            # the input at a missing field is the mapping it is missing from: naming that as its value misled
            lines.append(f"{source}: {where}: required, and not given")
            continue
        if kind in ("model_type", "model_attributes_type", "dict_type") or kind.endswith("_type") and isinstance(
            e.get("input"), (dict, list)
        ):
            lines.append(f"{source}: {where}: {msg} (got {type(e.get('input')).__name__})")
        else:
            lines.append(f"{source}: {where} = {_shown(e.get('input'))}: {msg}")
    return "\n".join(lines)


def _unwrap_value(inner: Any) -> Any:
    # `pulumi config set --path` may write {value: ...} for objects; plan and render both accept it
    if isinstance(inner, dict) and "value" in inner and len(inner) == 1:
        return inner["value"]
    return inner


def stack_inputs_document(doc: Any, source: str) -> dict[str, Any]:
    """The inputs object from a stack file's `config: {<project>:inputs: {...}}`, or the document itself."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: expected a mapping at the top level, got {type(doc).__name__}")
    config = doc.get("config")
    if "config" in doc and not isinstance(config, dict):
        raise InputError(f"{source}: config must be a mapping of '<project>:<key>' to values, got {type(config).__name__}")
    if isinstance(config, dict):
        keys = [k for k in config if str(k).endswith(CONFIG_KEY_SUFFIX)]
        if len(keys) != 1:
            raise InputError(
                f"{source}: a stack file needs exactly one '<project>{CONFIG_KEY_SUFFIX}' key under config; found {keys}"
            )
        check_project_config_keys(config, str(keys[0])[: -len(CONFIG_KEY_SUFFIX)], source)
        inner = _unwrap_value(config[keys[0]])
        if not isinstance(inner, dict):
            raise InputError(f"{source}: config.{keys[0]} must be a mapping, got {type(inner).__name__}")
        return inner
    return _unwrap_value(doc)


MAX_TRACE_SPAN_S = 10 * 366 * 86_400  # a window start beyond ten years is a typo, not a trace


def rate_trace_profile(path: Path, trace: RateTrace, what: str = "traffic.rate_trace.path") -> tuple[list[float], int]:
    """Hour-of-week mean requests/s from a rate trace of windows (window 0 at local midnight), scaled; and how
    many windows had no data. `what` names the field in errors (e.g. 'stack.yaml: endpoints.0.traffic.rate_trace.path').

    A window absent from the file, or (unless the trace says zeros are real) one whose rate is 0, has no data:
    it is skipped, not averaged in as zero traffic. An hour of the week left with no data at all takes the
    mean of the nearest hours on either side that have some."""
    sums = [0.0] * HOURS_PER_WEEK
    counts = [0] * HOURS_PER_WEEK
    offset_h = WEEKDAYS.index(trace.start_weekday) * 24
    starts: list[float] = []
    first_line: dict[float, int] = {}
    skipped = 0
    f = open_text_lines(path, what)
    try:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"window_start_s", "total_rate_rps"} <= set(reader.fieldnames):
            raise InputError(
                f"{what}={str(path)!r}: needs columns window_start_s,total_rate_rps; has {reader.fieldnames}"
            )
        for row in reader:
            # the row's first line in the file (blank lines are skipped; a quoted field may span lines)
            spanning = [v for v in row.values() if isinstance(v, str) and "\n" in v]
            i = reader.line_num - sum(v.count("\n") for v in spanning)
            if spanning:
                # an unterminated quote swallows the rest of the file into one field, the last line's newline too
                i += any(v.endswith("\n") for v in spanning)
                raise InputError(f"{what}={str(path)!r} line {i}: a quote (\") opened on this line is never closed; "
                                 "the rows after it were read as one field")
            try:
                t, r = float(row["window_start_s"]), float(row["total_rate_rps"])
            except (TypeError, ValueError):
                shown = {k: (v[:40] if isinstance(v, str) else v) for k, v in row.items()}
                raise InputError(f"{what}={str(path)!r} line {i}: window_start_s/total_rate_rps must be numbers: {shown}") from None
            if not (math.isfinite(t) and math.isfinite(r)):
                raise InputError(
                    f"{what}={str(path)!r} line {i}: window_start_s={row['window_start_s']!r}, "
                    f"total_rate_rps={row['total_rate_rps']!r}: not a number (NaN or infinity)"
                )
            if t < 0 or r < 0:
                raise InputError(f"{what}={str(path)!r} line {i}: window_start_s and total_rate_rps must be ≥ 0: {row}")
            if starts and abs(t - starts[0]) > MAX_TRACE_SPAN_S:
                # starts may be relative or unix times; ten years from the first row is a typo, not a trace
                raise InputError(f"{what}={str(path)!r} line {i}: window_start_s={t:g} is more than ten years "
                                 f"({MAX_TRACE_SPAN_S:,} s) from the first row's {starts[0]:g}")
            if t in first_line:
                # two rates for one window: averaging them in (as it did) silently changes the hour's traffic
                raise InputError(f"{what}={str(path)!r} line {i}: window_start_s={t:g} again (first on line "
                                 f"{first_line[t]}); each window once")
            first_line[t] = i
            starts.append(t)
            if r == 0 and not trace.zero_rate_is_traffic:
                skipped += 1
                continue
            h = (offset_h + int(t // 3600)) % HOURS_PER_WEEK
            sums[h] += r
            counts[h] += 1
    except csv.Error as e:
        raise InputError(f"{what}={str(path)!r}: not a CSV file ({e})") from None
    # windows absent from the file: the span at the most common spacing, less the rows present
    absent = 0
    if len(starts) >= 2:
        ordered = sorted(starts)
        steps = sorted(b - a for a, b in zip(ordered, ordered[1:]) if b > a)
        width = steps[len(steps) // 2] if steps else 0.0
        if width > SECONDS_PER_HOUR * 1.01:  # hourly rows written with a little drift are hourly
            raise InputError(
                f"{what}={str(path)!r}: its windows are {width:,.6g} s apart; an hour-of-week profile needs windows "
                f"of at most {SECONDS_PER_HOUR:,.0f} s (hours between windows would be guesses)"
            )
        if width > 0:
            absent = max(0, round((ordered[-1] - ordered[0]) / width) + 1 - len(set(starts)))
    covered = 0 if not starts else min(HOURS_PER_WEEK, int((max(starts) - min(starts)) // 3600) + 1)
    if covered < HOURS_PER_WEEK:
        raise InputError(
            f"{what}={str(path)!r} covers {covered} of 168 hours of the week; "
            "a rate trace must cover at least one full week"
        )
    if not any(counts):
        raise InputError(f"{what}={str(path)!r}: the trace has no traffic (every window is 0 or absent)")
    profile = [sums[h] / counts[h] if counts[h] else 0.0 for h in range(HOURS_PER_WEEK)]
    for h in range(HOURS_PER_WEEK):
        if not counts[h]:
            before = next(profile[(h - d) % HOURS_PER_WEEK] for d in range(1, HOURS_PER_WEEK) if counts[(h - d) % HOURS_PER_WEEK])
            after = next(profile[(h + d) % HOURS_PER_WEEK] for d in range(1, HOURS_PER_WEEK) if counts[(h + d) % HOURS_PER_WEEK])
            profile[h] = (before + after) / 2
    mean = sum(profile) / HOURS_PER_WEEK
    if not mean > 0 or not math.isfinite(mean):
        raise InputError(f"{what}={str(path)!r}: the trace has no traffic (or rates too large to average)")
    k = trace.scale_to_mean_requests_per_s / mean
    if not math.isfinite(k):  # rates of 5e-324 scale by infinity
        raise InputError(
            f"{what}={str(path)!r}: its rates (mean {mean:.3g} req/s) are too small to scale to "
            f"scale_to_mean_requests_per_s={trace.scale_to_mean_requests_per_s:g}"
        )
    scaled = [round(x * k, 6) for x in profile]
    if max(scaled) > 1_000_000:  # the profile's own bound, an hour's mean
        raise InputError(
            f"{what}={str(path)!r}: scaled to a mean of {trace.scale_to_mean_requests_per_s:g} req/s, its busiest "
            f"hour would be {max(scaled):,.0f} req/s ({max(profile) / mean:.2f}× the mean); allowed at most "
            "1,000,000: lower rate_trace.scale_to_mean_requests_per_s"
        )
    return scaled, skipped + absent


def resolve_traces(inputs: CostInputs, base_dir: Path, source: str = "") -> CostInputs:
    """Replace every endpoint's rate_trace by the 168-hour profile it implies (each file and trace read once:
    copies of an endpoint name the same trace)."""
    endpoints = []
    changed = False
    read: dict[tuple[Path, str], tuple[list[float], int]] = {}
    for i, ep in enumerate(inputs.endpoints):
        tr = ep.traffic.rate_trace
        if tr is None:
            endpoints.append(ep)
            continue
        path = Path(tr.path)
        if not path.is_absolute():
            path = base_dir / path
        what = f"{source}: endpoints.{i}.traffic.rate_trace.path" if source else f"endpoints.{i}.traffic.rate_trace.path"
        key = (path, tr.model_dump_json())
        if key not in read:
            read[key] = rate_trace_profile(path, tr, what)
        profile, missing = read[key]
        if missing:
            warnings.warn(
                f"endpoint {ep.name}: {what}={str(path)!r}: {missing} window(s) had no data (absent, or rate 0); "
                "skipped in the hourly means, not counted as zero traffic (rate_trace.zero_rate_is_traffic: true "
                "counts zeros as idle windows)",
                InputNotice, stacklevel=2,
            )
        traffic = ep.traffic.model_copy(update={"hourly_mean_requests_per_s": list(profile), "rate_trace": None})
        endpoints.append(ep.model_copy(update={"traffic": traffic}))
        changed = True
    return inputs.model_copy(update={"endpoints": endpoints}) if changed else inputs


def inputs_from_document(doc: Any, source: str, base_dir: Path, today: dt.date | None = None) -> CostInputs:
    """Validated inputs from a parsed document. `today` (passed in: the planner reads no clock) refuses a
    prices_as_of in the future; without it that check is skipped."""
    body = stack_inputs_document(doc, source)
    try:
        inputs = CostInputs.model_validate(body, context={"today": today} if today else None)
    except ValidationError as e:
        raise InputError(format_validation_error(e, source, CostInputs)) from None
    from .rollout_loading import resolve_eval_records  # imports this module's InputError

    return resolve_eval_records(resolve_traces(inputs, base_dir, source), base_dir, source)


def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def load_inputs(path: str | Path, today: dt.date | None = None) -> CostInputs:
    """Inputs from a stack file or a plain YAML/JSON file; rate-trace paths resolve against the project root
    for stack files (so `stacks/` can name `traces/...`) and against the file's folder otherwise."""
    p = Path(path)
    doc = read_document(p)
    base = project_root() if isinstance(doc, dict) and "config" in doc else p.parent
    return inputs_from_document(doc, str(p), base, today)


def load_spec_or_inputs(path: str | Path, today: dt.date | None = None) -> TopologySpec | CostInputs:
    """For `diff`: a saved spec (JSON with spec_version) or any inputs file; a spec is validated as strictly
    as inputs (see TopologySpec's validators)."""
    p = Path(path)
    doc = read_document(p)
    if isinstance(doc, dict) and "spec_version" in doc:
        bad = find_non_finite(doc)
        if bad is not None:
            raise InputError(f"{p}: {bad}: not a number (NaN or infinity); a saved spec holds finite figures")
        try:
            spec = TopologySpec.model_validate(doc)
        except ValidationError as e:
            raise InputError(format_validation_error(e, str(p), TopologySpec)) from None
        problems = saved_spec_problems(spec)
        if problems:
            raise InputError("\n".join(f"{p}: {x}" for x in problems))
        return spec
    base = project_root() if isinstance(doc, dict) and "config" in doc else p.parent
    return inputs_from_document(doc, str(p), base, today)


def is_secure_value(value: Any) -> bool:
    """A stack-file value encrypted by `pulumi config set --secret` (`{secure: ...}`)."""
    return isinstance(value, dict) and set(value) == {"secure"}


def check_kubeconfig_config(value: str | None, key: str, is_secret: bool) -> None:
    """`<project>:kubeconfig` must be secret config holding a kubeconfig document (a mapping with clusters).

    An encrypted value the program cannot read (the offline render sees `{secure: ...}`) is let through."""
    if value is None:
        return
    from .reading import loads_yaml

    try:
        doc = loads_yaml(value, f"config {key}")
    except InputError:
        doc = None
    if is_secure_value(doc):
        return
    if not is_secret:
        raise InputError(
            f"config {key} is stored in plain text; a kubeconfig holds credentials: "
            f"`pulumi config rm {key.split(':')[-1]}` then `pulumi config set --secret {key.split(':')[-1]} < kubeconfig`"
        )
    if not isinstance(doc, dict) or not isinstance(doc.get("clusters"), list):
        raise InputError(
            f"config {key}: not a kubeconfig (expected a YAML mapping with apiVersion, clusters, contexts, users; "
            f"got {type(doc).__name__})"
        )
