"""Reading a rollout's evaluation-record file (I/O, outside the planner): bounded, validated, then passed in.

`resolve_eval_records` puts each endpoint's parsed records into `rollout.eval_records`, the way rate traces are
resolved into hourly profiles, so `plan()` stays a pure function of its arguments.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from .inputs import CostInputs
from .reading import read_document
from .rollout import EvalRecord, EvalRecordsFile

MAX_EVAL_RECORDS_BYTES = 1_000_000  # a file of 1,000 records is ~300 kB; anything larger is not a record file


def read_eval_records(path: Path, field: str) -> tuple[EvalRecord, ...]:
    """The records of one evaluation-record file; every problem is an InputError naming `field` and the path."""
    from .loading import InputError, format_validation_error  # loading imports this module lazily

    where = f"{field}={str(path)!r}"
    # the project's bounded reader: a FIFO, a directory, an alias bomb, deep nesting or a huge integer is a one-line
    # error, not a hang or a traceback (it read the file directly and hung on a FIFO)
    doc = read_document(path, field, max_bytes=MAX_EVAL_RECORDS_BYTES)
    try:
        return tuple(EvalRecordsFile.model_validate(doc).records)
    except ValidationError as e:
        raise InputError(format_validation_error(e, where)) from None


def resolve_eval_records(inputs: CostInputs, base_dir: Path, source: str = "") -> CostInputs:
    """Fill `rollout.eval_records` of every endpoint with a rollout from its `eval_records_path` (relative: base_dir);
    each file read once (copies of an endpoint name the same file)."""
    endpoints, changed = [], False
    read: dict[Path, tuple[EvalRecord, ...]] = {}
    for i, ep in enumerate(inputs.endpoints):
        r = ep.rollout
        if r is None or r.eval_records is not None:
            endpoints.append(ep)
            continue
        path = Path(r.eval_records_path)
        path = path if path.is_absolute() else base_dir / path
        if path not in read:
            field = f"endpoints.{i}.rollout.eval_records_path"  # as resolve_traces names its field
            read[path] = read_eval_records(path, f"{source}: {field}" if source else field)
        records = read[path]
        endpoints.append(ep.model_copy(update={"rollout": r.model_copy(update={"eval_records": records})}))
        changed = True
    return inputs.model_copy(update={"endpoints": endpoints}) if changed else inputs
