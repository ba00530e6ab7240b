"""Gateway under Pulumi's mocks: its children, the ConfigMap holding exactly the rendered config,
secrets referenced (never inlined), replicas and PDB, schema-valid manifests; and haproxy accepts
the cluster config it renders."""

from __future__ import annotations

import os
import re
import subprocess

import pulumi
import pytest

from components.gateway import Gateway, GatewayArgs, tenant_secret_name
from components.gateway_config import HAPROXY_IMAGE, DnsServers, LUA_FILE, render_gateway_config
from components.quality_recorder import sampled_endpoints
from offline.mockrun import run_function
from offline.validate import validate_objects
from tests.gateway_harness import pod_ca_dir, require_haproxy

URLS = {"assist": "https://acme-prod--assist.modal.run", "autocomplete": "https://acme-prod--ac.modal.run",
        "guard": "https://acme-prod--guard.modal.run"}


def floor_dns(spec):
    return {e.name: f"{e.name}-vllm-headless.serving.svc.cluster.local" for e in spec.endpoints}


def candidate_dns(spec):
    """The candidate's pods for endpoints in shadow or canary (the program passes FloorReplicas' canary_pods_dns)."""
    return {e.name: f"{e.name}-vllm-canary-pods.serving.svc.cluster.local" for e in spec.endpoints
            if e.gateway.shadow is not None or e.gateway.canary is not None}


RECORDER = "quality-recorder.serving.svc.cluster.local:8080"


def recorder_wiring(spec) -> dict:
    """The quality recorder's Service when an endpoint samples quality (the program passes QualityRecorder's)."""
    return {"quality_recorder": RECORDER} if sampled_endpoints(spec) else {}


def declare(spec, **extra):
    def program():
        bursts = {e.name: pulumi.Output.from_input(URLS[e.name]) for e in spec.endpoints
                  if e.tier in ("serverless_only", "floor_plus_burst")}
        Gateway("gateway", GatewayArgs(spec=spec, namespace="serving", floor_services=floor_dns(spec),
                                       burst_urls=bursts, **{"canary_services": candidate_dns(spec),
                                                             **recorder_wiring(spec), **extra}))
    return run_function(program, stack=spec.environment)


@pytest.fixture(scope="module")
def prod(planned_stacks):
    spec = planned_stacks["prod"][1]
    return spec, declare(spec)


def test_children_named_and_parented(prod):
    _, rec = prod
    (component,) = rec.of_type("serving:components:Gateway")
    children = [r for r in rec.resources if r.parent == component.urn]
    assert sorted(r.name for r in children) == ["gateway-config", "gateway-deployment", "gateway-pdb",
                                                "gateway-pod-monitor", "gateway-service"]


def test_configmap_is_the_rendered_config(prod):
    spec, rec = prod
    (cm,) = [o for o in rec.kubernetes_objects() if o["kind"] == "ConfigMap"]
    floor = {e.name: DnsServers(floor_dns(spec)[e.name], e.engine.port, e.autoscaling.max_replicas)
             for e in spec.endpoints if e.tier in ("dedicated_only", "floor_plus_burst")}
    canary = {n: DnsServers(h, spec.endpoint(n).engine.port, spec.endpoint(n).autoscaling.max_replicas)
              for n, h in candidate_dns(spec).items()}
    expected = render_gateway_config(spec, burst_urls={k: URLS[k] for k in ("assist", "autocomplete")},
                                     floor_servers=floor, canary_servers=canary,
                                     lua_path=f"/usr/local/etc/haproxy/{LUA_FILE}",
                                     gateway_replicas=2,
                                     quality_servers=DnsServers(RECORDER.rsplit(":", 1)[0], 8080, 1))
    assert cm["data"] == expected.files


def test_an_input_that_leaves_the_gateway_as_it_was_does_not_roll_its_pods(planned_stacks):
    """A dated price update changes the inputs (and their hash) but not how the gateway routes: the config text,
    whose hash the pod template carries, must stay the same, or every price bump restarts the gateway's pods."""
    from topology import plan

    inputs, spec = planned_stacks["prod"]
    prices = inputs.prices.model_copy(update={"platform_fixed_usd_per_month":
                                              inputs.prices.platform_fixed_usd_per_month + 1.0})
    spec2 = plan(inputs.model_copy(update={"prices": prices}))
    assert spec2.inputs_sha256 != spec.inputs_sha256
    assert [e.tier for e in spec2.endpoints] == [e.tier for e in spec.endpoints]

    def cfg(s):
        floor = {e.name: DnsServers(floor_dns(s)[e.name], e.engine.port, e.autoscaling.max_replicas)
                 for e in s.endpoints if e.tier in ("dedicated_only", "floor_plus_burst")}
        canary = {n: DnsServers(h, s.endpoint(n).engine.port, s.endpoint(n).autoscaling.max_replicas)
                  for n, h in candidate_dns(s).items()}
        return render_gateway_config(s, burst_urls={k: URLS[k] for k in ("assist", "autocomplete")},
                                     floor_servers=floor, canary_servers=canary,
                                     lua_path=f"/usr/local/etc/haproxy/{LUA_FILE}", gateway_replicas=2,
                                     quality_servers=DnsServers(RECORDER.rsplit(":", 1)[0], 8080, 1)).files

    assert cfg(spec2) == cfg(spec)


def test_deployment_replicated_pinned_and_secrets_referenced(prod):
    spec, rec = prod
    objs = rec.kubernetes_objects()
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] >= 2
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"] == HAPROXY_IMAGE.tag
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert all("value" not in e for e in container["env"])  # only references, no literal secrets
    assert refs["GW_MODAL_KEY"] == {"name": "modal-proxy-auth", "key": "modal-key"}
    assert refs["GW_ASSIST_GLOBEX_CACHE_SALT"] == {"name": tenant_secret_name("assist"), "key": "globex-cache-salt"}
    assert refs["GW_GUARD_DEFAULT_API_KEY"] == {"name": tenant_secret_name("guard"), "key": "default-api-key"}
    (pdb,) = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    (svc,) = [o for o in objs if o["kind"] == "Service"]
    assert [p["port"] for p in svc["spec"]["ports"]] == [8080, 8081, 8082]
    assert validate_objects(objs) == []


def test_dev_stack_routes_serverless_to_burst_and_skips_managed_api(planned_stacks):
    spec = planned_stacks["dev"][1]
    rec = declare(spec)
    (cm,) = [o for o in rec.kubernetes_objects() if o["kind"] == "ConfigMap"]
    cfg = cm["data"]["haproxy.cfg"]
    assert "frontend fe_assist" in cfg and "default_backend be_assist_burst" in cfg
    assert "fe_autocomplete" not in cfg  # managed_api: clients call the provider, not this gateway
    assert "be_assist_floor" not in cfg


def test_gateway_rejects_missing_wiring(planned_stacks):
    spec = planned_stacks["prod"][1]

    def program():
        Gateway("gateway", GatewayArgs(spec=spec, namespace="serving", floor_services={}, burst_urls={}))

    with pytest.raises(Exception, match="needs floor_services"):
        run_function(program, stack="prod")


def test_haproxy_accepts_the_cluster_config(prod, tmp_path):
    binary = require_haproxy()
    _, rec = prod
    (cm,) = [o for o in rec.kubernetes_objects() if o["kind"] == "ConfigMap"]
    (dep,) = [o for o in rec.kubernetes_objects() if o["kind"] == "Deployment"]
    ca = pod_ca_dir(tmp_path / "ca")  # what the image's CA directory holds
    for name, text in cm["data"].items():
        text = text.replace("/usr/local/etc/haproxy/", f"{tmp_path}/")
        (tmp_path / name).write_text(text.replace(f"ca-file {HAPROXY_IMAGE.ca_dir} ", f"ca-file {ca} "))
    env = {e["name"]: "test-" + e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    out = subprocess.run([binary, "-c", "-f", str(tmp_path / "haproxy.cfg")], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "0 CA were loaded" not in out.stdout + out.stderr
    # and refuses to start when a secret is missing (an empty key would match "Bearer ")
    env.pop("GW_ASSIST_ACME_API_KEY")
    out = subprocess.run([binary, "-c", "-f", str(tmp_path / "haproxy.cfg")], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "acme-api-key" in out.stderr


def test_undeployed_burst_renders_a_serverless_backend_not_an_invented_url(planned_stacks):
    spec = planned_stacks["prod"][1]

    def program():
        Gateway("gateway", GatewayArgs(spec=spec, namespace="serving", floor_services=floor_dns(spec),
                                       canary_services=candidate_dns(spec), **recorder_wiring(spec),
                                       burst_urls={"assist": pulumi.Output.from_input(""),
                                                   "autocomplete": pulumi.Output.from_input(URLS["autocomplete"])}))

    rec = run_function(program, stack="prod")
    (cm,) = [o for o in rec.kubernetes_objects() if o["kind"] == "ConfigMap"]
    cfg = cm["data"]["haproxy.cfg"]
    assert "no Modal URL for assist yet" in cfg
    assert "server burst acme-prod--ac.modal.run:443" in cfg


def test_a_stopping_gateway_pod_keeps_listening_until_the_service_has_dropped_it(prod):
    """SIGUSR1 (the haproxy image's STOPSIGNAL, docker-library/haproxy 3.0/Dockerfile) unbinds the listeners at
    once (HAProxy doc/management.txt, soft-stop), and the kubelet takes the pod out of the Service's endpoints at the
    same moment: kube-proxy and the load balancer keep sending it new connections for seconds, which would be
    refused on every rollout, scale-in and node drain. The pod sleeps first, then soft-stops, and its grace period
    covers the sleep and the longest request (HAProxy's hard-stop-after) with room."""
    spec, rec = prod
    (dep,) = [o for o in rec.kubernetes_objects() if o["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (haproxy,) = pod["containers"]
    sleep_s = haproxy["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert sleep_s >= 5
    cfg = next(o for o in rec.kubernetes_objects() if o["kind"] == "ConfigMap")["data"]["haproxy.cfg"]
    hard_stop = int(next(line.split()[1] for line in cfg.splitlines() if line.strip().startswith("hard-stop-after"))
                    .rstrip("s"))
    assert pod["terminationGracePeriodSeconds"] >= sleep_s + hard_stop + 10


def test_a_new_gateway_pod_takes_clients_only_after_its_floor_servers_can_be_up(prod):
    """The engines admit a gateway pod only once its address is in their NetworkPolicies (the policy controller, then
    each engine node's agent: seconds), and a floor server whose first checks were dropped comes back after `rise`
    passing checks: a pod Ready at once sent its first clients to DOWN floors (burst or 503). Its readiness waits the
    checks' rise and a few seconds of programming more."""
    spec, rec = prod
    (dep,) = [o for o in rec.kubernetes_objects() if o["kind"] == "Deployment"]
    (haproxy,) = dep["spec"]["template"]["spec"]["containers"]
    cfg = next(o for o in rec.kubernetes_objects() if o["kind"] == "ConfigMap")["data"]["haproxy.cfg"]
    rises = [int(m[1]) * int(m[2]) / 1000 for m in re.finditer(r"check inter (\d+) fall \d+ rise (\d+)", cfg)]
    assert rises
    assert haproxy["readinessProbe"]["initialDelaySeconds"] >= max(rises) + 5
    assert "initialDelaySeconds" not in haproxy["livenessProbe"] or \
        haproxy["livenessProbe"]["initialDelaySeconds"] <= haproxy["readinessProbe"]["initialDelaySeconds"]


def test_a_new_gateway_config_is_a_new_configmap_mounted_by_the_new_pods_only(planned_stacks):
    """Named by its content and immutable: a config change creates a new ConfigMap beside the old (Pulumi creates a
    replacement under another name before deleting the old), the Deployment's pods roll onto it, and the old pods
    keep the file they started with. Under one fixed name the data change deleted and recreated it, and the kubelet
    wrote the new file into the running pods' volume."""
    spec = planned_stacks["prod"][1]

    def config_map_and_pods(rec):
        (cm,) = [o for o in rec.kubernetes_objects() if o["kind"] == "ConfigMap"]
        (dep,) = [o for o in rec.kubernetes_objects() if o["kind"] == "Deployment"]
        (vol,) = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
        return cm, vol["configMap"]["name"]

    cm, mounted = config_map_and_pods(declare(spec))
    assert cm["immutable"] is True and mounted == cm["metadata"]["name"]
    assert cm["metadata"]["name"].startswith("gateway-haproxy-")
    again, _ = config_map_and_pods(declare(spec))
    assert again["metadata"]["name"] == cm["metadata"]["name"]  # the same config keeps its name: nothing rolls
    changed = spec.model_copy(update={"endpoints": tuple(
        e.model_copy(update={"gateway": e.gateway.model_copy(update={"retry_after_s": (e.gateway.retry_after_s or 5) + 7})})
        for e in spec.endpoints)})
    other, other_mounted = config_map_and_pods(declare(changed))
    assert other["data"] != cm["data"], "the change must reach the rendered config for this test to mean anything"
    assert other["metadata"]["name"] != cm["metadata"]["name"] and other_mounted == other["metadata"]["name"]
