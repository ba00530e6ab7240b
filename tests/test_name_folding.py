"""Names the user writes apart must stay apart where the deploy folds them: the gateway spells endpoints and
tenants in lower case with runs of '-'/'_' as one '_' (HAProxy sections, tenant variables, Idempotency-Key
tables), joins endpoint and tenant into one environment variable per secret, and Grafana cuts dashboard uids
at 40 characters. Before, 'Acme' and 'acme' were one tenant to the gateway (each answering with the other's
key), two endpoints could read one tenant secret, and two long endpoint names overwrote each other's
dashboard. Each case is now refused at input time naming the fields and both names, or kept apart."""

from __future__ import annotations

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
    ua, ub = dashboard_uid(a), dashboard_uid(b)
    assert ua != ub
    assert len(ua) <= GRAFANA_UID_MAX and len(ub) <= GRAFANA_UID_MAX
    assert ua.startswith("llm-serving-assistant_product")  # still readable in Grafana's URL
    assert dashboard_uid("assist") == "llm-serving-assist"  # names that fit keep their uid (existing dashboards)


def test_the_dashboard_of_a_long_endpoint_carries_its_unique_uid():
    name = "assistant-production-us-east-1-primary-a"  # 40 characters, the longest endpoint name allowed
    spec = plan(load(inputs_dict(name=name)))
    ep = spec.endpoints[0]
    assert ep.node_pools, "the worked example plans floor replicas"
    board = endpoint_dashboard(ep, "prod")
    assert board["uid"] == dashboard_uid(name) and len(board["uid"]) <= GRAFANA_UID_MAX
