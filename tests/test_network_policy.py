"""Who can connect to an engine or the quality recorder, as the cluster would decide it from the rendered
NetworkPolicies (components/network_policy.py).

`admits` below is the Kubernetes rule as its documentation states it (concepts/services-networking/
network-policies): a pod selected by no Ingress policy of its namespace admits every connection; a selected pod
admits a connection only when one of the policies selecting it has an ingress rule whose `from` (absent or empty:
every source) holds a peer matching the source and whose `ports` (absent: every port) hold the port. A peer with a
podSelector alone means pods of the policy's own namespace; with a namespaceSelector alone, every pod of the
namespaces it selects; with both in one element, pods matching the first in namespaces matching the second. Every
namespace carries `kubernetes.io/metadata.name: <its name>` (set by the API server since 1.22). It is written from
the documentation, not from the component or the policy pack."""

from __future__ import annotations

import copy

import pytest
import yaml

from offline.mockrun import Recording, read_stack_config, run_program
from policies.rules import Resource, StackContext, check_serving_pods_admit_only_their_clients
from pulumi_support import ROOT, objects, recording
from topology.loading import InputError

# the pods of kube-prometheus-stack 88.5.3's Prometheus (prometheus-operator v0.93 pkg/prometheus/server/
# operator.go makeSelectorLabels, statefulset.go's shard label, promcfg.go's version label)
PROMETHEUS_POD = ("monitoring", {
    "app.kubernetes.io/name": "prometheus", "app.kubernetes.io/instance": "kube-prometheus-stack-prometheus",
    "app.kubernetes.io/managed-by": "prometheus-operator", "app.kubernetes.io/version": "3.9.1",
    "operator.prometheus.io/name": "kube-prometheus-stack-prometheus", "operator.prometheus.io/shard": "0",
    "prometheus": "kube-prometheus-stack-prometheus"})


def _labels_match(selector: dict, labels: dict) -> bool:
    if set(selector) - {"matchLabels"}:
        raise AssertionError(f"this reference reads matchLabels only: {selector}")
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(peer: dict, policy_ns: str, src_ns: str, src_labels: dict) -> bool:
    if "ipBlock" in peer:
        return False  # the sources here are pods; none of the stack's peers is an address block
    ns_ok = (_labels_match(peer["namespaceSelector"], {"kubernetes.io/metadata.name": src_ns})
             if "namespaceSelector" in peer else src_ns == policy_ns)
    pod_ok = _labels_match(peer["podSelector"], src_labels) if "podSelector" in peer else True
    return ns_ok and pod_ok


def admits(policies: list[dict], src: tuple[str, dict], dst: tuple[str, dict], port: int) -> bool:
    (src_ns, src_labels), (dst_ns, dst_labels) = src, dst
    selecting = [p for p in policies if p["metadata"]["namespace"] == dst_ns
                 and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
                 and _labels_match(p["spec"]["podSelector"], dst_labels)]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress", []):
            peers = rule.get("from") or []
            from_ok = not peers or any(_peer_matches(x, p["metadata"]["namespace"], src_ns, src_labels) for x in peers)
            ports = rule.get("ports") or []
            port_ok = not ports or any(x.get("port") == port and x.get("protocol", "TCP") == "TCP" for x in ports)
            if from_ok and port_ok:
                return True
    return False


def _pods(rec: Recording) -> dict[str, tuple[str, dict, dict]]:
    """Deployment name → (namespace, pod template labels, first container's ports by name)."""
    out = {}
    for d in objects(rec, "Deployment"):
        tmpl = d["spec"]["template"]
        ports = {p["name"]: p["containerPort"] for c in tmpl["spec"]["containers"] for p in c.get("ports", [])}
        out[d["metadata"]["name"]] = (d["metadata"]["namespace"], tmpl["metadata"]["labels"], ports)
    return out


def _pod_monitor_port(rec: Recording, labels: dict, ports: dict) -> int:
    """The port the PodMonitor selecting these pods scrapes (named in the monitor, numbered in the container)."""
    [pm] = [m for m in objects(rec, "PodMonitor") if _labels_match(m["spec"]["selector"], labels)]
    [ep] = pm["spec"]["podMetricsEndpoints"]
    return ports[ep["port"]]


def test_prod_engines_and_recorder_admit_the_gateway_and_prometheus_and_nobody_else():
    rec = recording("prod")
    policies = objects(rec, "NetworkPolicy")
    pods = _pods(rec)
    gateway = next(v for k, v in pods.items() if v[1].get("app.kubernetes.io/component") == "gateway")
    recorder = pods["quality-recorder"]
    engines = {k: v for k, v in pods.items() if v[1].get("app.kubernetes.io/name") == "vllm"}
    # prod runs three endpoints' floors, one of them with a rollout candidate or the previous version warm
    assert len({v[1]["app.kubernetes.io/instance"] for v in engines.values()}) == 3 and len(engines) > 3
    stranger = ("default", {"app": "debug-shell"})
    for name, (ns, labels, ports) in engines.items():
        port = ports["http"]
        dst = (ns, labels)
        assert admits(policies, gateway[:2], dst, port), name
        # Prometheus reaches the port its PodMonitor scrapes (the queue metric KEDA and every alert read)
        assert admits(policies, PROMETHEUS_POD, dst, _pod_monitor_port(rec, labels, ports)), name
        assert not admits(policies, recorder[:2], dst, port), name
        assert not admits(policies, stranger, dst, port), name
        assert not admits(policies, ("monitoring", {"app.kubernetes.io/name": "alertmanager"}), dst, port), name
        assert not admits(policies, (ns, gateway[1]), dst, port + 1), name  # the serving port alone
        others = [v for v in engines.values() if v[1]["app.kubernetes.io/instance"] != labels["app.kubernetes.io/instance"]]
        assert not any(admits(policies, o[:2], dst, port) for o in others), name  # no engine reaches another's
    rdst, rport = recorder[:2], recorder[2]["http"]
    assert admits(policies, gateway[:2], rdst, rport)
    assert admits(policies, PROMETHEUS_POD, rdst, _pod_monitor_port(rec, recorder[1], recorder[2]))
    assert not any(admits(policies, e[:2], rdst, rport) for e in engines.values())
    assert not admits(policies, stranger, rdst, rport)


def test_the_gateway_reaches_every_backend_port_it_is_configured_with():
    """The ports the gateway's rendered HAProxy config connects to (its server templates: floors, canaries, the
    previous version, the recorder) are those the policies admit it to."""
    rec = recording("prod")
    policies = objects(rec, "NetworkPolicy")
    pods = _pods(rec)
    gateway = next(v for v in pods.values() if v[1].get("app.kubernetes.io/component") == "gateway")
    [cfg] = [t for cm in objects(rec, "ConfigMap") for k, t in cm.get("data", {}).items() if k == "haproxy.cfg"]
    targets = {}
    for line in cfg.splitlines():
        words = line.split()
        if words[:1] == ["server-template"]:
            host, port = words[3].rsplit(":", 1)
            targets[host] = int(port)
    assert targets
    by_service = {s["metadata"]["name"]: s for s in objects(rec, "Service")}
    for host, port in targets.items():
        service = by_service[host.split(".")[0]]
        selected = [v for v in pods.values() if _labels_match({"matchLabels": service["spec"]["selector"]}, v[1])]
        assert selected, host
        for pod in selected:
            assert admits(policies, gateway[:2], pod[:2], port), host
    # floors, the canary, the previous version and the recorder
    assert {h.split(".")[0].rsplit("-", 1)[-1] for h in targets} >= {"pods", "recorder"} and len(targets) >= 5


def _platform_config(**network_policy):
    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.prod.yaml")
    return stack, {**config, **({"llm-serving:networkPolicy": network_policy} if network_policy else {})}


def test_an_external_prometheus_needs_the_scrapers_named():
    stack, config = _platform_config()
    config["llm-serving:prometheusUrl"] = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1"
    with pytest.raises(InputError, match=r"prometheusUrl 'https://aps-workspaces.*' is not a Service in this cluster.*"
                                         r"set networkPolicy.scrapers.*or networkPolicy.enabled: false"):
        run_program(stack, config)


def test_named_scrapers_and_a_platform_prometheus_elsewhere_are_admitted():
    stack, config = _platform_config(scrapers=[{"namespace": "observability",
                                                "podLabels": {"app.kubernetes.io/name": "vmagent"}}])
    policies = objects(run_program(stack, config), "NetworkPolicy")
    engine = next(p for p in policies if p["metadata"]["name"] == "assist-vllm")
    dst = ("llm-serving", {**engine["spec"]["podSelector"]["matchLabels"], "serving.llm/track": "stable"})
    assert admits(policies, ("observability", {"app.kubernetes.io/name": "vmagent"}), dst, 8000)
    assert not admits(policies, PROMETHEUS_POD, dst, 8000)
    # derived from the URL: the Prometheus pods of the namespace its Service is in
    stack, config = _platform_config()
    config["llm-serving:prometheusUrl"] = "http://prometheus-operated.observability.svc:9090"
    policies = objects(run_program(stack, config), "NetworkPolicy")
    assert admits(policies, ("observability", PROMETHEUS_POD[1]), dst, 8000)
    assert not admits(policies, PROMETHEUS_POD, dst, 8000)


@pytest.mark.parametrize("bad, message", [
    ({"scrapers": [{"namespace": "Monitoring", "podLabels": {"app": "prometheus"}}]},
     r"networkPolicy.scrapers.0.namespace = 'Monitoring'"),
    ({"scrapers": [{"namespace": "monitoring", "podLabels": {}}]}, r"networkPolicy.scrapers.0.podLabels = \{\}"),
    ({"scrapers": [{"namespace": "monitoring", "podLabels": {"app": "a b"}}]}, r"'a b'"),
    ({"enabled": "sometimes"}, r"networkPolicy.enabled = 'sometimes'"),
    ({"enabled": "no"}, r"networkPolicy.enabled = 'no': Input should be a valid boolean"),  # never off by a string
    ({"scraper": []}, r"networkPolicy.scraper = .*did you mean 'scrapers'"),
    ({"scrapers": []}, r"networkPolicy.scrapers = \[\]: Tuple should have at least 1 item"),
    ({"scrapers": [{"cidr": "0.0.0.0/0"}]}, r"networkPolicy.scrapers.0.cidr = '0.0.0.0/0': '0.0.0.0/0' admits every "
                                           r"address"),
    ({"scrapers": [{"cidr": "10.0.0.0/33"}]}, r"'10.0.0.0/33' is not an address range"),
    ({"scrapers": [{"cidr": "10.0.0.0/16", "namespace": "monitoring"}]}, r"either pods .* or an address range"),
    ({"scrapers": [{"namespace": "monitoring"}]}, r"needs namespace and podLabels .* or cidr"),
])
def test_bad_network_policy_settings_are_refused_naming_the_field(bad, message):
    stack, config = _platform_config(**bad)
    with pytest.raises(InputError, match=message):
        run_program(stack, config)


def _resources(rec: Recording) -> list[Resource]:
    return [Resource(type=r.type, name=r.name, urn=r.urn, props=r.inputs) for r in rec.resources]


def test_policy_pack_flags_engines_and_recorder_that_any_pod_can_reach():
    rec = recording("prod")
    assert check_serving_pods_admit_only_their_clients(_resources(rec), StackContext()) == []
    stack, config = _platform_config(enabled=False)
    off = run_program(stack, config)
    assert objects(off, "NetworkPolicy") == []
    found = check_serving_pods_admit_only_their_clients(_resources(off), StackContext())
    flagged = {m.split(" is ")[0] for _, m in found}
    engines = {f"Deployment llm-serving/{d['metadata']['name']}" for d in objects(off, "Deployment")
               if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"}
    assert flagged == engines | {"Deployment llm-serving/quality-recorder"}
    assert all("no NetworkPolicy selects its pods" in m for _, m in found)
    # a policy that selects the engines but opens a rule to every source opens them
    res = _resources(rec)
    i = next(i for i, r in enumerate(res) if r.props.get("kind") == "NetworkPolicy"
             and r.props["metadata"]["name"] == "assist-vllm")
    props = copy.deepcopy(dict(res[i].props))
    props["spec"]["ingress"].append({"ports": [{"port": 8000, "protocol": "TCP"}]})  # no `from`: anyone
    res[i] = Resource(type=res[i].type, name=res[i].name, urn=res[i].urn, props=props)
    found = check_serving_pods_admit_only_their_clients(res, StackContext())
    assert found and all("NetworkPolicy llm-serving/assist-vllm admits every source" in m for _, m in found)
    assert {m.split(" is ")[0] for _, m in found} == {e for e in engines if "/assist-" in e}


def test_a_created_cluster_enforces_network_policies():
    """The VPC CNI enforces NetworkPolicies only with its agent on: the add-on's `enableNetworkPolicy`, a string
    (amazon-vpc-cni-k8s charts/aws-vpc-cni/values.yaml, v1.14.0 on)."""
    rec = recording("dev")
    [cni] = [r for r in rec.resources if r.type == "aws:eks/addon:Addon" and r.inputs["addonName"] == "vpc-cni"]
    assert yaml.safe_load(cni.inputs["configurationValues"]) == {"enableNetworkPolicy": "true"}


def test_the_pack_reads_the_labels_of_a_bare_pod_and_a_cronjob_where_they_are():
    """A Pod carries its labels in its own metadata, a CronJob's pods in its job template's pod template: both are
    selected by the engines' policy as a Deployment's pods are (the rule once read spec.template for every kind)."""
    rec = recording("prod")
    res = _resources(rec)
    engine = next(d for d in objects(rec, "Deployment") if d["metadata"]["name"] == "assist-vllm")
    tmpl = engine["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**tmpl["metadata"], "name": "assist-debug",
                                                           "namespace": "llm-serving"}, "spec": tmpl["spec"]}
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "assist-nightly", "namespace": "llm-serving"},
            "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": tmpl}}}}
    extra = [Resource(type="kubernetes:core/v1:Pod", name="assist-debug", urn="urn:pod", props=pod),
             Resource(type="kubernetes:batch/v1:CronJob", name="assist-nightly", urn="urn:cron", props=cron)]
    assert check_serving_pods_admit_only_their_clients(res + extra, StackContext()) == []
    no_policies = [r for r in res if r.props.get("kind") != "NetworkPolicy"]
    flagged = {u for u, _ in check_serving_pods_admit_only_their_clients(no_policies + extra, StackContext())}
    assert {"urn:pod", "urn:cron"} <= flagged


@pytest.mark.parametrize("url, namespace", [
    ("http://prometheus-operated.observability.svc:9090", "observability"),
    ("http://Prometheus.Observability.svc.cluster.local:9090/", "observability"),  # host names are case-blind
    ("https://scrape:secret@prometheus.observability.svc", "observability"),
    ("http://prometheus.observability.svc.example.com:9090", None),  # outside the cluster
    ("http://prometheus.observability.svc:9090\n", "no URL"),  # refused as a URL first: KEDA could not query it
    ("http://prometheus.observability.svc:99999", "no URL"),
    ("http://10.0.0.5:9090", None),
    (f"http://prometheus.{'a' * 64}.svc:9090", None),  # no namespace is that long
])
def test_the_scrapers_namespace_comes_only_from_an_in_cluster_service_url(url, namespace):
    stack, config = _platform_config()
    config["llm-serving:prometheusUrl"] = url
    if namespace == "no URL":
        with pytest.raises(InputError, match=r"prometheusUrl = .*not an http\(s\) URL with a host and a port in 1-65535"):
            run_program(stack, config)
        return
    if namespace is None:
        with pytest.raises(InputError, match=r"prometheusUrl, networkPolicy.scrapers: prometheusUrl .* is not a Service "
                                             r"in this cluster"):
            run_program(stack, config)
        return
    policies = objects(run_program(stack, config), "NetworkPolicy")
    assert {p["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for p in policies} == {namespace}


def test_a_scraper_that_is_no_pod_is_admitted_by_its_address_range():
    """Amazon Managed Service for Prometheus's managed scraper connects from network interfaces in the cluster's
    subnets, which no pod selector names: an address range does, alone or beside pod scrapers."""
    stack, config = _platform_config(scrapers=[{"cidr": "10.20.0.0/16"},
                                               {"namespace": "monitoring", "podLabels": {"app.kubernetes.io/name": "prometheus"}}])
    rec = run_program(stack, config)
    policies = objects(rec, "NetworkPolicy")
    for p in policies:
        assert p["spec"]["ingress"][1]["from"] == [
            {"ipBlock": {"cidr": "10.20.0.0/16"}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    # an address range is no open door to the pack
    assert check_serving_pods_admit_only_their_clients(_resources(rec), StackContext()) == []
