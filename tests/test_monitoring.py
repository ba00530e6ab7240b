"""No custom resource without a definition (issue #11 item 5): every custom resource a stack declares belongs
to an API group that a Helm release of the same stack installs (and it waits for that release), or that
the stack's settings say the platform provides."""

from __future__ import annotations

import pytest
import yaml

from tests.pulumi_support import recording
from tests.test_bootstrap import ROOT, waits_for

# What each chart installs CRDs for (KEDA with crds.install; kube-prometheus-stack with crds.enabled)
CHART_GROUPS = {"keda": {"keda.sh"}, "kube-prometheus-stack": {"monitoring.coreos.com"}}
BUILT_IN = {"v1", "apps", "policy", "rbac.authorization.k8s.io", "networking.k8s.io", "autoscaling", "batch"}


def group_of(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else "v1"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_custom_resource_has_a_definition_installed_or_provided_by_the_platform(stack):
    rec = recording(stack)
    config = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"]
    releases = {r.inputs["chart"]: r for r in rec.of_type("kubernetes:helm.sh/v3:Release")}
    installed = {g: rel for chart, rel in releases.items() for g in CHART_GROUPS.get(chart, ())}
    platform = {"monitoring.coreos.com"} if config["llm-serving:monitoring"] == "platform" else set()
    custom = [r for r in rec.resources if r.is_kubernetes_object and group_of(r.inputs["apiVersion"]) not in BUILT_IN]
    assert custom, "the stacks declare PodMonitors at least"
    for r in custom:
        group = group_of(r.inputs["apiVersion"])
        assert group in installed or group in platform, f"{stack}: {r.inputs['kind']} {r.name}: nothing provides {group}"
        if group in installed:
            assert installed[group].name in waits_for(rec, r), f"{r.name} does not wait for {installed[group].name}"


def test_dev_installs_kube_prometheus_stack_where_its_prometheus_url_points():
    rec = recording("dev")
    [release] = [r for r in rec.of_type("kubernetes:helm.sh/v3:Release") if r.inputs["chart"] == "kube-prometheus-stack"]
    i = release.inputs
    assert (i["version"], i["repositoryOpts"]["repo"]) == ("88.5.3", "https://prometheus-community.github.io/helm-charts")
    config = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())["config"]
    # the chart names its Prometheus Service <fullname>-prometheus, fullname = the release name containing the chart's
    host = config["llm-serving:prometheusUrl"].split("//")[1].split(":")[0]
    assert host == f"{i['name']}-prometheus.{i['namespace']}.svc.cluster.local"
    labels = config.get("llm-serving:monitorLabels", {"release": "kube-prometheus-stack"})
    spec = i["values"]["prometheus"]["prometheusSpec"]
    assert spec["podMonitorSelector"] == spec["ruleSelector"] == {"matchLabels": labels}
    assert recording("prod").of_type("serving:components:Monitoring") == []  # the platform's


def test_install_with_a_prometheus_url_elsewhere_is_refused_naming_both():
    from offline.mockrun import read_stack_config, run_program
    from topology.loading import InputError

    stack, config = read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")
    with pytest.raises(InputError, match=r"prometheusUrl is 'http://prom.example:9090'.*kube-prometheus-stack-prometheus"):
        run_program(stack, {**config, "llm-serving:prometheusUrl": "http://prom.example:9090"})
