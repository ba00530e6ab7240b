"""Names the user writes apart must stay apart where the deploy folds them: the gateway spells endpoints and
tenants in lower case with runs of '-'/'_' as one '_' (HAProxy sections, tenant variables, Idempotency-Key
tables), joins endpoint and tenant into one environment variable per secret, and Grafana cuts dashboard uids
at 40 characters. Before, 'Acme' and 'acme' were one tenant to the gateway (each answering with the other's
key), two endpoints could read one tenant secret, and two long endpoint names overwrote each other's
dashboard. Each case is now refused at input time naming the fields and both names, or kept apart."""

from __future__ import annotations

import re

import copy
from pathlib import Path

import pytest

from components.dashboards import endpoint_dashboard
from components.gateway import _env_owners
from inputs_factory import ENDPOINT, INPUTS, inputs_dict
from topology import plan
from topology.errors import InputError
from topology.loading import inputs_from_document
from topology.names import GRAFANA_UID_MAX, dashboard_uid

ROOT = Path(__file__).resolve().parent.parent


def load(d):
    return inputs_from_document(d, "in.yaml", ROOT)


def refused(d) -> str:
    with pytest.raises(InputError) as e:
        load(d)
    return str(e.value)


def two_endpoints(first: dict, second: dict) -> dict:
    d = copy.deepcopy(INPUTS)
    d["endpoints"] = [{**copy.deepcopy(ENDPOINT), **first}, {**copy.deepcopy(ENDPOINT), **second}]
    d["endpoints"][1]["model"]["name"] = "second-model"  # two models; the cases below clash on names only
    return d


@pytest.mark.parametrize("a, b, spelt", [("Acme", "acme", "acme"), ("north-east", "north_east", "north_east"),
                                         ("a--b", "a-b", "a_b")])
def test_tenants_that_fold_alike_are_refused_naming_both(a, b, spelt):
    msg = refused(inputs_dict(tenants=[a, "globex", b]))
    assert "endpoints.0.tenants" in msg
    assert repr(a) in msg and repr(b) in msg and repr(spelt) in msg


@pytest.mark.parametrize("name", ["__", "-", "café", "acme corp", "x" * 64, ""])
def test_a_tenant_name_outside_ascii_letters_digits_dash_underscore_is_refused(name):
    msg = refused(inputs_dict(tenants=["acme", name]))
    assert "endpoints.0.tenants" in msg and "ASCII letters, digits, '-' or '_'" in msg


def test_tenant_names_of_63_characters_and_mixed_case_distinct_after_folding_plan():
    spec = plan(load(inputs_dict(tenants=["Acme", "x" * 63, "a-b_c"])))
    assert [t.name for t in spec.endpoints[0].gateway.tenants] == ["Acme", "x" * 63, "a-b_c"]


def test_endpoints_spelt_alike_by_the_gateway_are_refused_naming_both_fields():
    msg = refused(two_endpoints({"name": "chat--eu"}, {"name": "chat-eu"}))
    assert "endpoints.0.name" in msg and "endpoints.1.name" in msg
    assert "'chat--eu'" in msg and "'chat-eu'" in msg and "'chat_eu'" in msg


def test_two_endpoints_whose_tenant_secrets_share_one_environment_variable_are_refused():
    """Endpoint 'chat' tenant 'eu-acme' and endpoint 'chat-eu' tenant 'acme' both read GW_CHAT_EU_ACME_API_KEY:
    the gateway pod has one variable, so one endpoint would authenticate with the other's tenant key."""
    d = two_endpoints({"name": "chat", "tenants": ["eu-acme", "globex"]}, {"name": "chat-eu", "tenants": ["acme", "b"]})
    msg = refused(d)
    assert "endpoints.0.tenants" in msg and "endpoints.1.tenants" in msg
    assert "GW_CHAT_EU_ACME_API_KEY" in msg and "'eu-acme'" in msg and "'acme'" in msg


def test_distinct_pairs_read_distinct_secret_variables_in_the_rendered_gateway():
    """The check and the deploy spell variables with the same rule: two endpoints with near names and tenants
    that pass the inputs get one owner per variable, each variable its own endpoint's."""
    spec = plan(load(two_endpoints({"name": "chat", "tenants": ["eu", "globex"]},
                                   {"name": "chat-eu", "tenants": ["acme", "globex"]})))
    owners = _env_owners([e for e in spec.endpoints if e.gated])
    expected = {"GW_CHAT_EU_API_KEY": "chat", "GW_CHAT_EU_CACHE_SALT": "chat",
                "GW_CHAT_GLOBEX_API_KEY": "chat", "GW_CHAT_GLOBEX_CACHE_SALT": "chat",
                "GW_CHAT_EU_ACME_API_KEY": "chat-eu", "GW_CHAT_EU_ACME_CACHE_SALT": "chat-eu",
                "GW_CHAT_EU_GLOBEX_API_KEY": "chat-eu", "GW_CHAT_EU_GLOBEX_CACHE_SALT": "chat-eu"}
    assert owners == expected


def test_long_endpoint_names_sharing_a_prefix_get_distinct_dashboard_uids_within_grafanas_limit():
    """Grafana refuses a uid over 40 characters (Dashboard HTTP API: 'a maximum length of 40 characters'); the
    uid was cut there, so these two (same first 28 characters) provisioned one dashboard over the other."""
    a, b = "assistant-production-us-east-1-primary", "assistant-production-us-east-1-standby"
    ua, ub = dashboard_uid("llm-serving", a), dashboard_uid("llm-serving", b)
    assert ua != ub
    assert len(ua) <= GRAFANA_UID_MAX and len(ub) <= GRAFANA_UID_MAX
    assert ua.startswith("llm-serving-assistant_product")  # still readable in Grafana's URL
    assert dashboard_uid("llm-serving", "assist") == "llm-serving-assist"  # the uids bundled stacks always had


def test_one_endpoint_name_in_two_namespaces_gets_two_dashboards():
    """The Grafana sidecar writes every watched namespace's dashboards into one folder: staging's and prod's
    'assist' had one file name, one uid and one title, so one overwrote the other."""
    from components.dashboards import dashboard_file_name

    # without the managed API, which the worked example's pricing puts within 1% of floor + burst
    spec = plan(load(inputs_dict(name="assist", managed_api=None)))
    ep = spec.endpoints[0]
    assert ep.node_pools, "the worked example plans floor replicas"
    boards = [endpoint_dashboard(ep, ns) for ns in ("llm-serving", "llm-staging")]
    assert len({b["uid"] for b in boards}) == 2 and len({b["title"] for b in boards}) == 2
    assert dashboard_file_name("llm-serving", "assist") != dashboard_file_name("llm-staging", "assist")
    assert all(len(b["uid"]) <= GRAFANA_UID_MAX for b in boards)


def test_the_dashboard_of_a_long_endpoint_carries_a_uid_within_grafanas_limit():
    name = "assistant-production-us-east-1-primary-a"  # 40 characters, the longest endpoint name allowed
    spec = plan(load(inputs_dict(name=name, managed_api=None)))
    ep = spec.endpoints[0]
    assert ep.node_pools, "the worked example plans floor replicas"
    board = endpoint_dashboard(ep, "llm-serving")
    assert len(board["uid"]) <= GRAFANA_UID_MAX and board["uid"] != dashboard_uid("llm-serving", name[:-1] + "b")


# ── names the components build from endpoint names (review of the fold check) ─────────────────────────────────


def _prod_renamed(tmp_path: Path, old: str, new: str) -> Path:
    """The prod stack with one endpoint renamed, beside a link to the bundled traces."""
    text = (ROOT / "stacks" / "Pulumi.prod.yaml").read_text()
    assert f"      - name: {old}\n" in text
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(_port_renamed(text.replace(f"      - name: {old}\n", f"      - name: {new}\n"), old, new))
    return path


def _port_renamed(text: str, old: str, new: str) -> str:
    """The stack's llm-serving:gateway.ports entry of an endpoint renamed with it (its clients' port stays)."""
    return re.sub(rf"(?m)^(    ports: \{{(?:.*?, )?){re.escape(old)}(?=: )", rf"\g<1>{new}", text, count=1)


def test_an_endpoint_named_after_anothers_shadow_keeps_the_gateway_config_valid(tmp_path):
    """Prod's assist is in shadow; its mirror frontend was `fe_assist_shadow`, which is also the frontend of an
    endpoint named 'assist-shadow': HAProxy refused the whole config ('has the same name as frontend'), so the
    first gateway pod to restart after assist entered shadow took every endpoint down."""
    import subprocess

    from components.gateway_config import StaticServers, gated_endpoints, render_gateway_config
    from tests.gateway_harness import lua_path, no_recorder, pod_ca_dir, require_haproxy
    from topology.loading import load_inputs

    binary = require_haproxy()
    spec = plan(load_inputs(_prod_renamed(tmp_path, "autocomplete", "assist-shadow")))
    eps = gated_endpoints(spec)
    assert any(e.gateway.shadow for e in eps if e.name == "assist")
    r = render_gateway_config(
        spec, quality_servers=no_recorder(), lua_path=lua_path(tmp_path), ca_path=str(pod_ca_dir(tmp_path / "ca")),
        burst_urls={e.name: "https://burst.invalid" for e in eps if e.burst is not None},
        floor_servers={e.name: StaticServers(("127.0.0.1:1",)) for e in spec.endpoints},
        canary_servers={e.name: StaticServers(("127.0.0.1:2",)) for e in eps if e.gateway.canary or e.gateway.shadow})
    for name, text in r.files.items():
        (tmp_path / name).write_text(text)
    env = {var: f"test-{key}" for var, key in r.secret_env.items()}
    out = subprocess.run([binary, "-c", "-f", str(tmp_path / "haproxy.cfg")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "frontend fe_assist_shadow\n" in r.files["haproxy.cfg"]  # the endpoint's own frontend


def test_the_gateway_service_names_each_port_by_its_whole_endpoint_name(tmp_path):
    """Service port names were cut to 15 characters: 'assist-prod-east-a' and '-b' both became
    'assist-prod-eas' (the API server refuses duplicate port names) and 'code-assistant-fast' ended in '-'."""
    from offline.mockrun import run_stack_file
    from offline.names_check import check_recording

    path = _prod_renamed(tmp_path, "autocomplete", "assist-production-east-b")
    path.write_text(_port_renamed(path.read_text().replace("      - name: assist\n", "      - name: assist-production-east-a\n"),
                                  "assist", "assist-production-east-a"))
    rec = run_stack_file(path)
    (svc,) = [o for o in rec.kubernetes_objects()
              if o["kind"] == "Service" and o["metadata"]["name"].endswith("gateway-haproxy")]
    names = [p["name"] for p in svc["spec"]["ports"]]
    assert {"assist-production-east-a", "assist-production-east-b"} <= set(names)
    assert check_recording(rec) == []


@pytest.mark.parametrize("ports, complaint", [
    ([{"name": "customer-suppor", "port": 1}, {"name": "customer-suppor", "port": 2}], "appears 2 times"),
    ([{"name": "code-assistant-", "port": 1}], "spec.ports[].name"),
])
def test_the_render_refuses_service_port_names_the_api_server_refuses(ports, complaint):
    """kubernetes validateServicePort: a Service port name is a DNS-1123 label, unique in the Service."""
    from offline.names_check import check_manifest

    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gw", "namespace": "ns"},
           "spec": {"ports": ports}}
    assert any(complaint in e for e in check_manifest(svc))


@pytest.mark.parametrize("name, ok", [("http", True), ("ep-0", True), ("metrics-portname", False),
                                      ("ep-", False), ("a--b", False), ("8080", False)])
def test_container_port_names_are_iana_service_names(name, ok):
    """apimachinery IsValidPortName: ≤15 of [a-z0-9-], a letter, no '-' at an end, no '--'."""
    from offline.names_check import check_manifest

    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"},
           "spec": {"template": {"spec": {"containers": [{"name": "c", "ports": [{"name": name, "containerPort": 1}]}]}}}}
    assert (check_manifest(dep) == []) == ok


def test_an_endpoint_named_another_plus_pods_is_refused_by_the_render_not_left_to_pulumi(tmp_path):
    """FloorReplicas children are named '<component>-<suffix>' and a URN holds the parent's type, not its name:
    'assist' and 'assist-pods' both declare floor-assist-pods-service. The render now says so."""
    from offline.mockrun import run_stack_file
    from offline.names_check import check_recording

    errors = check_recording(run_stack_file(_prod_renamed(tmp_path, "autocomplete", "assist-pods")))
    assert any("floor-assist-pods-service is declared 2 times" in e and "rename one endpoint" in e for e in errors)


def test_two_endpoints_serving_one_model_name_plan_and_render_each_on_its_own_series(shared_model_stack):
    """vLLM labels its metrics by served model name, not endpoint: once refused ('chat' and 'chat-batch' on one
    model would each have scaled, alerted and charted on both endpoints' pods). Now every floor pod carries its
    endpoint's label, the PodMonitor copies it onto the series (serving_llm_endpoint), and every query of one
    endpoint's vLLM series selects it: the stack plans and renders, each endpoint reading its own pods only."""
    import json
    import re

    from offline.names_check import check_recording
    from tests.conftest import SHARED_MODEL_ENDPOINTS, SHARED_MODEL_NAME
    from tests.prometheus_support import recorded
    from topology.loading import load_inputs

    spec = plan(load_inputs(shared_model_stack))
    assert {spec.endpoint(n).engine.served_model_name for n in SHARED_MODEL_ENDPOINTS} == {SHARED_MODEL_NAME}
    rec = recorded(shared_model_stack.resolve())
    assert check_recording(rec) == []
    objs = rec.kubernetes_objects()

    def of(kind):
        return [o for o in objs if o["kind"] == kind]

    def vllm_selectors(text):  # every {…} selector of a vLLM series in a PromQL expression
        return re.findall(r"vllm:\w+(\{[^}]*\})", text)

    for name in SHARED_MODEL_ENDPOINTS:
        own = f'serving_llm_endpoint="{name}"'
        (monitor,) = [o for o in of("PodMonitor") if o["metadata"]["name"] == f"{name}-vllm"]
        assert monitor["spec"]["podTargetLabels"] == ["serving.llm/endpoint", "serving.llm/track"]
        selected = monitor["spec"]["selector"]["matchLabels"]
        assert selected["serving.llm/endpoint"] == name
        # every floor pod of the endpoint (stable, the shadow candidate, the warm previous version) carries the
        # label with its name, and the PodMonitor selects it
        pods = [d["spec"]["template"]["metadata"]["labels"] for d in of("Deployment")
                if d["metadata"]["name"].startswith(f"{name}-vllm")]
        assert len(pods) == {"assist": 2, "autocomplete": 1}[name], pods  # prod's assist has a shadow candidate
        for labels in pods:
            assert labels["serving.llm/endpoint"] == name and selected.items() <= labels.items()
        (scaled,) = [o for o in of("ScaledObject") if o["metadata"]["name"] == f"{name}-vllm"]
        (queue,) = [t["metadata"]["query"] for t in scaled["spec"]["triggers"] if t["name"] == "requests-waiting"]
        exprs = [queue]
        (rule,) = [o for o in of("PrometheusRule") if o["metadata"].get("labels", {}).get("serving.llm/endpoint") == name]
        exprs += [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
        (board,) = [o for o in of("ConfigMap") if o["metadata"]["name"] == f"{name}-dashboard"]
        exprs += [t["expr"] for v in board["data"].values() for panel in json.loads(v)["panels"]
                  for t in panel.get("targets", [])]
        sels = [sel for x in exprs for sel in vllm_selectors(x)]
        assert len(sels) > 10, name
        for sel in sels:
            assert own in sel and f'model_name="{SHARED_MODEL_NAME}"' in sel, (name, sel)
    # every engine pod of the stack (guard keeps its previous version warm) is labelled with its endpoint and
    # selected by that endpoint's PodMonitor, so every vLLM series it exports carries serving_llm_endpoint
    monitors = {o["metadata"]["name"]: o["spec"]["selector"]["matchLabels"] for o in of("PodMonitor")}
    engines = [d for d in of("Deployment") if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"]
    assert {d["metadata"]["name"] for d in engines} == {"assist-vllm", "assist-vllm-canary", "autocomplete-vllm",
                                                       "guard-vllm", "guard-vllm-previous"}
    for d in engines:
        labels = d["spec"]["template"]["metadata"]["labels"]
        endpoint = labels["app.kubernetes.io/instance"]
        assert labels["serving.llm/endpoint"] == endpoint and monitors[f"{endpoint}-vllm"].items() <= labels.items()


@pytest.mark.parametrize("mutate, fields, words", [
    # modal 1.6.4 (_utils/name_utils.py): object names at most 64 characters; 'en-' starts environment ids
    (lambda d: d.update(project="p" * 30) or d["endpoints"][0].update(name="e" * 40),
     "project, environment, endpoints.0.name", "is 82 characters; Modal allows 64"),
    (lambda d: d.update(environment="en-gb"), "environment", "reserved by Modal"),
    # two weight caches declared for one region (two Pulumi resources 'weights-us-east-1')
    (lambda d: d.update(regions=d["regions"] * 2), "regions", "regions repeat"),
])
def test_names_modal_or_pulumi_would_refuse_at_deploy_are_refused_at_input(mutate, fields, words):
    d = inputs_dict()
    mutate(d)
    msg = refused(d)
    assert f"in.yaml: {fields}:" in msg and words in msg
