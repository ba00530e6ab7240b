"""Doctrine properties of what `__main__.py` declares, for every stack in stacks/ (run under Pulumi mocks)."""

from __future__ import annotations

import base64
import json
import math

import pytest
import yaml

from components.floor_replicas import WEIGHTS_MOUNT, lora_view_dir
from components.gpu_node_pool import node_group_physical_name
from pulumi_support import by_name, desired_replicas, env_of, objects, recording
from topology.catalog import GPU_KINDS, validate_mig_layout

GPU_AMI = "AL2023_x86_64_NVIDIA"
HUB_MARKERS = ("huggingface.co", "hf.co/", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def gpu_node_groups(rec):
    return [r for r in rec.of_type("aws:eks/nodeGroup:NodeGroup") if r.inputs.get("amiType") == GPU_AMI]


def mig_configs(rec) -> dict:
    cms = [o for o in objects(rec, "ConfigMap") if o["metadata"]["name"] == "llm-serving-mig-parted-config"]
    if not cms:
        return {}
    return yaml.safe_load(cms[0]["data"]["config.yaml"])["mig-configs"]


def vllm_container(deployment) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")


def floor_endpoints(spec):
    return [e for e in spec.endpoints if e.node_pools]


def vllm_deployments(rec) -> list[dict]:
    """Deployments that run the engine (the gateway's HAProxy Deployment is not one of them)."""
    return [d for d in objects(rec, "Deployment") if d["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"]


def track_engine(ep, deployment):
    """The spec's engine for a Deployment's track: the served engine, a rollout candidate's, or the warm previous one's."""
    track = deployment["spec"]["selector"]["matchLabels"]["serving.llm/track"]
    if track == "stable":
        return ep.engine
    return ep.rollout.candidate_engine if track == "canary" else ep.rollout.previous.engine


def floor_deployments(rec, spec) -> list[dict]:
    """The vLLM Deployments — one stable track per endpoint with dedicated pools (none in dev), plus a rollout's
    candidate (shadow, canary) and warm previous version; every track is held to the same pod checks."""
    deployments = vllm_deployments(rec)
    stable = [d for d in deployments if d["spec"]["selector"]["matchLabels"]["serving.llm/track"] == "stable"]
    assert sorted(d["metadata"]["name"] for d in stable) == sorted(f"{e.name}-vllm" for e in floor_endpoints(spec))
    tracks = {f"{e.name}-vllm-{t}" for e in floor_endpoints(spec) for t in ("canary", "previous")}
    assert {d["metadata"]["name"] for d in deployments if d not in stable} <= tracks
    return deployments


# ── node pools and MIG ─────────────────────────────────────────────────────────────────────────


def test_one_gpu_node_group_per_spec_pool_with_taint_bounds_and_nvme(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    # the node group is named after its pool and a digest of what forces a new group (node_group_physical_name)
    groups = {r.inputs["nodeGroupName"].rsplit("-", 1)[0]: r for r in gpu_node_groups(rec)}
    assert sorted(groups) == sorted(p.name for p in spec.node_pools)
    assert all(r.inputs["nodeGroupName"] == node_group_physical_name(p) for p in spec.node_pools
               for r in [groups[p.name]])
    templates = {r.urn: r for r in rec.of_type("aws:ec2/launchTemplate:LaunchTemplate")}
    for pool in spec.node_pools:
        g = groups[pool.name].inputs
        assert g["instanceTypes"] == [pool.instance_type]
        assert g["scalingConfig"]["minSize"] == pool.min_nodes and g["scalingConfig"]["maxSize"] == pool.max_nodes
        assert {"key": pool.taint_key, "value": "true", "effect": "NO_SCHEDULE"} in g["taints"]
        assert all(g["labels"][k] == v for k, v in pool.labels.items() if k != "nvidia.com/mig.config")
        # a pool not created yet starts at its minimum; a reserved pool declares its size: EKS takes min ≤ desired ≤
        # max in one call. No desired size is left to ignore_changes (test_node_scaling.py: a later `up`)
        assert not groups[pool.name].ignore_changes and g["scalingConfig"]["desiredSize"] == pool.min_nodes
        lt = next(t for t in templates.values() if t.name == groups[pool.name].name.replace("-node-group", "-launch-template"))
        if pool.local_nvme_gb > 0:
            assert "strategy: RAID0" in base64.b64decode(lt.inputs["userData"]).decode()


def test_mig_label_names_a_valid_layout_and_pods_request_that_slice(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    configs = mig_configs(rec)
    groups = gpu_node_groups(rec)
    for g in groups:
        pool = next(p for p in spec.node_pools if node_group_physical_name(p) == g.inputs["nodeGroupName"])
        label = g.inputs["labels"].get("nvidia.com/mig.config")
        assert label in configs, f"{pool.name}: label {label!r} names no config in the mig-parted ConfigMap"
        layout = configs[label][0]
        if layout["mig-enabled"]:
            validate_mig_layout(pool.gpu_kind, layout["mig-devices"])
            assert layout["mig-devices"] == pool.mig_layout.devices
    for d in floor_deployments(rec, spec):
        ep = spec.endpoint(d["metadata"]["labels"]["serving.llm/endpoint"])
        pod = d["spec"]["template"]["spec"]
        selector = pod["nodeSelector"]
        matching = [g for g in groups if all(g.inputs["labels"].get(k) == v for k, v in selector.items())]
        assert matching, f"{ep.name}: no node group carries labels {selector}"
        # the GPU part of the requests (CPU and memory are sized separately: tests/test_pod_resources.py)
        requests = {k: v for k, v in vllm_container(d)["resources"]["requests"].items() if k.startswith("nvidia.com/")}
        layout = configs[selector["nvidia.com/mig.config"]][0]
        if layout["mig-enabled"]:
            (resource, count), = requests.items()
            assert resource.startswith("nvidia.com/mig-") and count == "1"
            assert resource.removeprefix("nvidia.com/mig-") in layout["mig-devices"]
            assert resource == f"nvidia.com/mig-{ep.capacity.mig_profile}"
        else:
            assert requests == {"nvidia.com/gpu": str(ep.engine.tensor_parallel_size)}


def test_gpu_operator_runs_mig_manager_with_mixed_strategy_and_generated_config(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    releases = {r.inputs["name"]: r.inputs for r in rec.of_type("kubernetes:helm.sh/v3:Release")}
    if not spec.node_pools:
        assert "gpu-operator" not in releases
        return
    values = releases["gpu-operator"]["values"]
    assert values["mig"]["strategy"] == "mixed"
    assert values["migManager"]["enabled"] is True
    assert values["migManager"]["config"]["name"] == "llm-serving-mig-parted-config"
    assert "all-disabled" in mig_configs(rec)


# ── autoscaling ────────────────────────────────────────────────────────────────────────────────


def test_autoscaling_is_queue_based_with_capped_steps(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    scaled = by_name(objects(rec, "ScaledObject"))
    deployments = by_name(vllm_deployments(rec))
    assert sorted(scaled) == sorted(f"{e.name}-vllm" for e in floor_endpoints(spec))
    for e in floor_endpoints(spec):
        so = scaled[f"{e.name}-vllm"]["spec"]
        a = e.autoscaling
        assert so["scaleTargetRef"]["name"] in deployments
        assert so["minReplicaCount"] == e.floor.base_replicas and so["maxReplicaCount"] == a.max_replicas
        queue = [t for t in so["triggers"] if t["type"] == "prometheus" and t["name"] == "requests-waiting"]
        assert len(queue) == 1
        assert queue[0]["metricType"] == "AverageValue"
        assert "vllm:num_requests_waiting" in queue[0]["metadata"]["query"]
        assert float(queue[0]["metadata"]["threshold"]) == a.target_waiting_per_replica
        assert {t["type"] for t in so["triggers"]} <= {"prometheus", "cron"}  # no cpu/memory/GPU-util trigger
        assert not any("util" in json.dumps(t).lower() for t in so["triggers"])
        behavior = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleUp"]["policies"] == [
            {"type": "Pods", "value": a.scale_up_pods_per_period, "periodSeconds": a.scale_up_period_s}
        ]
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == a.scale_up_stabilization_s
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == a.scale_down_stabilization_s


def test_cron_windows_start_the_cold_start_lead_before_each_rise(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    scaled = by_name(objects(rec, "ScaledObject"))
    assert sorted(scaled) == sorted(f"{e.name}-vllm" for e in floor_endpoints(spec))
    for e in floor_endpoints(spec):
        so = scaled[f"{e.name}-vllm"]
        for t in so["spec"]["triggers"]:
            if t["type"] == "cron":
                assert t["metadata"]["timezone"] == e.floor.timezone
                assert all(isinstance(v, str) for v in t["metadata"].values())
        by_hour = e.floor.replicas_by_hour
        lead_min = math.ceil(e.floor.lead_time_s / 60)
        for h in range(168):
            for m in range(h * 60, h * 60 + 60):  # the schedule holds through every hour
                assert desired_replicas(so, m) >= by_hour[h], f"{e.name}: minute {m} below the floor"
            if by_hour[h] > by_hour[h - 1]:  # a rise: ready the lead ahead of it
                for m in range(h * 60 - lead_min, h * 60):
                    assert desired_replicas(so, m % 10080) >= by_hour[h], (
                        f"{e.name}: {by_hour[h]} replicas needed at hour {h}, not scheduled {lead_min} min ahead"
                    )


# ── the floor replica's pod ────────────────────────────────────────────────────────────────────


def test_readiness_probe_runs_the_warm_up_generation_script(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    config_maps = by_name(objects(rec, "ConfigMap"))
    for d in floor_deployments(rec, spec):
        ep = spec.endpoint(d["metadata"]["labels"]["serving.llm/endpoint"])
        c = vllm_container(d)
        probe = c["readinessProbe"]["exec"]["command"]
        assert probe[0] == "python3"
        mount = next(m for m in c["volumeMounts"] if probe[1].startswith(m["mountPath"] + "/"))
        volume = next(v for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        script = config_maps[volume["configMap"]["name"]]["data"][probe[1].rsplit("/", 1)[1]]
        assert "/v1/completions" in script and "completion_tokens" in script
        env = env_of(c)
        assert env["WARMUP_MODEL"] == ep.engine.served_model_name and int(env["WARMUP_MAX_TOKENS"]) >= 1
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= ep.pod_cold_start_s


def test_no_container_can_reach_a_model_hub_at_boot(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    caches = {c.bucket_name for c in spec.weight_caches if c.region == spec.cluster_region}
    for d in floor_deployments(rec, spec):
        ep = spec.endpoint(d["metadata"]["labels"]["serving.llm/endpoint"])
        pod = d["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            env = env_of(c)
            assert env.get("HF_HUB_OFFLINE") == "1" and env.get("TRANSFORMERS_OFFLINE") == "1", c["name"]
            text = json.dumps(c)
            assert not any(marker in text for marker in HUB_MARKERS), c["name"]
            assert ep.engine.tokenizer.split("@")[0] not in text  # the hub id of the tokenizer, e.g. meta-llama/...
        engine = vllm_container(d)
        model_path = engine["command"][2]
        assert model_path.startswith(WEIGHTS_MOUNT + "/"), model_path
        assert engine["command"] == track_engine(ep, d).vllm_args(model_path)  # the spec is the single source of flags
        fetch = next(c for c in pod["initContainers"] if c["name"] == "fetch-weights")
        uri = env_of(fetch)["WEIGHTS_URI"]
        assert uri.startswith("s3://") and uri.split("/")[2] in caches
        assert uri.endswith(track_engine(ep, d).weights_uri_suffix)
        assert int(env_of(fetch)["START_JITTER_S"]) == ep.herd.start_jitter_s


def test_max_model_len_is_the_product_limit(stack):
    name, inputs, spec = stack
    rec = recording(name)
    limits = {e.name: e.shape.product_max_context_tokens for e in inputs.endpoints}
    for d in floor_deployments(rec, spec):
        cmd = vllm_container(d)["command"]
        assert int(cmd[cmd.index("--max-model-len") + 1]) == limits[d["metadata"]["labels"]["serving.llm/endpoint"]]


def test_floor_replicas_spread_across_zones_with_a_pdb_and_a_service(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    pdbs, services = by_name(objects(rec, "PodDisruptionBudget")), by_name(objects(rec, "Service"))
    deployment_resources = {r.inputs["metadata"]["name"]: r for r in rec.of_type("kubernetes:apps/v1:Deployment")}
    for d in floor_deployments(rec, spec):
        n = d["metadata"]["name"]
        pod = d["spec"]["template"]["spec"]
        assert any(t["topologyKey"] == "topology.kubernetes.io/zone" for t in pod["topologySpreadConstraints"])
        if d["spec"]["selector"]["matchLabels"]["serving.llm/track"] != "stable":
            continue  # a rollout's candidate or warm previous version: no PDB, ClusterIP Service or autoscaler of its own
        assert pdbs[n]["spec"]["selector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]
        assert services[n]["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
        headless = services[f"{n}-pods"]["spec"]  # the gateway's per-replica backends
        assert headless["clusterIP"] == "None" and headless["selector"] == d["spec"]["selector"]["matchLabels"]
        assert headless["publishNotReadyAddresses"] is False  # only warmed-up replicas get traffic
        assert "spec.replicas" in deployment_resources[n].ignore_changes  # KEDA owns the count


def test_dev_declares_no_floor_replicas_but_its_weight_caches():
    from topology import load_inputs, plan
    from pulumi_support import ROOT

    spec = plan(load_inputs(ROOT / "stacks" / "Pulumi.dev.yaml"))
    rec = recording("dev")
    assert not gpu_node_groups(rec)
    assert not vllm_deployments(rec) and not objects(rec, "ScaledObject")
    # the gateway still fronts the serverless endpoints (everything to burst)
    assert [d["metadata"]["name"] for d in objects(rec, "Deployment")] == ["gateway-haproxy"]
    # no GPU operator, KEDA or node autoscaler: only the monitoring dev's own cluster needs
    assert [r.inputs["chart"] for r in rec.of_type("kubernetes:helm.sh/v3:Release")] == ["kube-prometheus-stack"]
    assert sorted(r.inputs["bucket"] for r in rec.of_type("aws:s3/bucket:Bucket")) == sorted(
        c.bucket_name for c in spec.weight_caches
    )


# ── weight caches ──────────────────────────────────────────────────────────────────────────────


def test_weight_buckets_are_versioned_encrypted_private_and_protected(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    buckets = {r.inputs["bucket"]: r for r in rec.of_type("aws:s3/bucket:Bucket")}
    assert sorted(buckets) == sorted(c.bucket_name for c in spec.weight_caches)

    def attached(type_: str, bucket: str) -> list[dict]:
        return [r.inputs for r in rec.of_type(type_) if r.inputs.get("bucket") == bucket]

    for b, r in buckets.items():
        assert r.protect is True and r.inputs.get("forceDestroy") is False
        (v,) = attached("aws:s3/bucketVersioning:BucketVersioning", b)
        assert v["versioningConfiguration"]["status"] == "Enabled"
        (sse,) = attached("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration", b)
        assert sse["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] in ("AES256", "aws:kms")
        (pab,) = attached("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", b)
        assert all(pab[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))


def test_replication_and_gateway_endpoint_and_prefix_limited_readers(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    # prod owns the source bucket's replication (llm-serving:weightReplication); dev declares none
    repls = rec.of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig")
    if name != "prod":
        assert repls == []
    else:
        (repl,) = repls
        assert repl.inputs["bucket"] == spec.weight_caches[0].source_bucket
        wanted = {(f"arn:aws:s3:::{c.bucket_name}", p) for c in spec.weight_caches for p in c.model_prefixes}
        assert wanted <= {(r["destination"]["bucket"], r["filter"]["prefix"]) for r in repl.inputs["rules"]}
    # both stacks reuse the shared VPC's S3 gateway endpoint (llm-serving:s3GatewayEndpoint.existingId)
    assert rec.of_type("aws:ec2/vpcEndpoint:VpcEndpoint") == []
    associations = {a.inputs["serviceAccount"]: a.inputs for a in rec.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                    if a.inputs["namespace"] != "kube-system"}  # the node autoscaler has its own
    # the floors' weight readers, and the quality recorder where an endpoint samples quality (its own role)
    recorder = ["quality-recorder"] if any(e.rollout and e.rollout.quality_sampling for e in spec.endpoints) else []
    assert sorted(associations) == sorted([f"{e.name}-vllm" for e in floor_endpoints(spec)] + recorder)
    roles = {r.urn: r for r in rec.of_type("aws:iam/role:Role")}
    for e in floor_endpoints(spec):
        role = next(r for r in roles.values() if r.name.endswith(f"-reader-{e.name}"))
        assert "inlinePolicies" not in role.inputs  # deprecated in pulumi-aws 7: a RolePolicy resource instead
        (attached,) = [p for p in rec.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == f"{role.name}-policy"]
        policy = json.loads(attached.inputs["policy"])
        actions = {a for s in policy["Statement"] for a in s["Action"]}
        assert actions == {"s3:GetObject", "s3:ListBucket"}
        get = next(s for s in policy["Statement"] if s["Action"] == ["s3:GetObject"])
        assert all(res.endswith(f"/{e.engine.weights_uri_suffix}*") for res in get["Resource"])


def test_exports_name_the_spec_costs_buckets_and_endpoints(stack):
    name, _inputs, spec = stack
    out = recording(name).outputs
    assert out["specSha256"] == spec.sha256()
    assert out["costReport"]["monthlyUsdTotal"] == pytest.approx(spec.monthly_usd_total)
    assert out["weightBuckets"] == {c.region: c.bucket_name for c in spec.weight_caches}
    assert sorted(out["endpoints"]) == sorted(e.name for e in spec.endpoints)
    for e in spec.endpoints:
        assert (out["endpoints"][e.name]["floorService"] is not None) == bool(e.node_pools)


def test_scale_down_never_cuts_a_stream_and_startup_has_its_budget(stack):
    """A replica leaving (scale-down, rollout) first leaves the gateway's pool, then has the longest request's
    time to finish its streams; the startup probe allows the measured cold start with margin."""
    name, _inputs, spec = stack
    rec = recording(name)
    for d in floor_deployments(rec, spec):
        ep = spec.endpoint(d["metadata"]["labels"]["serving.llm/endpoint"])
        pod = d["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == ep.drain_grace_s >= ep.longest_request_s + 10
        engine = vllm_container(d)
        assert engine["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
        probe = engine["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] >= ep.startup_budget_s >= ep.pod_cold_start_s


def test_engine_environment_comes_from_the_spec_and_loads_lora_adapters_from_the_local_copy(stack):
    name, _inputs, spec = stack
    rec = recording(name)
    for d in floor_deployments(rec, spec):
        ep = spec.endpoint(d["metadata"]["labels"]["serving.llm/endpoint"])
        engine = vllm_container(d)
        model_path = engine["command"][2]
        env = env_of(engine)
        assert ep.engine.vllm_env(model_path, lora_view_dir(model_path)).items() <= env.items()
        if ep.engine.lora is not None:
            # adapters resolve by name from the weights copy on local disk, never from a hub: from the folder the
            # fetch builds beside the copy, each adapter's config naming the engine's model (tests/
            # test_fetch_weights_lock.py runs it)
            assert env["VLLM_PLUGINS"] == "lora_filesystem_resolver"
            assert env["VLLM_LORA_RESOLVER_CACHE_DIR"] == f"{model_path}.lora"
            fetch = {e["name"]: e["value"] for e in d["spec"]["template"]["spec"]["initContainers"][0]["env"]}
            assert fetch["LORA_DIR"] == env["VLLM_LORA_RESOLVER_CACHE_DIR"]
            assert fetch["LORA_SRC"] == f"{model_path}/{ep.engine.lora.adapters_subdir}"
            assert fetch["ADAPTERS_URI"] == fetch["WEIGHTS_URI"].rstrip("/") + f"/{ep.engine.lora.adapters_subdir}/"
        else:
            assert "VLLM_PLUGINS" not in env


def test_floor_also_scales_on_burst_backlog_read_from_the_gateways_own_metrics(stack):
    """In floor + burst the gateway keeps the floor's queue short by overflowing, so sustained overload is
    visible only as requests in flight to the burst: the floor's ScaledObject watches exactly the burst
    backend the rendered gateway config defines, and Prometheus scrapes the gateway's exporter."""
    import re

    name, _inputs, spec = stack
    rec = recording(name)
    scaled = by_name(objects(rec, "ScaledObject"))
    gateway_cfg = next(cm for cm in objects(rec, "ConfigMap") if "haproxy.cfg" in cm.get("data", {}))["data"]["haproxy.cfg"]
    assert "use-service prometheus-exporter if { path /metrics }" in gateway_cfg
    monitors = [m for m in objects(rec, "PodMonitor") if m["metadata"]["name"].startswith("gateway")]
    assert monitors and monitors[0]["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    for e in floor_endpoints(spec):
        triggers = {t["name"]: t for t in scaled[f"{e.name}-vllm"]["spec"]["triggers"]}
        if e.tier != "floor_plus_burst":
            assert "burst-backlog" not in triggers
            continue
        t = triggers["burst-backlog"]
        assert t["type"] == "prometheus" and t["metricType"] == "Value"
        proxy = re.search(r'proxy="([^"]+)"', t["metadata"]["query"]).group(1)
        assert f"backend {proxy}\n" in gateway_cfg
        assert float(t["metadata"]["threshold"]) == e.burst.max_containers * e.burst.target_inputs


def test_a_floor_at_zero_wakes_only_past_the_bursts_capacity_and_stops_after_the_scale_down_window(planned_stacks):
    """A floor + burst plan whose weekly base is 0 leaves the floor at zero replicas in the hours burst alone
    serves. KEDA, not the HPA, wakes it from zero: any trigger above its activation threshold (default 0; keda
    v2.20.2 prometheus_scaler.go) — one request in flight to burst would start a replica and a GPU node — and drops
    it to zero once every trigger was inactive for cooldownPeriod (default 300 s), past the HPA's policies. So the
    burst-backlog trigger activates at its target and the cooldown is the scale-down window; a floor that never
    reaches zero keeps KEDA's defaults (nothing to activate)."""
    from components.floor_replicas import scaled_object_spec
    from offline.validate import validate_object

    _, spec = planned_stacks["prod"]
    ep = next(e for e in spec.endpoints if e.tier == "floor_plus_burst" and e.autoscaling.burst_backlog_threshold)
    zero = ep.model_copy(update={"floor": ep.floor.model_copy(update={"base_replicas": 0})})
    for e in (ep, zero):
        so = scaled_object_spec(e, f"{e.name}-vllm", "llm-serving", "http://prometheus:9090")
        obj = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
               "metadata": {"name": f"{e.name}-vllm", "namespace": "llm-serving"}, "spec": so}
        assert validate_object(obj) == []
        backlog = next(t for t in so["triggers"] if t["name"] == "burst-backlog")["metadata"]
        if e.floor.base_replicas == 0:
            assert so["minReplicaCount"] == 0
            assert so["cooldownPeriod"] == e.autoscaling.scale_down_stabilization_s
            assert float(backlog["activationThreshold"]) == float(backlog["threshold"]) == \
                e.burst.max_containers * e.burst.target_inputs
        else:
            assert "cooldownPeriod" not in so and "activationThreshold" not in backlog


def test_a_change_that_forces_a_new_node_group_gives_it_a_new_name(planned_stacks):
    """EKS cannot change a node group's instance type, AMI type or capacity type in place (terraform-provider-aws
    eks/node_group.go: ForceNew) and Pulumi creates the replacement before deleting the old one: under one fixed
    name EKS refuses it (ResourceInUseException) and the `up` failed. The name carries a digest of those fields
    and of the MIG layout (changed in place, the running nodes would be relabelled and repartitioned at once), so
    the new group comes up beside the old; anything else (sizes, labels of the same layout) keeps the name."""
    from topology.spec import MigLayoutSpec

    _, spec = planned_stacks["prod"]
    pool = next(p for p in spec.node_pools if p.name == "autocomplete-on-demand")
    name = node_group_physical_name(pool)
    assert name.startswith("autocomplete-on-demand-") and len(name) <= 63
    bigger = pool.model_copy(update={"instance_type": "p5.48xlarge", "gpus_per_node": 8})
    assert node_group_physical_name(bigger) != name
    resized = pool.model_copy(update={"max_nodes": pool.max_nodes + 3, "min_nodes": 1})
    assert node_group_physical_name(resized) == name
    guard = next(p for p in spec.node_pools if p.name == "guard-reserved")
    assert guard.mig_layout is not None
    relaid = guard.model_copy(update={"mig_layout": MigLayoutSpec(name="all-2g.20gb", devices={"2g.20gb": 3})})
    assert node_group_physical_name(relaid) != node_group_physical_name(guard)
    longest = pool.model_copy(update={"name": "e" * 40 + "-on-demand"})
    assert len(node_group_physical_name(longest)) <= 63  # EKS's limit


def test_the_floor_scripts_are_a_configmap_named_by_their_content(stack):
    """Every floor pod runs the weights fetch and the warm-up probe from one ConfigMap. Named by its content and
    immutable: a new script is a new ConfigMap and a new pod template (the Deployments roll onto it), where under
    one fixed name the kubelet rewrote the running pods' copy and a pod restarting later ran the new script with
    its old template's environment."""
    name, _inputs, spec = stack
    rec = recording(name)
    maps = {o["metadata"]["name"]: o for o in objects(rec, "ConfigMap") if "-vllm-scripts-" in o["metadata"]["name"]}
    deployments = [d for d in objects(rec, "Deployment") if d["metadata"]["name"].endswith(("-vllm", "-vllm-canary", "-vllm-previous"))]
    assert len(maps) == len({e.name for e in spec.endpoints if e.node_pools})
    for cm in maps.values():
        assert cm["immutable"] is True
    for d in deployments:
        (vol,) = [v for v in d["spec"]["template"]["spec"]["volumes"] if v["name"] == "scripts"]
        assert vol["configMap"]["name"] in maps, d["metadata"]["name"]


def test_pulumi_up_waits_for_floor_replicas_as_long_as_new_gpu_nodes_take(stack):
    """pulumi-kubernetes waits for every replica of a Deployment's new ReplicaSet to be ready, 10 minutes unless told
    (provider/pkg/await/deployment.go, DefaultDeploymentTimeoutMins), and the Deployment controller calls a rollout
    stuck after progressDeadlineSeconds (600 s by default) without a pod becoming ready. A floor pod on a new GPU
    node takes the measured node cold start plus its start jitter; a rollout moves one surge pod at a time."""
    name, _inputs, spec = stack
    rec = recording(name)
    deployments = [r for r in rec.resources if r.type == "kubernetes:apps/v1:Deployment"
                   and r.inputs["metadata"]["name"].split("-vllm")[0] in {e.name for e in spec.endpoints}
                   and "-vllm" in r.inputs["metadata"]["name"]]
    if not any(e.node_pools for e in spec.endpoints):
        assert not deployments
        return
    assert deployments
    for r in deployments:
        ep = spec.endpoint(r.inputs["metadata"]["labels"]["serving.llm/endpoint"])
        new_node_s = ep.node_cold_start_s + ep.herd.start_jitter_s
        assert r.inputs["spec"]["progressDeadlineSeconds"] >= new_node_s
        minutes = {k: int(v.removesuffix("m")) for k, v in r.custom_timeouts.items()}
        assert set(minutes) == {"create", "update"}
        stable = r.inputs["metadata"]["name"] == f"{ep.name}-vllm"
        replicas = ep.autoscaling.max_replicas if stable else r.inputs["spec"]["replicas"]
        # the first pod on a new node, then the rest one after another on warm nodes
        needed = new_node_s + (replicas - 1) * (ep.pod_cold_start_s + ep.herd.start_jitter_s)
        assert minutes["create"] * 60 >= needed and minutes["update"] == minutes["create"], (ep.name, minutes, needed)
    if name == "prod":
        assist = next(r for r in deployments if r.inputs["metadata"]["name"] == "assist-vllm")
        assert int(assist.custom_timeouts["create"].removesuffix("m")) > 10  # the provider's default would fail


@pytest.mark.parametrize("stack_name", ["dev", "prod"])
def test_on_a_platforms_cluster_an_existing_namespace_is_adopted_not_refused(stack_name):
    """pulumi-kubernetes >= 4.29 creates a new object with a plain create, refused with AlreadyExists when it is
    there (CHANGELOG 4.29.0, provider/pkg/await/await.go; the SDK here is 4.34): prod's operator creates the serving
    namespace before the first `up`, for the gateway's Secrets, so that `up` failed, as it would on a platform's
    own keda or gpu-operator namespace. The provider of an existing cluster upserts (upsertExistingObjects); one
    this stack creates does not; the namespaces stay Namespace resources (a type change would delete them)."""
    rec = recording(stack_name)
    (provider,) = rec.of_type("pulumi:providers:kubernetes")
    existing = stack_name == "prod"  # prod: mode existing; dev: mode create
    assert (str(provider.inputs.get("upsertExistingObjects")).lower() == "true") == existing
    assert provider.inputs.get("clusterIdentifier")  # so the setting is an update of the provider, not a replacement
    assert {r.inputs["metadata"]["name"] for r in rec.of_type("kubernetes:core/v1:Namespace")} >= {"llm-serving"}


def test_a_protected_weight_caches_settings_survive_a_destroy_that_keeps_it():
    """`pulumi destroy --exclude-protected` keeps a protected resource and what it depends on, but deletes what
    depends on it (pulumi destroy.go getProtectedExcludes): the cache bucket stayed while its versioning was
    suspended (deleting BucketVersioning does that: pulumi_aws s3/bucket_versioning.py) and its public access
    block, TLS-only policy and default encryption went. Those four, and the lifecycle rule that aborts an interrupted
    seed's uploads, are retained on delete with the bucket."""
    rec = recording("prod")
    buckets = [r for r in rec.of_type("aws:s3/bucket:Bucket") if r.protect]
    assert buckets
    for kind in ("bucketVersioning:BucketVersioning", "bucketPublicAccessBlock:BucketPublicAccessBlock",
                 "bucketPolicy:BucketPolicy", "bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                 "bucketLifecycleConfiguration:BucketLifecycleConfiguration"):
        settings = [r for r in rec.of_type(f"aws:s3/{kind}") if r.name.startswith("weights-")]
        assert settings and all(r.retain_on_delete for r in settings), kind
