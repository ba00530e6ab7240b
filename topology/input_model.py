"""The base of every input model (cost inputs, rollouts): one set of rules for what a user writes.

- unknown fields are refused (extra="forbid"), models are frozen;
- NaN and infinity are refused as "not a number" before any bound is checked (NaN passes no comparison);
- a boolean is refused where a number belongs: pydantic's lax mode reads true/yes/on as 1, so
  `decode_tokens_per_s: true` planned at 1 token/s and the error then blamed the SLO.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _numeric(annotation) -> bool:
    """Whether a field's type takes numbers: int or float, alone, optional, or in a list, tuple or dict (not bool)."""
    if annotation in (int, float):
        return True
    return any(_numeric(a) for a in typing.get_args(annotation) if a is not bool)


def _has_bool(v) -> bool:
    if isinstance(v, dict):  # prices by GPU kind: {H100-80GB: true} was read as $1
        v = list(v.values())
    return isinstance(v, bool) or (isinstance(v, (list, tuple)) and any(isinstance(x, bool) for x in v))


def not_after_today(v, info: ValidationInfo, what: str):
    """v (a date, or None) unless it is after the `today` the loader passes in the validation context (the planner
    reads no clock): a date in the future, with what to give instead."""
    today = (info.context or {}).get("today")
    if v is not None and today is not None and v > today:
        raise ValueError(f"{v.isoformat()} is in the future (today is {today.isoformat()}); give {what}")
    return v


class InputModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, v, info: ValidationInfo):
        if _has_bool(v) and _numeric(cls.model_fields[info.field_name].annotation):
            what = "a boolean" if isinstance(v, bool) else "holds a boolean"
            raise ValueError(f"{what} (YAML reads true/false, yes/no, on/off as one), not a number")
        return v
