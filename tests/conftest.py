"""Shared fixtures: the bundled stacks, planned once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

# The moto server's fixtures are this file's, so the session runs one server: a session fixture imported into
# each test module is a fixture of that module, started again (and kept to the end) for each one.
from tests.moto_support import aws_env, moto_endpoint  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
STACKS = sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))


def stack_name(path: Path) -> str:
    return path.name.removeprefix("Pulumi.").removesuffix(".yaml")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def planned_stacks():
    """{stack name: (inputs, spec)} for every stack file in stacks/."""
    from topology import load_inputs, plan

    out = {}
    for f in STACKS:
        inputs = load_inputs(f)
        out[stack_name(f)] = (inputs, plan(inputs))
    return out


@pytest.fixture(scope="session")
def prod_unwarmed(planned_stacks):
    """prod planned with no burst kept warm for the spike (every endpoint's traffic.spike_warm_hours_fraction 0):
    what a spike meets in the hours the plan does not keep warm, at the busiest hour (inputs, spec)."""
    from topology import plan

    inputs, _ = planned_stacks["prod"]
    eps = [e.model_copy(update={"traffic": e.traffic.model_copy(update={"spike_warm_hours_fraction": 0.0})})
           for e in inputs.endpoints]
    unwarmed = inputs.model_copy(update={"endpoints": eps})
    return unwarmed, plan(unwarmed)


# Two endpoints of one stack serving one model name: prod with autocomplete serving assist's model name (an
# interactive and a batch-like endpoint of one model, one namespace). vLLM labels series by served model name only.
SHARED_MODEL_ENDPOINTS = ("assist", "autocomplete")
SHARED_MODEL_NAME = "llama-3.3-70b-instruct"


@pytest.fixture(scope="session")
def shared_model_stack(tmp_path_factory) -> Path:
    """The prod stack file with autocomplete's model.name set to assist's, beside a link to the bundled traces."""
    text = (ROOT / "stacks" / "Pulumi.prod.yaml").read_text()
    old = "      - name: autocomplete\n        model:\n          name: llama-3.1-8b-instruct\n"
    assert text.count(old) == 1
    d = tmp_path_factory.mktemp("shared-model")
    (d / "traces").symlink_to(ROOT / "traces")
    path = d / "Pulumi.prod.yaml"
    path.write_text(text.replace(old, old.replace("llama-3.1-8b-instruct", SHARED_MODEL_NAME)))
    return path


@pytest.fixture(params=[stack_name(f) for f in STACKS])
def stack(request, planned_stacks):
    """Parametrised over every stack file: (name, inputs, spec)."""
    inputs, spec = planned_stacks[request.param]
    return request.param, inputs, spec


@pytest.fixture(autouse=True)
def event_loop_for_pulumi():
    """Pulumi's mock runner calls asyncio.get_event_loop(); a test that used asyncio.run() leaves none set
    (and the policy then refuses to create one), so every test starts with a usable loop."""
    import asyncio

    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
        if loop.is_closed():
            raise RuntimeError("closed")
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())
    yield
