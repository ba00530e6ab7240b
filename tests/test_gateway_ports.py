"""Each endpoint keeps the gateway port its clients use (llm-serving:gateway.ports), whatever is added or removed.

Ports given by position (8080 + the endpoint's place) moved when an endpoint was added or removed before another:
that endpoint's clients then reached another model (or, with per-endpoint keys, got 401s), and during the rollout
old and new gateway pods disagreed."""

from __future__ import annotations

import copy

import pytest

from offline.mockrun import read_stack_config, run_program
from pulumi_support import ROOT, objects
from topology.loading import InputError


def _prod():
    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml")
    return stack, copy.deepcopy(config)


def _service_ports(rec) -> dict[str, int]:
    [svc] = [s for s in objects(rec, "Service") if s["metadata"]["name"] == "gateway-haproxy"]
    return {p["name"]: p["port"] for p in svc["spec"]["ports"]}


def _listening(rec) -> dict[str, str]:
    cfg = next(c for c in objects(rec, "ConfigMap") if "haproxy.cfg" in c.get("data", {}))["data"]["haproxy.cfg"]
    out, fe = {}, None
    for line in cfg.splitlines():
        if line.startswith("frontend fe_"):
            fe = line.split()[1]
        elif fe and line.strip().startswith("bind *:"):
            out[fe] = line.split(":")[1].split()[0]
    return out


def test_an_endpoint_added_before_the_others_leaves_their_ports_alone():
    stack, config = _prod()
    before = _service_ports(run_program(stack, config))
    assert before == config["llm-serving:gateway"]["ports"]
    inputs = config["llm-serving:inputs"]
    guard = next(e for e in inputs["endpoints"] if e["name"] == "guard")
    inputs["endpoints"].insert(0, {**copy.deepcopy(guard), "name": "aaa-moderation"})
    config["llm-serving:gateway"]["ports"]["aaa-moderation"] = 8090
    rec = run_program(stack, config)
    after = _service_ports(rec)
    assert after == {**before, "aaa-moderation": 8090}
    # and the pods listen where the Service sends each endpoint's clients
    assert sorted(int(p) for p in _listening(rec).values()) == sorted(after.values())


def test_a_removed_endpoint_leaves_the_others_ports_alone():
    stack, config = _prod()
    config["llm-serving:inputs"]["endpoints"] = [e for e in config["llm-serving:inputs"]["endpoints"]
                                                 if e["name"] != "assist"]
    with pytest.raises(InputError, match=r"names 'assist', not an endpoint of this stack"):
        run_program(stack, config)  # its entry goes with it (a name no endpoint has is taken for a typo)
    del config["llm-serving:gateway"]["ports"]["assist"]
    after = _service_ports(run_program(stack, config))
    assert after == {"autocomplete": 8081, "guard": 8082}


@pytest.mark.parametrize("ports, message", [
    (None, r"llm-serving:gateway.ports is not set and the gateway serves 3 endpoints \(assist, autocomplete, guard\).*"
           r"Until now they listened by position: \{assist: 8080, autocomplete: 8081, guard: 8082\}"),
    ({"assist": 8080, "autocomplete": 8081}, r"has no port for \['guard'\].*a free one: 8082"),
    ({"assist": 8080, "autocomplete": 8081, "guard": 8080}, r"port 8080 is given to both 'assist' and 'guard'"),
    ({"assist": 8080, "autocomplete": 8081, "guard": 8404}, r"gives 'guard' port 8404, which the gateway pod uses for "
                                                            r"the probes and metrics listener"),
    ({"assist": 8080, "autocomplete": 8081, "guard": 9081}, r"9081, which the gateway pod uses for a shadow-mirror"),
    ({"assist": 8080, "autocomplete": 8081, "guard": 80}, r"ports \{'guard': 80\}: each must be 1024–65535"),
    ({"assist": 8080, "autocomplete": 8081, "guard": 8082, "gaurd": 8083}, r"names 'gaurd' \(did you mean 'guard'\?\)"),
])
def test_missing_clashing_and_unknown_ports_are_refused_naming_them(ports, message):
    stack, config = _prod()
    if ports is None:
        del config["llm-serving:gateway"]
    else:
        config["llm-serving:gateway"] = {"ports": ports}
    with pytest.raises(InputError, match=message):
        run_program(stack, config)
