"""Rate traces with gaps: windows without data are skipped (not averaged in as zero traffic) and counted."""

from __future__ import annotations

import pytest

from topology.inputs import RateTrace
from topology.loading import rate_trace_profile, resolve_traces
from tests.inputs_factory import inputs_dict
from topology.inputs import CostInputs

WINDOW_S = 600


def true_rate(hour_of_week: int) -> float:
    return 100.0 + 2.0 * hour_of_week  # linear: an hour with no data at all is recovered exactly from its neighbours


def write_trace(path, *, zero: set[int], drop: set[int]) -> None:
    """Two weeks of 10-minute windows at true_rate; window indices in `zero` read 0, those in `drop` are absent."""
    lines = ["window_start_s,total_rate_rps"]
    for i in range(2 * 168 * 6):
        if i in drop:
            continue
        rate = 0.0 if i in zero else true_rate((i // 6) % 168)
        lines.append(f"{i * WINDOW_S},{rate}")
    path.write_text("\n".join(lines) + "\n")


def trace_input(path) -> RateTrace:
    mean = sum(true_rate(h) for h in range(168)) / 168
    return RateTrace(path=str(path), scale_to_mean_requests_per_s=mean)  # scale 1: the profile is the true means


def test_gaps_are_skipped_and_counted(tmp_path):
    p = tmp_path / "gappy.csv"
    zero = {5 * 6 + 1, 5 * 6 + 2, 5 * 6 + 3, 1008 + 40 * 6}  # half of hour 5 in week 1; a window of hour 40 in week 2
    drop = {30 * 6 + j for j in range(6)} | {1008 + 30 * 6 + j for j in range(6)} | {1008 + 99 * 6}  # hour 30: no data
    write_trace(p, zero=zero, drop=drop)
    profile, missing = rate_trace_profile(p, trace_input(p))
    assert missing == len(zero) + len(drop)
    for h in range(168):
        assert profile[h] == pytest.approx(true_rate(h), rel=1e-6), h


def test_without_gaps_nothing_is_missing(tmp_path):
    p = tmp_path / "whole.csv"
    write_trace(p, zero=set(), drop=set())
    profile, missing = rate_trace_profile(p, trace_input(p))
    assert missing == 0
    assert profile[5] == pytest.approx(true_rate(5))


def test_zero_windows_can_be_declared_real(tmp_path):
    p = tmp_path / "idle.csv"
    write_trace(p, zero={5 * 6 + j for j in range(6)}, drop=set())  # hour 5 of week 1 idle
    tr = trace_input(p).model_copy(update={"zero_rate_is_traffic": True})
    profile, missing = rate_trace_profile(p, tr)
    assert missing == 0
    # hour 5 averages one idle and one busy week: half the true rate, before the scaling to the mean
    mean_raw = (sum(true_rate(h) for h in range(168)) - true_rate(5) / 2) / 168
    assert profile[5] == pytest.approx(true_rate(5) / 2 * tr.scale_to_mean_requests_per_s / mean_raw, rel=1e-6)


def test_loading_says_how_many_windows_were_missing(tmp_path):
    p = tmp_path / "gappy.csv"
    write_trace(p, zero={7, 8}, drop={100})
    d = inputs_dict()
    d["endpoints"][0]["traffic"] = {"rate_trace": {"path": str(p), "scale_to_mean_requests_per_s": 2.0}}
    inputs = CostInputs.model_validate(d)
    with pytest.warns(UserWarning, match=r"3 window\(s\) had no data"):
        resolved = resolve_traces(inputs, tmp_path)
    assert len(resolved.endpoints[0].traffic.hourly_mean_requests_per_s) == 168


def test_cli_prints_the_missing_windows_once_as_a_plain_warning_line(tmp_path, capsys):
    import json

    from topology.cli import main

    p = tmp_path / "gappy.csv"
    write_trace(p, zero={7, 8}, drop={100})
    d = inputs_dict()
    d["endpoints"][0]["traffic"] = {"rate_trace": {"path": str(p), "scale_to_mean_requests_per_s": 2.0}}
    f = tmp_path / "inputs.json"
    f.write_text(json.dumps(d, default=str))
    assert main(["plan", "--json", str(f)]) == 0
    err = capsys.readouterr().err.splitlines()
    notes = [line for line in err if "had no data" in line]
    assert len(notes) == 1 and notes[0].startswith("warning: endpoint ") and "3 window(s)" in notes[0]
    assert not any("UserWarning" in line or "resolve_traces" in line for line in err)  # no Python warning form


def test_copies_naming_one_trace_read_it_once_and_each_is_warned_about(tmp_path, monkeypatch):
    """Copies of an endpoint (per region or tenant) name the same trace: it is read once, every copy gets its
    profile, and each copy's missing windows are still reported under its own name."""
    import warnings

    from topology import loading

    p = tmp_path / "gappy.csv"
    write_trace(p, zero={7, 8}, drop={100})
    d = inputs_dict()
    ep = d["endpoints"][0]
    ep["traffic"] = {"rate_trace": {"path": str(p), "scale_to_mean_requests_per_s": 2.0}}
    # each copy serves its own model name (one stack's endpoints may not share one: their vLLM metrics would mix)
    other = {**ep, "name": "copy", "model": {**ep["model"], "name": "copy-model"},
             "traffic": {"rate_trace": {"path": str(p), "scale_to_mean_requests_per_s": 4.0}}}
    d["endpoints"] = [ep, {**ep, "name": "copy-a", "model": {**ep["model"], "name": "copy-a-model"}}, other]
    inputs = CostInputs.model_validate(d)
    reads = []
    real = loading.rate_trace_profile
    monkeypatch.setattr(loading, "rate_trace_profile", lambda *a: reads.append(a[1].scale_to_mean_requests_per_s) or real(*a))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolved = resolve_traces(inputs, tmp_path)
    assert reads == [2.0, 4.0]  # the second scale is another trace: read again
    first, copy, scaled = (e.traffic.hourly_mean_requests_per_s for e in resolved.endpoints)
    assert first == copy and first is not copy
    assert scaled == pytest.approx([2 * x for x in first])
    notes = [str(w.message) for w in caught if "had no data" in str(w.message)]
    assert [n.split(":")[0] for n in notes] == [f"endpoint {e['name']}" for e in d["endpoints"]]


@pytest.mark.parametrize("rows,expect", [
    # two rows a week apart passed as a whole week: 167 of its hours were interpolated, with no word
    (["0,1", "604800,1"], "its windows are 604,800 s apart; an hour-of-week profile needs windows of at most 3,600 s"),
    # a second rate for one window was averaged in
    ([f"{i * 600},5" for i in range(1008)] + ["0,99999"], "line 1010: window_start_s=0 again (first on line 2)"),
    # a typo'd start made 1.7e15 windows 'missing'
    ([f"{i * 600},5" for i in range(1008)] + ["1e18,5"], "window_start_s=1e+18 is more than ten years"),
    # rates of 5e-324 scaled by infinity into the planner (OverflowError in feasibility)
    ([f"{i * 600},5e-324" for i in range(1008)], "are too small to scale to scale_to_mean_requests_per_s=12"),
])
def test_a_rate_trace_that_cannot_give_an_hour_of_week_profile_is_refused(tmp_path, rows, expect):
    """Found by this stop's fuzz: each was accepted silently or ended in an internal error."""
    from topology.errors import InputError

    p = tmp_path / "t.csv"
    p.write_text("window_start_s,total_rate_rps\n" + "\n".join(rows) + "\n")
    with pytest.raises(InputError) as e:
        rate_trace_profile(p, RateTrace(path=str(p), scale_to_mean_requests_per_s=12.0))
    assert expect in str(e.value), str(e.value)


def test_an_unterminated_quote_names_its_line_not_the_rows_it_swallowed(tmp_path):
    """The csv module reads from an unclosed quote to the end of the file as one field; the error printed that
    field (every row after it) as the 'value' (found by this stop's fuzz)."""
    from topology.errors import InputError

    p = tmp_path / "t.csv"
    p.write_text("window_start_s,total_rate_rps\n0,1\n\n600,\"2\n" + "".join(f"{i * 600},1\n" for i in range(2, 500)))
    with pytest.raises(InputError) as e:
        rate_trace_profile(p, RateTrace(path=str(p), scale_to_mean_requests_per_s=1.0))
    msg = str(e.value)
    assert "line 4: a quote (\") opened on this line is never closed" in msg and "1200" not in msg, msg


def test_unix_time_starts_and_hourly_rows_with_drift_are_traces(tmp_path):
    """The checks above must not refuse real traces (found by this stop's review): window starts written as unix
    times (a week of hourly rows from 2026-01-01), and hourly rows whose starts drift by a quarter second."""
    for name, starts in (("unix.csv", [1_767_571_200 + 3600 * k for k in range(168)]),
                         ("drift.csv", [round(k * 3600.25, 2) for k in range(168)])):
        p = tmp_path / name
        p.write_text("window_start_s,total_rate_rps\n" + "".join(f"{t},{1 + k % 24}\n" for k, t in enumerate(starts)))
        profile, missing = rate_trace_profile(p, RateTrace(path=str(p), scale_to_mean_requests_per_s=12.5))
        assert missing == 0 and sum(profile) / 168 == pytest.approx(12.5, rel=1e-6)


def test_a_scale_beyond_the_profiles_bound_names_the_scale_not_small_rates(tmp_path):
    from topology.errors import InputError

    p = tmp_path / "t.csv"
    p.write_text("window_start_s,total_rate_rps\n" + "".join(f"{k * 3600},{1 + k % 24}\n" for k in range(168)))
    with pytest.raises(InputError, match=r"scaled to a mean of 1e\+06 req/s, its busiest hour would be 1,920,000 req/s"
                                         r" \(1.92× the mean\); allowed at most 1,000,000"):
        rate_trace_profile(p, RateTrace(path=str(p), scale_to_mean_requests_per_s=1_000_000))
