"""The policy pack (policies/): each policy passes on every bundled stack and fails on a broken resource.

Policies are exercised the way `pulumi preview --policy-pack policies` runs them: the pulumi-policy objects'
`validate(args, report_violation)` with the engine's argument types (props behind pulumi-policy's
unknown-checking proxy, secrets unwrapped, the default AWS provider's props from the stack's aws:* config,
the stack's config readable through pulumi.runtime). Inputs are those recorded from each bundled stack
under Pulumi's mocks (offline/mockrun.py).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

import pulumi.runtime
import pytest
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyProviderResource,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from offline.mockrun import RecordedResource, Recording, read_stack_config
from policies import rules
from policies.pack import POLICIES
from policies.recorded import check_recording, default_aws_provider
from pulumi_support import ROOT, recording

STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
POLICY = {p.name: p for p in POLICIES}


def stack_config(stack: str) -> dict[str, Any]:
    return read_stack_config(ROOT / "stacks" / f"Pulumi.{stack}.yaml")[1]


def _set_stack_config(config: Mapping[str, Any]) -> None:
    """The stack config as the engine hands it to a pack: plain strings, secrets decrypted and not marked as secret
    (pulumi's analyzer plugin passes PULUMI_CONFIG only); which were secret, the stack file says (run_policy)."""
    secure = [k for k, v in config.items() if isinstance(v, Mapping) and set(v) == {"secure"}]
    pulumi.runtime.set_all_config(
        {k: ("decrypted" if k in secure else v if isinstance(v, str) else json.dumps(v)) for k, v in config.items()},
        [],
    )


def _opts(r: RecordedResource) -> PolicyResourceOptions:
    return PolicyResourceOptions(r.protect, list(r.ignore_changes), None, [], PolicyCustomTimeouts(0, 0, 0), [], r.parent or None)


def _provider(r: RecordedResource, by_urn: Mapping[str, RecordedResource], config: Mapping[str, Any]) -> PolicyProviderResource | None:
    """The provider the engine reports: an explicit one, or the default AWS provider built from aws:* config."""
    if r.provider:
        p = by_urn.get(r.provider.rsplit("::", 1)[0])
        return PolicyProviderResource(p.type, unknown_checking_proxy(copy.deepcopy(p.inputs)), p.urn, p.name) if p else None
    if r.type.startswith("aws:"):
        props = {k: ("decrypted" if v == "[secret]" else v) for k, v in default_aws_provider(config).items()}
        return PolicyProviderResource("pulumi:providers:aws", unknown_checking_proxy(props),
                                      "urn:pulumi:test::llm-serving::pulumi:providers:aws::default_7_0_0", "default_7_0_0")
    return None


def run_policy(name: str, resources: list[RecordedResource], config: Mapping[str, Any],
               policy_config: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """(urn, message) for every violation the named policy reports, as the pack would."""
    from unittest import mock

    import policies.pack

    policy = POLICY[name]
    _set_stack_config(config)
    by_urn = {r.urn: r for r in resources}
    found: list[tuple[str, str]] = []
    # the stack file holds this config as `pulumi config set` left it ({secure: …} for a secret)
    with mock.patch.object(policies.pack, "stack_file_config", lambda *a, **k: dict(config)):
        _validate(policy, resources, by_urn, config, policy_config, found)
    return found


def _validate(policy, resources, by_urn, config, policy_config, found) -> None:
    if isinstance(policy, ResourceValidationPolicy):
        for r in resources:
            args = ResourceValidationArgs(r.type, unknown_checking_proxy(copy.deepcopy(r.inputs)), r.urn, r.name,
                                          _opts(r), _provider(r, by_urn, config), dict(policy_config or {}))
            policy.validate(args, lambda msg, urn=None, _u=r.urn: found.append((_u, msg)))
    else:
        assert isinstance(policy, StackValidationPolicy)
        prs = {r.urn: PolicyResource(r.type, unknown_checking_proxy(copy.deepcopy(r.inputs)), r.urn, r.name, _opts(r),
                                     _provider(r, by_urn, config), None, [], {}) for r in resources}
        for r in resources:
            prs[r.urn].parent = prs.get(r.parent)
        policy.validate(StackValidationArgs(list(prs.values()), dict(policy_config or {})),
                        lambda msg, urn=None: found.append((urn or "", msg)))


def resources(stack: str) -> list[RecordedResource]:
    return copy.deepcopy(recording(stack).resources)


def edit(res: list[RecordedResource], pick: Callable[[RecordedResource], bool],
         change: Callable[[dict[str, Any]], Any], **fields: Any) -> RecordedResource:
    """Replace the first resource `pick` matches by a copy whose inputs `change` edits in place."""
    i = next(i for i, r in enumerate(res) if pick(r))
    inputs = copy.deepcopy(res[i].inputs)
    change(inputs)
    res[i] = RecordedResource(**{**res[i].__dict__, "inputs": inputs, **fields})
    return res[i]


def named(name: str) -> Callable[[RecordedResource], bool]:
    return lambda r: r.name == name


def container(inputs: dict[str, Any], name: str = "vllm") -> dict[str, Any]:
    return next(c for c in inputs["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def k8s(kind: str, name: str, body: dict[str, Any], api: str = "v1", group: str = "core") -> RecordedResource:
    obj = {"apiVersion": api if group == "core" else f"{group}/{api}", "kind": kind,
           "metadata": {"name": name, "namespace": "llm-serving"}, **body}
    return RecordedResource(type=f"kubernetes:{group}/{api}:{kind}", name=name,
                            urn=f"urn:pulumi:test::llm-serving::kubernetes:{group}/{api}:{kind}::{name}", parent="",
                            custom=True, protect=False, provider="", dependencies=(), ignore_changes=(), inputs=obj)


# ── every policy passes on every bundled stack ────────────────────────────────────────────────────

@pytest.mark.parametrize("name", [
    r.name for r in rules.RULES
])
def test_policy_passes_on_every_bundled_stack(name):
    for stack in STACKS:
        assert run_policy(name, resources(stack), stack_config(stack)) == [], stack


def test_the_pack_has_every_rule_at_the_issue_level():
    assert [p.name for p in POLICIES] == [r.name for r in rules.RULES]
    advisory = {p.name for p in POLICIES if p.enforcement_level == EnforcementLevel.ADVISORY}
    # serving-pods-admit-only-their-clients: advisory, since llm-serving:networkPolicy.enabled false is a stated
    # choice (a cluster whose mesh or CNI admits connections by its own rules)
    assert advisory == {"morning-floor-before-demand-rise", "right-size-before-platform",
                        "serving-pods-admit-only-their-clients"}
    assert all(p.enforcement_level == EnforcementLevel.MANDATORY for p in POLICIES if p.name not in advisory)


@pytest.mark.parametrize("stack", STACKS)
def test_offline_checks_and_the_pack_find_the_same_violations(stack):
    rec = recording(stack)
    offline = {(v.policy, v.message) for v in check_recording(rec, stack_config(stack))}
    packed = {(name, m) for name in POLICY for _u, m in run_policy(name, resources(stack), stack_config(stack))}
    # the default provider is named by its URN in the pack and "the default AWS provider" offline
    norm = lambda pairs: {(p, m.split(" has no region")[1] if " has no region" in m else m) for p, m in pairs}  # noqa: E731
    assert norm(offline) == norm(packed)


# ── each policy fails on a deliberately broken resource ──────────────────────────────────────────

def test_gpu_utilisation_trigger_is_refused():
    res = resources("prod")
    so = edit(res, named("floor-assist-scaled-object"),
              lambda i: i["spec"]["triggers"][0]["metadata"].update(query="avg(DCGM_FI_DEV_GPU_UTIL{pod=~\"assist-.*\"})"))
    found = run_policy("no-gpu-utilisation-autoscaling", res, stack_config("prod"))
    assert [u for u, _ in found] == [so.urn]
    assert "scales on GPU utilisation" in found[0][1] and "vllm:num_requests_waiting" in found[0][1]
    hpa = k8s("HorizontalPodAutoscaler", "x", {"spec": {"metrics": [{"type": "Pods", "pods": {
        "metric": {"name": "nvidia_gpu_duty_cycle"}, "target": {"type": "AverageValue", "averageValue": "80"}}}]}},
        api="v2", group="autoscaling")
    assert run_policy("no-gpu-utilisation-autoscaling", [hpa], {})[0][0] == hpa.urn


@pytest.mark.parametrize("breakage, expected", [
    (lambda i: container(i)["command"].__setitem__(slice(None), [a for a in container(i)["command"] if a not in ("--max-model-len", "16384")]),
     "runs vLLM without --max-model-len"),
    (lambda i: container(i).__setitem__("readinessProbe", {"httpGet": {"path": "/health", "port": "http"}}),
     "readiness probe is a httpGet check"),
    (lambda i: container(i).pop("readinessProbe"), "has no readiness probe"),
    (lambda i: (container(i)["command"].__setitem__(2, "meta-llama/Llama-3.3-70B-Instruct"),
                container(i).__setitem__("env", [e for e in container(i)["env"] if e["name"] != "HF_HUB_OFFLINE"])),
     "can reach a model hub at boot (HF_HUB_OFFLINE is not '1'; it serves 'meta-llama/Llama-3.3-70B-Instruct'"),
])
def test_vllm_container_breakages_are_refused(breakage, expected):
    res = resources("prod")
    dep = edit(res, named("floor-assist-deployment"), breakage)
    found = run_policy("vllm-container-safety", res, stack_config("prod"))
    assert [u for u, _ in found] == [dep.urn]
    assert expected in found[0][1]


def test_a_readiness_script_that_only_checks_health_is_refused():
    res = resources("prod")
    edit(res, named("floor-assist-scripts"), lambda i: i["data"].update(
        {"warmup_probe.py": "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:8000/health')\n"}))
    found = run_policy("vllm-container-safety", res, stack_config("prod"))
    # every assist Deployment mounts that script: the stable floor and the rollout's candidate track
    assert found and all("sends no generation request" in m for _u, m in found)
    mounting = {r.urn for r in res if r.name.startswith("floor-assist-") and r.type == "kubernetes:apps/v1:Deployment"}
    assert {u for u, _m in found} == mounting and next(r.urn for r in res if r.name == "floor-assist-deployment") in mounting


@pytest.mark.parametrize("field, value, expected", [
    ("engine", {"max_model_len": None}, "runs vLLM with max_model_len=None"),
    ("burst", {"volume_name": None}, "has no weights volume filled from the region-local bucket"),
])
def test_a_burst_engine_without_max_model_len_or_local_weights_is_refused(field, value, expected):
    res = resources("dev")

    def change(i):
        spec = json.loads(i["environment"]["LLM_SERVING_BURST_SPEC"])
        spec[field].update(value)
        i["environment"]["LLM_SERVING_BURST_SPEC"] = json.dumps(spec)

    cmd = edit(res, named("assist-burst-deploy"), change)
    found = run_policy("vllm-container-safety", res, stack_config("dev"))
    assert [u for u, _ in found] == [cmd.urn] and expected in found[0][1]


def test_a_tenant_without_cache_salt_on_a_shared_prefix_cache_is_refused():
    res = resources("dev")  # dev's assist endpoint serves tenants acme and globex
    cm = edit(res, named("gateway-config"), lambda i: i["data"].update(
        {"haproxy.cfg": i["data"]["haproxy.cfg"].replace("lua.llm_gate 2048 GW_ASSIST_GLOBEX_CACHE_SALT", "lua.llm_gate 2048 -")}))
    found = run_policy("prefix-cache-tenant-isolation", res, stack_config("dev"))
    assert [u for u, _ in found] == [cm.urn]
    assert "frontend fe_assist serves tenants acme, globex" in found[0][1] and "globex get no cache_salt" in found[0][1]


def test_time_slicing_behind_an_slo_and_an_impossible_mig_layout_are_refused():
    res = resources("prod")
    sharing = k8s("ConfigMap", "time-slicing-config", {"data": {"any": "version: v1\nsharing:\n  timeSlicing:\n"
                                                                      "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"}})
    found = run_policy("gpu-sharing-and-mig", [*res, sharing], stack_config("prod"))
    assert [u for u, _ in found] == [sharing.urn] and "configures GPU timeSlicing sharing" in found[0][1]

    # the public blueprint's A100/H100 layout: 1 + 2 + 3 = 6 compute instances... 3×1 + 1×2 + 1×3 = 8 compute slices
    edit(res, named("gpu-operator-mig-parted-config"), lambda i: i["data"].update({"config.yaml": i["data"]["config.yaml"].replace(
        "1g.10gb: 7", "1g.10gb: 3\n      2g.20gb: 1\n      3g.40gb: 1")}))
    found = run_policy("gpu-sharing-and-mig", res, stack_config("prod"))
    assert {u.rsplit("::", 1)[-1] for u, _ in found} == {"pool-guard-on-demand-node-group", "pool-guard-reserved-node-group"}
    assert all("needs 8 compute slices (max 7)" in m for _u, m in found)


@pytest.mark.parametrize("pick, change, fields, expected", [
    ("weights-us-east-1-versioning", lambda i: i["versioningConfiguration"].update(status="Suspended"), {}, "versioning is not Enabled"),
    ("weights-us-east-1-encryption", lambda i: i.update(rules=[]), {}, "no default encryption"),
    ("weights-us-east-1-public-access-block", lambda i: i.update(restrictPublicBuckets=False), {}, "public access is not fully blocked"),
    ("weights-us-east-1-tls-only", lambda i: i.update(policy=json.dumps({"Statement": []})), {}, "plain-HTTP access is not denied"),
    ("weights-us-east-1-bucket", lambda i: None, {"protect": False}, "the bucket is not protected"),
    ("weights-us-east-1-lifecycle", lambda i: i["rules"].append(
        {"id": "tidy", "status": "Enabled", "filter": {"prefix": "models/"}, "expiration": {"days": 90}}), {},
     "lifecycle rule(s) tidy expire objects"),
])
def test_weight_bucket_weaknesses_are_refused(pick, change, fields, expected):
    res = resources("prod")
    edit(res, named(pick), change, **fields)
    found = run_policy("weight-bucket-protection", res, stack_config("prod"))
    assert len(found) == 1 and found[0][1].startswith("weight bucket llm-serving-prod-weights-us-east-1: ")
    assert expected in found[0][1]
    assert found[0][0] == next(r.urn for r in res if r.name == "weights-us-east-1-bucket")


def test_weight_bucket_parts_are_linked_in_a_preview_where_the_bucket_name_is_unknown():
    res = resources("prod")
    for n in ("weights-us-east-1-versioning", "weights-us-east-1-encryption", "weights-us-east-1-public-access-block",
              "weights-us-east-1-tls-only", "weights-us-east-1-lifecycle"):
        edit(res, named(n), lambda i: i.update(bucket=UNKNOWN_STRING_VALUE))
    assert run_policy("weight-bucket-protection", res, stack_config("prod")) == []


def test_weight_caches_abort_an_interrupted_seed_s_uploads_and_expire_nothing():
    """A seed killed mid-copy leaves its parts billed until the upload is aborted (ops/seed_weights.py resumes one
    within the window); nothing else in the bucket expires."""
    for stack in STACKS:
        caches = [r for r in resources(stack) if r.type == "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"]
        assert caches, stack
        for lc in caches:
            [rule] = lc.inputs["rules"]
            assert rule["status"] == "Enabled" and rule["filter"] == {}  # every key
            assert rule["abortIncompleteMultipartUpload"] == {"daysAfterInitiation": 7}
            assert not {"expiration", "noncurrentVersionExpiration", "transitions"} & set(rule)


def test_a_burst_app_without_proxy_auth_is_refused():
    res = resources("prod")

    def no_auth(i):
        spec = json.loads(i["environment"]["LLM_SERVING_BURST_SPEC"])
        spec["burst"]["requires_proxy_auth"] = False
        i["environment"]["LLM_SERVING_BURST_SPEC"] = json.dumps(spec)

    cmd = edit(res, named("assist-burst-deploy"), no_auth)
    found = run_policy("modal-burst-proxy-auth", res, stack_config("prod"))
    assert [u for u, _ in found] == [cmd.urn]
    assert "requires_proxy_auth=False" in found[0][1] and "requires_proxy_auth=True" in found[0][1]


def test_credentials_outside_secret_config_are_refused():
    res = resources("prod")
    dep = edit(res, named("gateway-deployment"), lambda i: container(i, "haproxy")["env"].append(
        {"name": "MODAL_TOKEN_SECRET", "value": "as-0123456789abcdef0123"}))
    config = {**stack_config("prod"), "llm-serving:modalTokenSecret": "as-0123456789abcdef0123",
              "aws:secretKey": {"secure": "v1:abc"}}
    found = run_policy("credentials-from-secret-config", res, config)
    assert sorted(u for u, _ in found) == sorted(["", dep.urn])
    messages = dict(found)
    assert "stack config llm-serving:modalTokenSecret holds a credential in plain text" in messages[""]
    assert "pulumi config set --secret modalTokenSecret" in messages[""]
    assert "sets MODAL_TOKEN_SECRET as a literal value" in messages[dep.urn]
    # offline, a plain (unmarked) token in a command's environment is visible too
    cmd = edit(res, named("assist-burst-deploy"), lambda i: i["environment"].update(MODAL_TOKEN_ID="ak-0123456789abcdef0123"))
    offline = [v for v in check_recording(Recording("prod", res), stack_config("prod"))
               if v.policy == "credentials-from-secret-config"]
    assert any(v.urn == cmd.urn and "gets MODAL_TOKEN_ID as a plain value" in v.message for v in offline)


def test_a_gpu_pod_without_cpu_and_memory_requests_is_refused_and_one_with_them_passes():
    res = resources("prod")

    def requests(cpu_mem: dict[str, str]):
        def change(i):
            c = container(i)
            c["resources"] = {"requests": {"nvidia.com/gpu": "2", **cpu_mem}, "limits": {"nvidia.com/gpu": "2"}}
        return change

    dep = edit(res, named("floor-assist-deployment"), requests({}))
    found = [f for f in run_policy("gpu-pod-cpu-memory-requests", res, stack_config("prod")) if f[0] == dep.urn]
    assert len(found) == 1 and "requests no cpu and no memory" in found[0][1] and "BestEffort" in found[0][1]
    edit(res, named("floor-assist-deployment"), requests({"cpu": "16", "memory": "200Gi"}))
    assert not [f for f in run_policy("gpu-pod-cpu-memory-requests", res, stack_config("prod")) if f[0] == dep.urn]


def test_run_as_non_root_without_a_numeric_user_is_refused_and_with_one_passes():
    res = resources("prod")
    sc = {"runAsNonRoot": True, "allowPrivilegeEscalation": False}
    dep = edit(res, named("gateway-deployment"), lambda i: container(i, "haproxy").__setitem__("securityContext", dict(sc)))
    found = run_policy("run-as-non-root-numeric-user", res, stack_config("prod"))
    assert [u for u, _ in found] == [dep.urn] and "without a numeric non-zero runAsUser (got None)" in found[0][1]
    edit(res, named("gateway-deployment"), lambda i: container(i, "haproxy").__setitem__("securityContext", {**sc, "runAsUser": 99}))
    assert run_policy("run-as-non-root-numeric-user", res, stack_config("prod")) == []


def _without_monitoring(res: list[RecordedResource], config: Mapping[str, Any]):
    """The stack as if it neither installed nor stated the Prometheus Operator."""
    res = [r for r in res if r.inputs.get("chart") not in ("kube-prometheus-stack", "prometheus-operator-crds")]
    # neither listed nor run by the platform: the stack says it installs monitoring itself
    return res, {**{k: v for k, v in config.items() if k != rules.PLATFORM_PROVIDES_KEY}, rules.MONITORING_KEY: "install"}


def test_a_custom_resource_without_a_definition_is_refused_unless_the_stack_or_platform_provides_it():
    res, config = _without_monitoring(resources("prod"), stack_config("prod"))
    found = run_policy("custom-resources-have-definitions", res, config)
    kinds = {u.rsplit("::", 1)[-1] for u, _ in found}
    assert {f"floor-{e}-pod-monitor" for e in ("assist", "autocomplete", "guard")} <= kinds
    assert all("custom resource of API group monitoring.coreos.com" in m and "llm-serving:platformProvides" in m
               for _u, m in found)
    stated = {**config, rules.PLATFORM_PROVIDES_KEY: ["monitoring.coreos.com"]}
    assert run_policy("custom-resources-have-definitions", res, stated) == []
    # KEDA's ScaledObjects are covered by the keda Helm release in the stack; without it they are refused
    found = run_policy("custom-resources-have-definitions", [r for r in res if r.name != "keda-release"], stated)
    assert {u.rsplit("::", 1)[-1] for u, _ in found} == {f"floor-{e}-scaled-object" for e in ("assist", "autocomplete", "guard")}
    assert all("API group keda.sh" in m for _u, m in found)
    # the stack installing the Prometheus Operator satisfies it too, unless the chart's CRDs are turned off
    kps = RecordedResource(type="kubernetes:helm.sh/v3:Release", name="monitoring", urn="urn:x::monitoring", parent="",
                           custom=True, protect=False, provider="", dependencies=(), ignore_changes=(),
                           inputs={"chart": "kube-prometheus-stack", "name": "monitoring", "values": {}})
    assert run_policy("custom-resources-have-definitions", [*res, kps], config) == []
    kps.inputs["values"] = {"crds": {"enabled": False}}
    assert run_policy("custom-resources-have-definitions", [*res, kps], config)
    # `monitoring: platform` (the program's own setting) states that the platform runs the Prometheus Operator
    assert run_policy("custom-resources-have-definitions", res, {**config, rules.MONITORING_KEY: "platform"}) == []


def _default_provider_only(res: list[RecordedResource]) -> list[RecordedResource]:
    return [RecordedResource(**{**r.__dict__, "provider": "" if r.type.startswith("aws:") else r.provider})
            for r in res if r.type != "pulumi:providers:aws"]


def test_an_aws_provider_without_a_region_is_refused_and_aws_region_config_satisfies_it():
    res = _default_provider_only(resources("dev"))
    config = {k: v for k, v in stack_config("dev").items() if k != "aws:region"}
    found = run_policy("aws-provider-region", res, config)
    n_aws = sum(r.type.startswith("aws:") for r in res)
    assert len(found) == 1 and f"AWS provider default_7_0_0 has no region ({n_aws} resources use it" in found[0][1]
    assert "pulumi config set aws:region" in found[0][1]
    assert run_policy("aws-provider-region", res, {**config, "aws:region": "us-east-1"}) == []
    explicit = RecordedResource(type="pulumi:providers:aws", name="use1", urn="urn:x::pulumi:providers:aws::use1", parent="",
                                custom=True, protect=False, provider="", dependencies=(), ignore_changes=(), inputs={})
    found = run_policy("aws-provider-region", [*res, explicit], {**config, "aws:region": "us-east-1"})
    assert [u for u, _ in found] == [explicit.urn]


def _with_burst_schedule(res: list[RecordedResource], windows: list[tuple[int, int, int]],
                         name: str = "guard-burst-deploy") -> RecordedResource:
    def change(i):
        spec = json.loads(i["environment"]["LLM_SERVING_BURST_SPEC"])
        spec["burst"]["min_containers"] = 0
        spec["burst"]["min_containers_schedule"] = [
            {"start_minute_of_week": s, "end_minute_of_week": e, "min_containers": n} for s, e, n in windows]
        i["environment"]["LLM_SERVING_BURST_SPEC"] = json.dumps(spec)
    return edit(res, named(name), change)


WEEKDAYS_8_TO_18 = [(d * 1440 + 480, d * 1440 + 1080, 1) for d in range(5)]


def test_a_burst_only_endpoint_warmed_after_7am_gets_the_advisory():
    res = resources("dev")  # dev's guard endpoint is burst-only: its warm containers are its whole floor
    cmd = _with_burst_schedule(res, WEEKDAYS_8_TO_18)  # zero at 07:00, up at 08:00
    found = run_policy("morning-floor-before-demand-rise", res, stack_config("dev"))
    assert [u for u, _ in found] == [cmd.urn]
    assert "endpoint guard" in found[0][1] and "Monday 08:00, Tuesday 08:00" in found[0][1] and "Friday 08:00" in found[0][1]
    # from 06:30 the floor is up before the rise: nothing to say; a policy config can move the rise
    _with_burst_schedule(res, [(d * 1440 + 390, d * 1440 + 1080, 1) for d in range(5)])
    assert run_policy("morning-floor-before-demand-rise", res, stack_config("dev")) == []
    assert run_policy("morning-floor-before-demand-rise", res, stack_config("dev"), {"demandRiseLocalHour": 6})


def test_a_dedicated_floor_covers_a_cold_burst_app():
    res = resources("prod")
    _with_burst_schedule(res, WEEKDAYS_8_TO_18, name="assist-burst-deploy")
    edit(res, named("floor-assist-scaled-object"), lambda i: i["spec"].update(minReplicaCount=2))
    assert run_policy("morning-floor-before-demand-rise", res, stack_config("prod")) == []
    so = edit(res, named("floor-assist-scaled-object"), lambda i: i["spec"].update(minReplicaCount=0))
    found = run_policy("morning-floor-before-demand-rise", res, stack_config("prod"))
    assert [m for _u, m in found if "endpoint assist" in m and "Monday 08:00" in m]
    assert so.inputs["spec"]["triggers"]  # the queue triggers stay: they only add on top of the floor


def test_an_endpoint_at_two_and_a_half_requests_per_second_on_the_cluster_gets_the_advisory():
    res = resources("prod")
    dep = edit(res, named("floor-assist-deployment"),
               lambda i: i["metadata"]["annotations"].update({rules.RATE_ANNOTATION: "2.5"}))
    found = run_policy("right-size-before-platform", res, stack_config("prod"))
    assert [u for u, _ in found] == [dep.urn] and "averaging 2.5 req/s on dedicated cluster GPUs" in found[0][1]


def test_importing_the_pack_never_starts_a_server():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import policies.pack, policies.rules; print('ok')"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok"
    manifest = (ROOT / "policies" / "PulumiPolicy.yaml").read_text()
    import yaml

    doc = yaml.safe_load(manifest)
    assert doc["runtime"]["name"] == "python" and (ROOT / "policies" / doc["runtime"]["options"]["virtualenv"]).resolve() == (ROOT / ".venv").resolve()
    assert "PolicyPack(" in (ROOT / "policies" / "__main__.py").read_text()
    assert "PolicyPack(" not in (ROOT / "policies" / "pack.py").read_text().replace("`PolicyPack`", "")



def test_the_pack_runs_as_pulumi_starts_it_and_reports_over_grpc():
    """`python -m pulumi.policy <engine> .` in policies/ (what pulumi-analyzer-policy-python runs): the pack
    serves the analyzer protocol; a broken resource gets the policy's message at its level."""
    import subprocess
    import sys

    import grpc
    from google.protobuf import empty_pb2, struct_pb2
    from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

    # as the engine starts it for `pulumi preview -s prod`: every config value decrypted in PULUMI_CONFIG (the Modal
    # tokens a workflow sets as secrets among them), the stack's name beside it
    config = {"llm-serving:platformProvides": '["monitoring.coreos.com"]',
              "llm-serving:modalTokenId": "ak-decrypted", "llm-serving:modalTokenSecret": "as-decrypted"}
    env = {"PATH": "/usr/bin:/bin", "PULUMI_CONFIG": json.dumps(config), "PULUMI_STACK": "prod",
           "PULUMI_PROJECT": "llm-serving", "PULUMI_DRY_RUN": "true"}
    proc = subprocess.Popen([sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", "."], cwd=ROOT / "policies",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        port = int(proc.stdout.readline().strip())  # the pack prints its port first, as the engine expects
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = analyzer_pb2_grpc.AnalyzerStub(channel)
            info = stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=20)
            assert info.name == "llm-serving-doctrine"
            levels = {p.name: p.enforcementLevel for p in info.policies}
            assert set(levels) == {r.name for r in rules.RULES}
            assert levels["right-size-before-platform"] == analyzer_pb2.ADVISORY
            assert levels["no-gpu-utilisation-autoscaling"] == analyzer_pb2.MANDATORY
            schemas = {p.name: dict(p.configSchema.properties) for p in info.policies}
            assert set(schemas["morning-floor-before-demand-rise"]) == {"demandRiseLocalHour"}
            assert set(schemas["right-size-before-platform"]) == {"rightSizeBelowRequestsPerS"}

            so = copy.deepcopy(next(r for r in recording("prod").resources if r.name == "floor-assist-scaled-object"))
            so.inputs["spec"]["triggers"][0]["metadata"]["query"] = "avg(DCGM_FI_DEV_GPU_UTIL)"
            props = struct_pb2.Struct()
            props.update(so.inputs)
            resp = stub.Analyze(analyzer_pb2.AnalyzeRequest(type=so.type, properties=props, urn=so.urn, name=so.name),
                                timeout=20)
            (diag,) = resp.diagnostics
            assert diag.policyName == "no-gpu-utilisation-autoscaling" and diag.enforcementLevel == analyzer_pb2.MANDATORY
            assert "scales on GPU utilisation" in diag.message

            # a stack check sees the stack config: the PodMonitors pass because the platform provides the operator
            stack = [analyzer_pb2.AnalyzerResource(type=r.type, urn=r.urn, name=r.name, properties=_struct(r.inputs))
                     for r in recording("prod").resources if r.type.startswith("kubernetes:monitoring.coreos.com")]
            resp = stub.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=stack), timeout=20)
            assert not [d for d in resp.diagnostics if d.policyName == "custom-resources-have-definitions"]
            # secrets arrive decrypted and unmarked: the credential rule reads the stack file, which holds no
            # plain-text token (judging by the runtime's is_config_secret, it failed every preview and up here)
            assert not [d for d in resp.diagnostics if d.policyName == "credentials-from-secret-config"], \
                [d.message for d in resp.diagnostics]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _struct(value: dict[str, Any]):
    from google.protobuf import struct_pb2

    s = struct_pb2.Struct()
    s.update(value)
    return s


def test_the_live_packs_credential_rule_judges_the_stack_file_not_the_decrypted_config(tmp_path):
    """The engine gives a policy pack every config value decrypted, without saying which were secret; the stack
    file does: `{secure: …}` for `pulumi config set --secret`. A token in plain text there is reported; a secret
    one, one set only for this run, or a stack whose file cannot be found is not."""
    import yaml

    from policies.pack import plain_credential_keys, stack_file_config

    (tmp_path / "Pulumi.yaml").write_text("name: llm-serving\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.prod.yaml").write_text(yaml.safe_dump({"config": {
        "llm-serving:modalTokenId": {"secure": "v1:abc"}, "llm-serving:modalTokenSecret": "as-plain-text",
        "aws:region": "us-east-1"}}))
    config = stack_file_config("prod", tmp_path)
    set_now = {"llm-serving:modalTokenId", "llm-serving:modalTokenSecret", "aws:accessKey"}
    assert plain_credential_keys(set_now.__contains__, config) == ("llm-serving:modalTokenSecret",)
    assert plain_credential_keys(set_now.__contains__, stack_file_config("organisation/prod", tmp_path)) == (
        "llm-serving:modalTokenSecret",)  # a fully qualified stack name
    assert stack_file_config("staging", tmp_path) is None
    assert plain_credential_keys(set_now.__contains__, {}) == ()
    # the bundled stacks keep no token at all
    assert plain_credential_keys(lambda k: True, stack_file_config("prod")) == ()


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_no_policy_raises_on_objects_wholly_unknown_in_a_preview(stack):
    """In a preview where a Modal deploy runs, the gateway's ConfigMap `data` (rendered from the burst URL, the
    deploy command's output) is unknown as a whole: the engine sends it as one sentinel (pulumi
    sdk/go/common/resource/plugin/rpc.go marshalUnknownProperty), and a rule reading it as a mapping raised,
    which stops the engine's analysis and fails the preview (pulumi-policy 1.21 catches only UnknownValueError).
    Every policy runs on a stack whose ConfigMaps' data, every object's spec and every container's env are
    wholly unknown, without raising."""
    res = resources(stack)
    for r in res:
        if r.type == "kubernetes:core/v1:ConfigMap":
            edit(res, lambda x, r=r: x is r, lambda i: i.update(data=UNKNOWN_STRING_VALUE))
    for name in POLICY:
        run_policy(name, res, stack_config(stack))  # raises on a bad read
    res = resources(stack)
    for r in res:
        if isinstance(r.inputs.get("spec"), dict):
            edit(res, lambda x, r=r: x is r, lambda i: i.update(spec=UNKNOWN_STRING_VALUE))
        if isinstance(r.inputs.get("environment"), dict):
            edit(res, lambda x, r=r: x is r, lambda i: i.update(environment=UNKNOWN_STRING_VALUE))
    for name in POLICY:
        run_policy(name, res, stack_config(stack))
