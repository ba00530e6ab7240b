"""Helpers for the component and render tests: stack recordings (cached per session) and readers of them."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from offline.mockrun import Recording, run_stack_file
from topology.timebase import MINUTES_PER_WEEK

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def recording(stack: str) -> Recording:
    """`__main__.py` run under mocks for stacks/Pulumi.<stack>.yaml (once per test session)."""
    return run_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")


def objects(rec: Recording, kind: str) -> list[dict[str, Any]]:
    return [o for o in rec.kubernetes_objects() if o["kind"] == kind]


def by_name(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def cron_minute_of_week(expr: str) -> int:
    """Inverse of the weekly cron the components write: 'M H * * DOW' (DOW 0 = Sunday) → minute of week."""
    minute, hour, dom, month, dow = expr.split()
    assert (dom, month) == ("*", "*"), expr
    day = (int(dow) - 1) % 7  # minute-of-week day 0 is Monday
    return day * 1440 + int(hour) * 60 + int(minute)


def cron_active(start: int, end: int, minute: int) -> bool:
    """KEDA's cron scaler semantics: active when the latest `start` at or before `minute` is more recent
    than the latest `end` (so a window wrapping past Sunday 24:00 needs no special case)."""
    since_start = (minute - start) % MINUTES_PER_WEEK
    since_end = (minute - end) % MINUTES_PER_WEEK
    return since_start < since_end


def desired_replicas(scaled_object: dict[str, Any], minute: int) -> int:
    """The replicas KEDA keeps at a minute of the week from the cron triggers and minReplicaCount alone
    (the queue trigger can only add)."""
    spec = scaled_object["spec"]
    best = spec["minReplicaCount"]
    for t in spec["triggers"]:
        if t["type"] != "cron":
            continue
        m = t["metadata"]
        if cron_active(cron_minute_of_week(m["start"]), cron_minute_of_week(m["end"]), minute):
            best = max(best, int(m["desiredReplicas"]))
    return best
