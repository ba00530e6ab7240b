"""The serving doctrine as plain checks over declared resources: no Pulumi, no policy server.

Each check takes a `Resource` (type token, name, URN, inputs, options) or the list of them plus the stack's
`StackContext`, and returns the violations it finds as messages that say what to change. `policies/pack.py`
wraps them in pulumi-policy objects for `pulumi preview --policy-pack policies`; `offline/render.py` runs the
same `RULES` over what the mock run recorded. One rule set, two ways in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from topology.catalog import GPU_KINDS, MigLayoutError, validate_mig_layout
from topology.errors import InputError

MANDATORY = "mandatory"
ADVISORY = "advisory"
Level = Literal["mandatory", "advisory"]

UNKNOWN = "<unknown during preview>"  # what an input computed from another resource's output reads as in preview


def _map(v: Any) -> Mapping:
    """v if it is a mapping, else {}: a whole object unknown during preview (a ConfigMap's `data` rendered from
    another resource's output) arrives as the UNKNOWN string, and reading it as a mapping raised, which stops the
    engine's analysis and fails the preview."""
    return v if isinstance(v, Mapping) else {}


def _seq(v: Any) -> list:
    """v if it is a list, else [] (a whole list unknown during preview arrives as the UNKNOWN string)."""
    return v if isinstance(v, list) else []
SECRET_MARKER = "[secret]"  # what the offline recording holds in place of a secret value (offline/mockrun.py)
BURST_SPEC_ENV = "LLM_SERVING_BURST_SPEC"  # modal_apps/settings.py ENV_SPEC: the burst app's settings
PLATFORM_PROVIDES_KEY = "llm-serving:platformProvides"  # stack setting: API groups the cluster already serves
MONITORING_KEY = "llm-serving:monitoring"  # stack setting: 'install' kube-prometheus-stack or the 'platform' runs it
CLUSTER_KEY = "llm-serving:cluster"
PROMETHEUS_OPERATOR_GROUP = "monitoring.coreos.com"


def platform_groups(provides: Iterable[str], monitoring: Any, cluster: Any) -> frozenset[str]:
    """API groups the platform serves: those listed, plus the Prometheus Operator's where the stack says the
    platform runs monitoring (`monitoring: platform`, the program's default for an existing cluster)."""
    if not isinstance(provides, (list, tuple, set, frozenset)) or not all(isinstance(g, str) and g.strip()
                                                                          for g in provides):
        # `platformProvides: 5` ended the render in a TypeError; `[null]` became the group "None"
        raise InputError(f"llm-serving:platformProvides = {provides!r:.80}: a list of API group names, e.g. "
                         "[monitoring.coreos.com]")
    groups = {str(g) for g in provides}
    mode = cluster.get("mode") if isinstance(cluster, Mapping) else None
    if (monitoring or ("install" if mode == "create" else "platform")) == "platform":
        groups.add(PROMETHEUS_OPERATOR_GROUP)
    return frozenset(groups)


@dataclass(frozen=True)
class Resource:
    """One declared resource as a check sees it."""

    type: str
    name: str
    urn: str
    props: Mapping[str, Any]
    protect: bool = False
    parent_type: str = ""
    parent_urn: str = ""
    # inputs of the provider the resource is declared with; None when the provider is not visible
    provider_props: Mapping[str, Any] | None = None
    provider_urn: str = ""  # "" for the default provider
    # True when secret inputs still carry a marker (the offline recording); pulumi-policy hands checks the
    # plain values, so there a secret cannot be told from a literal and that part is checked on the config
    secrets_marked: bool = False


@dataclass(frozen=True)
class StackContext:
    """What a stack states beyond its resources."""

    # API groups the stack's platform already serves (stack setting llm-serving:platformProvides)
    platform_provides: frozenset[str] = frozenset()
    # config keys holding credentials that are set in plain text (not `pulumi config set --secret`)
    plain_credential_config_keys: tuple[str, ...] = ()
    demand_rise_local_hour: int = 7
    right_size_below_requests_per_s: float = 3.0


@dataclass(frozen=True)
class Violation:
    policy: str
    level: Level
    urn: str
    message: str


ResourceCheck = Callable[[Resource, StackContext], list[str]]
StackCheck = Callable[[Sequence[Resource], StackContext], list[tuple[str, str]]]


@dataclass(frozen=True)
class Rule:
    name: str
    level: Level
    description: str
    resource_check: ResourceCheck | None = None
    stack_check: StackCheck | None = None

    def run(self, resources: Sequence[Resource], ctx: StackContext) -> list[Violation]:
        found: list[Violation] = []
        if self.resource_check is not None:
            for r in resources:
                found += [Violation(self.name, self.level, r.urn, m) for m in self.resource_check(r, ctx)]
        if self.stack_check is not None:
            found += [Violation(self.name, self.level, urn, m) for urn, m in self.stack_check(resources, ctx)]
        return found


# ── reading Kubernetes objects ────────────────────────────────────────────────────────────────────

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod")


def k8s_kind(r: Resource) -> str:
    return r.type.rsplit(":", 1)[-1] if r.type.startswith("kubernetes:") else ""


def k8s_group(r: Resource) -> str:
    """'kubernetes:monitoring.coreos.com/v1:PodMonitor' → 'monitoring.coreos.com'; core → 'core'."""
    parts = r.type.split(":")
    if len(parts) != 3 or parts[0] != "kubernetes" or "/" not in parts[1]:
        return ""
    return parts[1].rsplit("/", 1)[0]


def k8s_ref(r: Resource) -> str:
    meta = _map(r.props.get("metadata"))
    ns = meta.get("namespace")
    return f"{k8s_kind(r)} {ns + '/' if ns else ''}{meta.get('name', r.name)}"


def pod_spec(r: Resource) -> Mapping[str, Any] | None:
    kind = k8s_kind(r)
    if kind not in WORKLOAD_KINDS:
        return None
    spec = _map(r.props.get("spec"))
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        spec = (_map(_map(spec.get("jobTemplate")).get("spec")))
    return (_map(spec.get("template")).get("spec")) or None


def _containers(spec: Mapping[str, Any], init: bool = True) -> list[Mapping[str, Any]]:
    return [*_seq(spec.get("containers")), *(_seq(spec.get("initContainers")) if init else [])]


def _resource_amounts(container: Mapping[str, Any]) -> dict[str, Any]:
    res = _map(container.get("resources"))
    return {**_map(res.get("limits")), **_map(res.get("requests"))}


def _requests_gpu(container: Mapping[str, Any]) -> bool:
    return any(k.startswith("nvidia.com/") for k in _resource_amounts(container))


def _argv(container: Mapping[str, Any]) -> list[str]:
    return [str(a) for a in [*_seq(container.get("command")), *_seq(container.get("args"))]]


def _env(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {e.get("name", ""): e for e in _seq(container.get("env"))}


# libyaml's safe loader when PyYAML was built with it (the wheels are): the same documents, ~10× faster — the
# pack parses every ConfigMap and Helm value string of a render
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_embedded(text: Any) -> Any:
    """A YAML/JSON document embedded as a string (ConfigMap data, Helm values); None when it is not one."""
    if not isinstance(text, str) or ":" not in text:
        return None
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError:
        return None


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    """(key, value) for every mapping entry at any depth, parsing embedded documents on the way."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield str(k), v
            yield from _walk(v)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for v in value:
            yield from _walk(v)
    elif isinstance(value, str):
        doc = _parse_embedded(value)
        if isinstance(doc, (Mapping, list)):
            yield from _walk(doc)


# ── 1. no autoscaling on GPU utilisation ──────────────────────────────────────────────────────────

GPU_UTIL_METRIC = re.compile(r"dcgm|gpu_?util|gpu_utili[sz]ation|duty_cycle", re.IGNORECASE)


def check_no_gpu_util_autoscaling(r: Resource, ctx: StackContext) -> list[str]:
    kind = k8s_kind(r)
    spec = _map(r.props.get("spec"))
    texts: list[tuple[str, str]] = []
    if kind in ("ScaledObject", "ScaledJob"):
        for t in _seq(spec.get("triggers")):
            for k, v in {**_map(t.get("metadata")), "type": t.get("type", "")}.items():
                texts.append((f"trigger {t.get('name') or t.get('type')} {k}", str(v)))
    elif kind == "HorizontalPodAutoscaler":
        for m in _seq(spec.get("metrics")):
            for source in ("pods", "object", "external", "resource", "containerResource"):
                metric = _map(_map(m.get(source)).get("metric"))
                if metric.get("name"):
                    texts.append((f"{source} metric", str(metric["name"])))
    else:
        return []
    return [
        f"{k8s_ref(r)} scales on GPU utilisation ({where}: {text[:120]!r}); utilisation says nothing about "
        "requests waiting (a saturated engine and an idle one can both read 100%). Scale on work waiting "
        "instead: vllm:num_requests_waiting, requests in flight, or KV-cache use."
        for where, text in texts
        if GPU_UTIL_METRIC.search(text)
    ]


# ── 2. vLLM containers: max-model-len, generating readiness check, no hub at boot ─────────────────

GENERATION_PATH = re.compile(r"/v1/(chat/)?completions")
HUB_ENV_OFFLINE = ("HF_HUB_OFFLINE",)
HUB_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")


def is_vllm(container: Mapping[str, Any]) -> bool:
    argv = _argv(container)
    image = str(container.get("image", ""))
    return ("vllm" in image.lower() and ("serve" in argv or not argv)) or (
        "vllm" in argv and "serve" in argv) or any("vllm.entrypoints" in a for a in argv)


def _served_model(argv: list[str]) -> str | None:
    if "serve" in argv:
        i = argv.index("serve")
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    for flag in ("--model",):
        for i, a in enumerate(argv):
            if a == flag and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
    return None


def _probe_script(spec: Mapping[str, Any], container: Mapping[str, Any], argv: list[str],
                  configmaps: Mapping[tuple[str, str], Mapping[str, Any]], namespace: str) -> str | None:
    """The text an exec probe runs: its own arguments plus any mounted ConfigMap file they name (None when
    the ConfigMap's name is not known yet)."""
    text = " ".join(argv)
    volumes = {v.get("name"): v for v in _seq(spec.get("volumes"))}
    for arg in argv:
        for m in _seq(container.get("volumeMounts")):
            mount = str(m.get("mountPath", "")).rstrip("/")
            if not mount or not arg.startswith(mount + "/"):
                continue
            cm = _map(_map(volumes.get(m.get("name"))).get("configMap"))
            if cm.get("name") == UNKNOWN:
                return None  # a preview before the ConfigMap's name is known: nothing to judge yet
            data = configmaps.get((namespace, str(cm.get("name"))))
            if data is not None:
                text += "\n" + str(data.get(arg[len(mount) + 1:], ""))
    return text


def check_vllm_containers(resources: Sequence[Resource], ctx: StackContext) -> list[tuple[str, str]]:
    configmaps: dict[tuple[str, str], Mapping[str, Any]] = {}
    for r in resources:
        if k8s_kind(r) == "ConfigMap":
            meta = _map(r.props.get("metadata"))
            configmaps[(str(meta.get("namespace", "")), str(meta.get("name", r.name)))] = _map(r.props.get("data"))
    found: list[tuple[str, str]] = []
    for r in resources:
        spec = pod_spec(r)
        if spec is None:
            continue
        ns = str(_map(r.props.get("metadata")).get("namespace", ""))
        for c in _seq(spec.get("containers")):
            if not is_vllm(c):
                continue
            argv, env, where = _argv(c), _env(c), f"{k8s_ref(r)} container {c.get('name')}"
            if not any(a == "--max-model-len" or a.startswith("--max-model-len=") for a in argv):
                found.append((r.urn, f"{where} runs vLLM without --max-model-len: it then reserves KV cache for "
                                     "the model's full context and admits prompts the product never promised. "
                                     "Pass --max-model-len set to the product's context limit."))
            probe = c.get("readinessProbe")
            if not probe:
                found.append((r.urn, f"{where} has no readiness probe: traffic arrives before the engine can "
                                     "generate. Add an exec readiness probe that sends one /v1/completions "
                                     "request and succeeds only when a token came back."))
            elif "exec" not in probe:
                kind = next((k for k in ("httpGet", "tcpSocket", "grpc") if k in probe), "non-exec")
                found.append((r.urn, f"{where} readiness probe is a {kind} check, which passes before the engine "
                                     "can generate. Use an exec probe that sends one /v1/completions request and "
                                     "succeeds only when a token came back."))
            else:
                probe_argv = [str(a) for a in _seq(_map(probe["exec"]).get("command"))]
                script = _probe_script(spec, c, probe_argv, configmaps, ns)
                if script is not None and not GENERATION_PATH.search(script):
                    found.append((r.urn, f"{where} readiness probe ({' '.join(probe_argv)[:100]}) sends no "
                                         "generation request. Make it call /v1/completions (or "
                                         "/v1/chat/completions) and succeed only when a token came back."))
            offline = all(str(_map(env.get(k)).get("value", "")) == "1" for k in HUB_ENV_OFFLINE)
            model = _served_model(argv)
            hub_token = [k for k in HUB_TOKENS if k in env]
            if not offline or hub_token or (model is not None and not model.startswith("/")):
                why = []
                if not offline:
                    why.append("HF_HUB_OFFLINE is not '1'")
                if hub_token:
                    why.append(f"it is given a hub token ({', '.join(hub_token)})")
                if model is not None and not model.startswith("/"):
                    why.append(f"it serves {model!r}, a hub id rather than a local path")
                found.append((r.urn, f"{where} can reach a model hub at boot ({'; '.join(why)}). Serve weights "
                                     "from the region-local cache (a local path filled from the weight bucket), "
                                     "set HF_HUB_OFFLINE=1 and give the engine no hub token."))
    # the Modal burst app runs the same engine from its settings (modal_apps/burst.py builds the command)
    for r in resources:
        spec = burst_spec(r)
        if spec is None:
            continue
        engine, burst = _map(spec.get("engine")), _map(spec.get("burst"))
        where = f"Modal burst app {burst.get('app_name', r.name)}"
        if not isinstance(engine.get("max_model_len"), int) or engine["max_model_len"] <= 0:
            found.append((r.urn, f"{where} runs vLLM with max_model_len={engine.get('max_model_len')!r}: set it to "
                                 "the product's context limit (--max-model-len)."))
        if not burst.get("volume_name") or not burst.get("weights_bucket"):
            found.append((r.urn, f"{where} has no weights volume filled from the region-local bucket "
                                 f"(volume_name={burst.get('volume_name')!r}, weights_bucket="
                                 f"{burst.get('weights_bucket')!r}), so it would download from a model hub at "
                                 "boot. Give it the endpoint's Modal Volume synced from the weight bucket."))
    return found


# ── 3. a prefix cache shared by tenants needs per-tenant cache_salt or separate pools ────────────

_SECTION = re.compile(r"^(frontend|backend|listen|defaults|global|resolvers)\b\s*(\S*)", re.MULTILINE)
_TENANT = re.compile(r"set-var\(txn\.tenant\)\s+str\(([^)]+)\)")
_GATE = re.compile(r"lua\.llm_gate\s+\S+\s+(\S+).*?-m str\s+(\S+)\s*\}")
_TENANT_BACKEND = re.compile(r"use_backend\s+(\S+)\s+if\s*\{\s*var\(txn\.tenant\)\s+-m str\s+(\S+)\s*\}")


def haproxy_frontends(cfg: str) -> dict[str, str]:
    """frontend name → its body, from an HAProxy configuration."""
    out: dict[str, str] = {}
    matches = list(_SECTION.finditer(cfg))
    for i, m in enumerate(matches):
        if m.group(1) in ("frontend", "listen"):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(cfg)
            out[m.group(2)] = cfg[m.end():end]
    return out


def check_prefix_cache_tenancy(resources: Sequence[Resource], ctx: StackContext) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for r in resources:
        if k8s_kind(r) != "ConfigMap":
            continue
        for key, cfg in _map(r.props.get("data")).items():
            if not str(key).endswith(".cfg") or "frontend" not in str(cfg):
                continue
            for fe, body in haproxy_frontends(str(cfg)).items():
                tenants = sorted(set(_TENANT.findall(body)))
                if len(tenants) < 2:
                    continue
                salted = {t for salt, t in _GATE.findall(body) if salt != "-"}
                pooled = {t for _b, t in _TENANT_BACKEND.findall(body)}
                shared = [t for t in tenants if t not in salted and t not in pooled]
                if shared:
                    found.append((r.urn, f"{k8s_ref(r)} {key}: frontend {fe} serves tenants {', '.join(tenants)} "
                                         f"from one prefix cache, and {', '.join(shared)} get no cache_salt: one "
                                         "tenant's cached prefixes then answer (and time-reveal) another's. Stamp a "
                                         "per-tenant cache_salt at the gateway (cache_isolation: cache_salt) or "
                                         "give each tenant its own pool."))
    for r in resources:
        meta = _map(r.props.get("metadata"))
        if _map(meta.get("annotations")).get("serving.llm/cache-isolation") == "shared":
            found.append((r.urn, f"{k8s_ref(r)} is annotated cache-isolation 'shared'. Use cache_salt or "
                                 "separate pools for an endpoint with more than one tenant."))
    return found


# ── 4. no time-slicing / MPS behind an SLO; MIG layouts valid for their GPU ───────────────────────

def _instance_gpu_kinds() -> dict[str, str]:
    return {it.name: kind.name for kind in GPU_KINDS.values() for it in kind.instance_types}


def pod_labels(r: Resource) -> dict[str, Any]:
    """The labels a workload's pods carry: a Pod's own, a CronJob's job template's pod template's, else the pod
    template's (as pod_spec reads the spec)."""
    kind, spec = k8s_kind(r), _map(r.props.get("spec"))
    if kind == "Pod":
        return dict(_map(_map(r.props.get("metadata")).get("labels")))
    if kind == "CronJob":
        spec = _map(_map(spec.get("jobTemplate")).get("spec"))
    return dict(_map(_map(_map(spec.get("template")).get("metadata")).get("labels")))


def _serves_an_endpoint(r: Resource) -> bool:
    spec = pod_spec(r)
    if spec is None:
        return False
    labels = {**(_map(_map(r.props.get("metadata")).get("labels"))), **pod_labels(r)}
    return "serving.llm/endpoint" in labels and any(_requests_gpu(c) for c in _containers(spec))


def check_gpu_sharing(resources: Sequence[Resource], ctx: StackContext) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    slo_workloads = [r for r in resources if _serves_an_endpoint(r)]
    if slo_workloads:
        for r in resources:
            if not (r.type.startswith("kubernetes:")):
                continue
            for key, value in _walk(r.props):
                if key in ("timeSlicing", "mps") and value:
                    found.append((r.urn, f"{k8s_ref(r) or r.name} configures GPU {key} sharing while "
                                         f"{len(slo_workloads)} GPU workload(s) with an SLO run in this stack "
                                         f"({', '.join(sorted(k8s_ref(w) for w in slo_workloads))[:200]}): "
                                         "time-sliced and MPS-shared GPUs give no latency isolation. Remove the "
                                         "sharing config; use MIG slices for small models."))
        for r in slo_workloads:
            for c in _containers(pod_spec(r) or {}):
                shared = [k for k in _resource_amounts(c) if k.endswith(".shared")]
                if shared:
                    found.append((r.urn, f"{k8s_ref(r)} container {c.get('name')} asks for {shared[0]}, a "
                                         "time-sliced GPU, behind an SLO. Ask for a whole GPU or a MIG slice."))
    # MIG: every layout a node pool asks for must exist and fit the pool's GPU
    layouts: dict[str, list[Mapping[str, Any]]] = {}
    for r in resources:
        if k8s_kind(r) != "ConfigMap":
            continue
        for text in _map(r.props.get("data")).values():
            doc = _parse_embedded(text)
            if isinstance(doc, Mapping) and isinstance(doc.get("mig-configs"), Mapping):
                for name, entries in doc["mig-configs"].items():
                    layouts[str(name)] = list(entries or [])
    kinds = _instance_gpu_kinds()
    for r in resources:
        if r.type != "aws:eks/nodeGroup:NodeGroup":
            continue
        layout = _map(r.props.get("labels")).get("nvidia.com/mig.config")
        if layout is None:
            continue
        gpu = _map(r.props.get("labels")).get("serving.llm/gpu") or next(
            (kinds[t] for t in _seq(r.props.get("instanceTypes")) if t in kinds), None)
        if layout not in layouts:
            found.append((r.urn, f"node group {r.name} asks for MIG layout {layout!r}, which no mig-parted config "
                                 f"in the stack defines (defined: {sorted(layouts)}). Add it to the GPU operator's "
                                 "mig-parted ConfigMap or pick a defined layout."))
            continue
        for entry in layouts[layout]:
            if not entry.get("mig-enabled"):
                continue
            devices = {str(k): v for k, v in _map(entry.get("mig-devices")).items()}
            try:
                if gpu is None:
                    raise MigLayoutError(f"the GPU of instance types {r.props.get('instanceTypes')} is not in the catalog")
                validate_mig_layout(gpu, devices)
            except MigLayoutError as e:
                found.append((r.urn, f"node group {r.name}: MIG layout {layout!r} is invalid for its GPU: {e}. "
                                     "Fix the layout (profiles that exist for this GPU, at most 7 compute and 8 "
                                     "memory slices)."))
    return found


# ── 5. weight buckets: versioned, encrypted, private, TLS-only, protected ────────────────────────

def _denies_insecure_transport(policy: Any) -> bool:
    doc = json.loads(policy) if isinstance(policy, str) else policy
    for st in _seq(_map(doc).get("Statement")):
        cond = (_map(_map(st.get("Condition")).get("Bool"))).get("aws:SecureTransport")
        if st.get("Effect") == "Deny" and str(cond).lower() == "false":
            return True
    return False


def check_weight_buckets(resources: Sequence[Resource], ctx: StackContext) -> list[tuple[str, str]]:
    buckets = [b for b in resources if b.type in ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")]
    per_parent: dict[str, list[Resource]] = {}
    for b in buckets:
        per_parent.setdefault(b.parent_urn, []).append(b)
    by_bucket: dict[str, dict[str, list[Resource]]] = {}
    for r in resources:
        if not r.type.startswith("aws:s3/") or r in buckets or not isinstance(r.props.get("bucket"), str):
            continue
        target = r.props["bucket"]
        if target == UNKNOWN and len(per_parent.get(r.parent_urn, [])) == 1:
            # in a preview of a new stack the bucket's name is an output: the component's own bucket
            target = str(per_parent[r.parent_urn][0].props.get("bucket") or per_parent[r.parent_urn][0].name)
        by_bucket.setdefault(target, {}).setdefault(r.type.split(":")[-1], []).append(r)
    found: list[tuple[str, str]] = []
    for b in buckets:
        name = str(b.props.get("bucket") or b.name)
        parts = by_bucket.get(name, {})
        missing: list[str] = []
        if not any((_map(v.props.get("versioningConfiguration")).get("status") == "Enabled")
                   for v in parts.get("BucketVersioning", [])):
            missing.append("versioning is not Enabled (add aws.s3.BucketVersioning status Enabled)")
        if not any((_map(rule.get("applyServerSideEncryptionByDefault")).get("sseAlgorithm") in ("AES256", "aws:kms", "aws:kms:dsse"))
                   for e in parts.get("BucketServerSideEncryptionConfiguration", []) for rule in _seq(e.props.get("rules"))):
            missing.append("no default encryption (add aws.s3.BucketServerSideEncryptionConfiguration, AES256 or aws:kms)")
        flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
        if not any(all(p.props.get(f) is True for f in flags) for p in parts.get("BucketPublicAccessBlock", [])):
            missing.append("public access is not fully blocked (add aws.s3.BucketPublicAccessBlock with all four flags true)")
        if not any(_denies_insecure_transport(p.props.get("policy")) for p in parts.get("BucketPolicy", [])):
            missing.append("plain-HTTP access is not denied (add a bucket policy denying aws:SecureTransport false)")
        if not b.protect:
            missing.append("the bucket is not protected (set ResourceOptions(protect=True))")
        if b.props.get("forceDestroy") is True:
            missing.append("forceDestroy is true (set it false: a destroy would empty the bucket)")
        expiring = [str(_map(rule).get("id") or "(no id)")
                    for lc in parts.get("BucketLifecycleConfiguration", []) + parts.get("BucketLifecycleConfigurationV2", [])
                    for rule in _seq(lc.props.get("rules"))
                    if _map(rule).get("status") == "Enabled" and _map(rule).get("expiration")]
        if expiring:
            missing.append(f"lifecycle rule(s) {', '.join(expiring)} expire objects (remove the expiration: weights "
                           "leave the bucket only when a revision is retired, never on a timer)")
        for m in missing:
            found.append((b.urn, f"weight bucket {name}: {m}."))
    return found


# ── 6. Modal burst endpoints require proxy auth ──────────────────────────────────────────────────

def burst_spec(r: Resource) -> Mapping[str, Any] | None:
    """The burst app's spec from the Command that deploys it (`modal_apps.deploy`); the volume-fill Command
    carries the same spec but deploys nothing."""
    if r.type != "command:local:Command" or "modal_apps.deploy" not in str(r.props.get("create", "")):
        return None
    raw = _map(r.props.get("environment")).get(BURST_SPEC_ENV)
    if not isinstance(raw, str) or raw == SECRET_MARKER:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, Mapping) else None


def check_modal_proxy_auth(r: Resource, ctx: StackContext) -> list[str]:
    spec = burst_spec(r)
    if spec is None:
        return []
    burst = _map(spec.get("burst"))
    if burst.get("requires_proxy_auth") is True:
        return []
    return [f"Modal burst app {burst.get('app_name', r.name)} is deployed with requires_proxy_auth="
            f"{burst.get('requires_proxy_auth')!r}: its URL would serve anyone who finds it, on our GPU bill. "
            "Deploy the web endpoint with requires_proxy_auth=True (the gateway sends Modal-Key/Modal-Secret)."]


# ── 7. credentials only from secret config ───────────────────────────────────────────────────────

CREDENTIAL_CONFIG_KEYS = (
    "aws:accessKey", "aws:secretKey", "aws:token",
    "llm-serving:modalTokenId", "llm-serving:modalTokenSecret", "llm-serving:kubeconfig",
)
_CREDENTIAL_PARTS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS"}


def is_credential_name(name: str) -> bool:
    parts = set(name.upper().split("_"))
    upper = name.upper()
    return bool(parts & _CREDENTIAL_PARTS) or upper.endswith(("API_KEY", "ACCESS_KEY_ID", "ACCESS_KEY"))


_LITERAL_CREDENTIAL = re.compile(r"AKIA[0-9A-Z]{16}|\bak-[A-Za-z0-9]{16,}|\bas-[A-Za-z0-9]{16,}|hf_[A-Za-z0-9]{30,}")


def check_credentials_from_secrets(resources: Sequence[Resource], ctx: StackContext) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = [
        ("", f"stack config {key} holds a credential in plain text. Remove it and set it with "
             f"`pulumi config set --secret {key.split(':', 1)[1]} ...` (in CI: from the secret store).")
        for key in ctx.plain_credential_config_keys
    ]
    for r in resources:
        spec = pod_spec(r)
        if spec is not None:
            for c in _containers(spec):
                for name, e in _env(c).items():
                    if is_credential_name(name) and "value" in e:
                        found.append((r.urn, f"{k8s_ref(r)} container {c.get('name')} sets {name} as a literal "
                                             "value in the manifest. Put it in a Kubernetes Secret filled from "
                                             "secret config and use valueFrom.secretKeyRef."))
        if r.type == "command:local:Command":
            env = _map(r.props.get("environment"))
            if r.secrets_marked:
                for name, value in env.items():
                    if is_credential_name(name) and value != SECRET_MARKER:
                        found.append((r.urn, f"command {r.name} gets {name} as a plain value. Read it from secret "
                                             "config (config.require_secret) or the CI secret store's environment "
                                             "and pass it as a secret output."))
            for key in ("create", "update", "delete"):
                if isinstance(r.props.get(key), str) and _LITERAL_CREDENTIAL.search(r.props[key]):
                    found.append((r.urn, f"command {r.name} has a credential written into its {key} command. "
                                         "Pass it through the command's environment from secret config."))
        if r.type == "pulumi:providers:aws" and r.secrets_marked:
            for key in ("accessKey", "secretKey", "token"):
                if isinstance(r.props.get(key), str) and r.props[key] != SECRET_MARKER:
                    found.append((r.urn, f"AWS provider {r.name} gets {key} in plain text. Use secret config "
                                         "or the CI environment's credentials."))
    return found


# ── 8. GPU pods declare CPU and memory requests ──────────────────────────────────────────────────

def check_gpu_pod_requests(r: Resource, ctx: StackContext) -> list[str]:
    spec = pod_spec(r)
    if spec is None or not any(_requests_gpu(c) for c in _containers(spec)):
        return []
    found = []
    for c in _seq(spec.get("containers")):
        requests = _map(_map(c.get("resources")).get("requests"))
        missing = [k for k in ("cpu", "memory") if k not in requests]
        if missing:
            found.append(f"{k8s_ref(r)} is a GPU pod whose container {c.get('name')} requests no "
                         f"{' and no '.join(missing)}: with only GPU requests the pod is BestEffort and the first "
                         "evicted under memory pressure. Set resources.requests.cpu and .memory (and a memory limit).")
    return found


# ── 9. runAsNonRoot needs a numeric runAsUser ────────────────────────────────────────────────────

def check_non_root_numeric_user(r: Resource, ctx: StackContext) -> list[str]:
    spec = pod_spec(r)
    if spec is None:
        return []
    pod_sc = _map(spec.get("securityContext"))
    found = []
    for c in _containers(spec):
        sc = _map(c.get("securityContext"))
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        if non_root is True and (not isinstance(user, (int, float)) or isinstance(user, bool) or user <= 0):
            found.append(f"{k8s_ref(r)} container {c.get('name')} sets runAsNonRoot without a numeric non-zero "
                         f"runAsUser (got {user!r}): an image whose USER is a name (e.g. haproxy) is then refused "
                         "by the kubelet. Set securityContext.runAsUser (and runAsGroup) to the image's numeric uid.")
    return found


# ── 10. no custom resource without its definition ────────────────────────────────────────────────

BUILTIN_GROUPS = frozenset({
    "core", "apps", "batch", "policy", "autoscaling", "extensions",
    "networking.k8s.io", "rbac.authorization.k8s.io", "storage.k8s.io", "apiextensions.k8s.io",
    "admissionregistration.k8s.io", "scheduling.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
    "node.k8s.io", "certificates.k8s.io", "events.k8s.io", "flowcontrol.apiserver.k8s.io",
    "resource.k8s.io", "apiregistration.k8s.io", "authentication.k8s.io", "authorization.k8s.io",
    "internal.apiserver.k8s.io", "storagemigration.k8s.io",
})
NOT_KUBERNETES_OBJECTS = ("helm.sh", "yaml", "kustomize", "")
# API groups whose CRDs a Helm chart installs by default (chart → groups); a value that turns the CRDs off
# is honoured. keda 2.20: crds.install (default true); kube-prometheus-stack: crds.enabled (default true);
# gpu-operator v26: operator.upgradeCRD / the chart's crds/ folder (always installed by Helm).
CHART_CRD_GROUPS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "keda": (frozenset({"keda.sh", "eventing.keda.sh"}), ("crds", "install")),
    "kube-prometheus-stack": (frozenset({"monitoring.coreos.com"}), ("crds", "enabled")),
    "prometheus-operator-crds": (frozenset({"monitoring.coreos.com"}), ()),
    "gpu-operator": (frozenset({"nvidia.com"}), ()),
}


def provided_groups(resources: Sequence[Resource], ctx: StackContext) -> dict[str, str]:
    """API group → what provides it (a CRD in the stack, a Helm release, the stated platform)."""
    out = {g: "the platform (stack setting llm-serving:platformProvides)" for g in ctx.platform_provides}
    for r in resources:
        if k8s_kind(r) == "CustomResourceDefinition":
            g = _map(r.props.get("spec")).get("group")
            if g:
                out[str(g)] = f"CRD {r.name}"
        elif r.type in ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart"):
            chart = str(r.props.get("chart", "")).rsplit("/", 1)[-1]
            if chart in CHART_CRD_GROUPS:
                groups, switch = CHART_CRD_GROUPS[chart]
                value: Any = _map(r.props.get("values"))
                for k in switch:
                    value = value.get(k, True) if isinstance(value, Mapping) else True
                if value is not False:
                    for g in groups:
                        out.setdefault(g, f"Helm release {r.props.get('name', r.name)} (chart {chart})")
    return out


def check_custom_resources_defined(resources: Sequence[Resource], ctx: StackContext) -> list[tuple[str, str]]:
    provided = provided_groups(resources, ctx)
    found = []
    for r in resources:
        g = k8s_group(r)
        if not r.type.startswith("kubernetes:") or g in NOT_KUBERNETES_OBJECTS or g in BUILTIN_GROUPS:
            continue
        if g not in provided:
            found.append((r.urn, f"{k8s_ref(r)} is a custom resource of API group {g}, but nothing in the stack "
                                 "installs its definition and the stack does not state that its platform provides "
                                 f"it: the apply fails with 'no matches for kind {k8s_kind(r)}'. Install the "
                                 f"operator that defines {g} in this stack (a Helm release), or, when the cluster "
                                 f"already has it, add {g!r} to the stack setting {PLATFORM_PROVIDES_KEY}."))
    return found


# ── 11. the AWS provider has a region ────────────────────────────────────────────────────────────

def check_aws_provider_region(resources: Sequence[Resource], ctx: StackContext) -> list[tuple[str, str]]:
    """Once per AWS provider (explicit, or the default one the stack's aws:* config makes)."""
    users: dict[str, list[Resource]] = {}
    providers: dict[str, Mapping[str, Any]] = {}
    for r in resources:
        if r.type == "pulumi:providers:aws":
            providers.setdefault(r.urn, r.props)
            users.setdefault(r.urn, [])
        elif r.type.startswith("aws:") and r.provider_props is not None:
            key = r.provider_urn or "default"
            providers.setdefault(key, r.provider_props)
            users.setdefault(key, []).append(r)
    found = []
    for key, props in providers.items():
        if props.get("region"):
            continue
        used_by = users.get(key, [])
        what = "the default AWS provider" if key == "default" else f"AWS provider {key.rsplit('::', 1)[-1]}"
        names = ", ".join(sorted(r.name for r in used_by)[:4]) + (" ..." if len(used_by) > 4 else "")
        urn = key if key != "default" else (used_by[0].urn if used_by else "")
        found.append((urn, f"{what} has no region ({len(used_by)} resources use it: {names}); per-resource "
                           "`region=` does not configure the provider, so the deploy depends on whoever runs it "
                           "having AWS_REGION set. Set `pulumi config set aws:region <region>` in the stack (CI: "
                           "from the secret store), or give an explicit aws.Provider a region."))
    return found


# ── 12. advisory: a zero floor on weekday mornings before the demand rise ────────────────────────

MINUTES_PER_WEEK = 7 * 24 * 60
DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def cron_minute_of_week(expr: str) -> int | None:
    """'M H * * DOW' (DOW 0 or 7 = Sunday) → minute of week from Monday 00:00; None for other shapes."""
    try:
        minute, hour, dom, month, dow = expr.split()
        if (dom, month) != ("*", "*"):
            return None
        return ((int(dow) - 1) % 7) * 1440 + int(hour) * 60 + int(minute)
    except ValueError:
        return None


def _active(start: int, end: int, minute: int) -> bool:
    """KEDA cron semantics: active when the latest start at or before `minute` is newer than the latest end."""
    return (minute - start) % MINUTES_PER_WEEK < (minute - end) % MINUTES_PER_WEEK


@dataclass(frozen=True)
class FloorSchedule:
    endpoint: str
    what: str
    urn: str
    base: int
    windows: tuple[tuple[int, int, int], ...]  # (start minute of week, end, replicas), local time

    def at(self, minute: int) -> int:
        return max([self.base, *(n for s, e, n in self.windows if _active(s, e, minute))])


def floor_schedules(resources: Sequence[Resource]) -> list[FloorSchedule]:
    """Every warm minimum an endpoint has: its KEDA floor (minReplicaCount + cron triggers) and its Modal
    burst app's warm-container schedule."""
    out: list[FloorSchedule] = []
    for r in resources:
        if k8s_kind(r) == "ScaledObject":
            spec = _map(r.props.get("spec"))
            labels = _map(_map(r.props.get("metadata")).get("labels"))
            windows = []
            for t in _seq(spec.get("triggers")):
                m = _map(t.get("metadata"))
                if t.get("type") != "cron":
                    continue
                s, e = cron_minute_of_week(str(m.get("start", ""))), cron_minute_of_week(str(m.get("end", "")))
                if s is not None and e is not None:
                    windows.append((s, e, int(float(m.get("desiredReplicas", 0)))))
            out.append(FloorSchedule(str(labels.get("serving.llm/endpoint", r.name)), f"{k8s_ref(r)} floor", r.urn,
                                     int(spec.get("minReplicaCount", 0) or 0), tuple(windows)))
        spec = burst_spec(r)
        if spec is not None:
            b = _map(spec.get("burst"))
            windows = [(int(w["start_minute_of_week"]), int(w["end_minute_of_week"]), int(w["min_containers"]))
                       for w in _seq(b.get("min_containers_schedule"))]
            out.append(FloorSchedule(str(spec.get("endpoint", r.name)),
                                     f"Modal burst app {b.get('app_name', r.name)} warm minimum", r.urn,
                                     int(b.get("min_containers", 0) or 0), tuple(windows)))
    return out


def check_morning_floor(resources: Sequence[Resource], ctx: StackContext) -> list[tuple[str, str]]:
    """Per endpoint, all its warm capacity together (a dedicated floor covers a cold burst app)."""
    found = []
    rise = ctx.demand_rise_local_hour * 60
    by_endpoint: dict[str, list[FloorSchedule]] = {}
    for f in floor_schedules(resources):
        by_endpoint.setdefault(f.endpoint, []).append(f)
    for endpoint, floors in sorted(by_endpoint.items()):
        def warm(minute: int) -> int:
            return sum(f.at(minute) for f in floors)

        late = []
        for day in range(5):
            at_rise = day * 1440 + rise
            if warm(at_rise) > 0:
                continue
            up = next((m for m in range(at_rise + 1, day * 1440 + 12 * 60 + 1) if warm(m) > 0), None)
            if up is not None:
                late.append(f"{DAY_NAMES[day]} {up % 1440 // 60:02d}:{up % 60:02d}")
        if late:
            what = " and ".join(f.what for f in floors)
            found.append((floors[0].urn, f"endpoint {endpoint}: {what} is 0 at {ctx.demand_rise_local_hour:02d}:00 "
                                         f"on weekday mornings and comes up only later ({', '.join(late)}): the first "
                                         "users of the day wait for a cold start (the 7 am cold start). Start the "
                                         "morning floor at least one cold start before "
                                         f"{ctx.demand_rise_local_hour:02d}:00."))
    return found


# ── 13. advisory: right-size before platform ─────────────────────────────────────────────────────

RATE_ANNOTATION = "serving.llm/mean-requests-per-s"


def check_right_size_before_platform(r: Resource, ctx: StackContext) -> list[str]:
    if pod_spec(r) is None:
        return []
    raw = (_map(_map(r.props.get("metadata")).get("annotations"))).get(RATE_ANNOTATION)
    try:
        rate = float(raw) if raw is not None else None
    except ValueError:
        rate = None
    if rate is None or rate > ctx.right_size_below_requests_per_s:
        return []
    return [f"{k8s_ref(r)} puts an endpoint averaging {rate:g} req/s on dedicated cluster GPUs. At "
            f"≤ {ctx.right_size_below_requests_per_s:g} req/s a managed API or serverless burst is usually cheaper "
            "than a cluster plus its platform costs: right-size before platform (compare the plan's alternatives)."]


# ── who may connect to an engine or the quality recorder ─────────────────────────────────────────

RECORDER_LABELS = {"app.kubernetes.io/name": "quality-recorder"}  # components/quality_recorder.py
OPEN_CIDRS = ("0.0.0.0/0", "::/0")


def selector_matches(selector: Any, labels: Mapping[str, Any]) -> bool:
    """Whether a Kubernetes label selector (matchLabels and matchExpressions, every term ANDed) selects labels;
    an empty selector selects everything."""
    sel = _map(selector)
    if any(labels.get(k) != v for k, v in _map(sel.get("matchLabels")).items()):
        return False
    for e in _seq(sel.get("matchExpressions")):
        e = _map(e)
        key, op, values = e.get("key"), e.get("operator"), [str(v) for v in _seq(e.get("values"))]
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _admits_anyone(rule: Any) -> bool:
    """Whether one ingress rule admits connections from any pod of any namespace (or any address)."""
    peers = _seq(_map(rule).get("from"))
    if not peers:
        return True  # no `from`: every source
    for p in map(_map, peers):
        if "ipBlock" in p and _map(p.get("ipBlock")).get("cidr") in OPEN_CIDRS and not _seq(p["ipBlock"].get("except")):
            return True
        if "namespaceSelector" in p and not _map(p.get("namespaceSelector")) and not _map(p.get("podSelector")):
            return True  # every pod of every namespace
    return False


def check_serving_pods_admit_only_their_clients(resources: Sequence[Resource], ctx: StackContext
                                                ) -> list[tuple[str, str]]:
    """Every vLLM engine serving an endpoint, and the quality recorder, is selected by an ingress NetworkPolicy, and
    none of the policies selecting it admits every source (policies add up: one open rule opens the pod)."""
    policies = [r for r in resources if k8s_kind(r) == "NetworkPolicy"]
    found: list[tuple[str, str]] = []
    for r in resources:
        if pod_spec(r) is None:
            continue
        labels = pod_labels(r)
        recorder = selector_matches({"matchLabels": RECORDER_LABELS}, labels)
        if not (_serves_an_endpoint(r) or recorder):
            continue
        ns = _map(r.props.get("metadata")).get("namespace")
        selecting = []
        for p in policies:
            spec = _map(p.props.get("spec"))
            types = _seq(spec.get("policyTypes")) or ["Ingress"]  # absent: Ingress (and Egress when it has egress)
            if (_map(p.props.get("metadata")).get("namespace") == ns and "Ingress" in types
                    and selector_matches(spec.get("podSelector"), labels)):
                selecting.append(p)
        what = ("the quality recorder, which takes quality records from the gateway" if recorder else
                "a vLLM engine, whose --api-key guards only /v1 (/invocations, /tokenize, /score and LoRA loads "
                "answer anyone)")
        if not selecting:
            found.append((r.urn, f"{k8s_ref(r)} is {what}, and no NetworkPolicy selects its pods: any pod in the "
                                 "cluster can connect. Keep llm-serving:networkPolicy enabled (it admits the gateway "
                                 "and the Prometheus that scrapes the pods)."))
            continue
        open_ = [k8s_ref(p) for p in selecting
                 if any(_admits_anyone(rule) for rule in _seq(_map(p.props.get("spec")).get("ingress")))]
        if open_:
            found.append((r.urn, f"{k8s_ref(r)} is {what}, and {', '.join(open_)} admits every source to it. "
                                 "Admit the gateway's pods and the metrics scrapers only."))
    return found


RULES: tuple[Rule, ...] = (
    Rule("no-gpu-utilisation-autoscaling", MANDATORY,
         "Inference workloads never autoscale on GPU utilisation (DCGM / GPU_UTIL metrics in a ScaledObject, "
         "ScaledJob or HPA).", resource_check=check_no_gpu_util_autoscaling),
    Rule("vllm-container-safety", MANDATORY,
         "Every vLLM container sets --max-model-len, has a readiness check that performs a generation, and "
         "cannot reach a model hub at boot.", stack_check=check_vllm_containers),
    Rule("prefix-cache-tenant-isolation", MANDATORY,
         "A prefix cache shared by more than one tenant has a per-tenant cache_salt or separate pools.",
         stack_check=check_prefix_cache_tenancy),
    Rule("gpu-sharing-and-mig", MANDATORY,
         "No GPU time-slicing or MPS sharing for a workload with an SLO; MIG layouts valid for their GPU.",
         stack_check=check_gpu_sharing),
    Rule("weight-bucket-protection", MANDATORY,
         "Weight buckets are versioned, encrypted, private, TLS-only and protected from deletion (no lifecycle "
         "expiration).",
         stack_check=check_weight_buckets),
    Rule("modal-burst-proxy-auth", MANDATORY,
         "A Modal burst endpoint requires proxy auth.", resource_check=check_modal_proxy_auth),
    Rule("credentials-from-secret-config", MANDATORY,
         "Modal and cloud credentials come only from secret config.", stack_check=check_credentials_from_secrets),
    Rule("gpu-pod-cpu-memory-requests", MANDATORY,
         "GPU pods declare CPU and memory requests.", resource_check=check_gpu_pod_requests),
    Rule("run-as-non-root-numeric-user", MANDATORY,
         "A container with runAsNonRoot has a numeric runAsUser.", resource_check=check_non_root_numeric_user),
    Rule("custom-resources-have-definitions", MANDATORY,
         "No custom resource is declared whose definition nothing in the stack or its stated platform provides.",
         stack_check=check_custom_resources_defined),
    Rule("aws-provider-region", MANDATORY, "The AWS provider has a region.", stack_check=check_aws_provider_region),
    Rule("serving-pods-admit-only-their-clients", ADVISORY,
         "vLLM engines and the quality recorder are selected by an ingress NetworkPolicy that does not admit every "
         "source.", stack_check=check_serving_pods_admit_only_their_clients),
    Rule("morning-floor-before-demand-rise", ADVISORY,
         "A floor schedule is not at zero on weekday mornings before the demand rise (the 7 am cold start).",
         stack_check=check_morning_floor),
    Rule("right-size-before-platform", ADVISORY,
         "An endpoint at 2–3 req/s is not planned onto a cluster (right-size before platform).",
         resource_check=check_right_size_before_platform),
)


def evaluate(resources: Sequence[Resource], ctx: StackContext, rules: Iterable[Rule] = RULES) -> list[Violation]:
    """Every violation of every rule, in rule order."""
    return [v for rule in rules for v in rule.run(resources, ctx)]
