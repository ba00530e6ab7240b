"""Nodes for clock-following floors and for queue scale-up (issue #11 item 2).

- the planner's floor windows become each on-demand pool's minimum on the clock (Auto Scaling scheduled
  actions on the group), raised the node cold start ahead of the pod window;
- Cluster Autoscaler (official chart, pinned) finds the groups and, from the node-template tags written on
  the groups themselves, can tell that an empty pool fits a pending floor pod — whole GPUs and MIG slices.
"""

from __future__ import annotations

import json

import pytest

from components.node_autoscaler import CHART_REPO, CHART_VERSION
from tests.pulumi_support import by_name, objects, recording
from topology.loading import load_inputs
from topology.node_schedule import pool_minimums, weekly_cron
from topology.plan import plan

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CA = "k8s.io/cluster-autoscaler/"


@pytest.fixture(scope="module")
def prod_spec():
    return plan(load_inputs(ROOT / "stacks" / "Pulumi.prod.yaml"))


def test_guards_weekday_second_node_is_on_the_clock_ahead_of_its_pods(prod_spec):
    """Hand-worked from the prod stack: guard's weekday window needs 14 replicas of 1g.10gb; the reserved pool
    (1 node × 1 GPU × 7 slices) carries 7, so the on-demand pool needs 1 node; its minimum rises 6 minutes
    (node cold start 360 s) before the pods' window and falls back to 0 when the window ends."""
    guard = prod_spec.endpoint("guard")
    windows = guard.floor.windows
    assert len(windows) == 5 and all(w.replicas == 14 for w in windows)
    minimums = pool_minimums(prod_spec)
    # assist and autocomplete also run a node on the clock above their reserved ones (the plan's exact costing
    # of the layer DP's schedules): assist one node, (12 − 8 reserved) / 4 per node, for each of its three
    # windows (Thursday and Sunday evenings, Saturday evening) — up before each window, down at its end
    assert set(minimums) == {"guard-on-demand", "assist-on-demand", "autocomplete-on-demand"}
    aws = prod_spec.endpoint("assist").floor.windows
    changes = minimums["assist-on-demand"]
    assert len(aws) == 3 and len(changes) == 6 and all(w.replicas == 12 for w in aws)
    ups, downs = changes[0::2], changes[1::2]
    for aw, up, down in zip(sorted(aws, key=lambda w: w.start_minute_of_week), ups, downs):
        assert (up.min_nodes, down.min_nodes) == (1, 0)
        assert up.minute_of_week < aw.start_minute_of_week and down.minute_of_week == aw.end_minute_of_week
    got = [(m.minute_of_week, m.min_nodes) for m in minimums["guard-on-demand"]]
    want = sorted([(w.start_minute_of_week - 6, 1) for w in windows] + [(w.end_minute_of_week, 0) for w in windows])
    assert got == want
    assert weekly_cron(windows[0].start_minute_of_week - 6) == "47 7 * * 1"  # Monday 07:47, New York time
    assert {m.timezone for m in minimums["guard-on-demand"]} == {"America/New_York"}


def test_a_window_wrapping_past_sunday_midnight_keeps_its_node_across_the_wrap(prod_spec):
    guard = prod_spec.endpoint("guard")
    w = guard.floor.windows[0].model_copy(update={"start_minute_of_week": 10_000, "end_minute_of_week": 60,
                                                   "replicas": 20})
    spec = prod_spec.model_copy(update={"endpoints": tuple(
        e.model_copy(update={"floor": e.floor.model_copy(update={"windows": (w,)})}) if e.name == "guard" else e
        for e in prod_spec.endpoints)})
    # 20 replicas − 7 reserved = 13 → 2 on-demand nodes of 7 slices; Sunday 22:34 until Monday 01:00
    assert [(m.minute_of_week, m.min_nodes) for m in pool_minimums(spec)["guard-on-demand"]] == [(60, 0), (9994, 2)]


def test_the_minimum_follows_the_windows_at_every_minute_of_the_week(prod_spec):
    """Random window sets for guard (overlapping, touching, wrapping past Sunday, a lead-shifted start landing on
    another window's end): the change points, replayed as a step function over the week, give at every minute
    the nodes that minute's most demanding window needs — worked here minute by minute from the window
    definitions (6-minute lead, 7 replicas on the reserved node, 7 per on-demand node, at most the pool's cap: 3
    nodes, 2 for the replicas KEDA may run and 1 for the warm previous version's pod)."""
    import random

    week = 7 * 24 * 60
    base = prod_spec.endpoint("guard").floor.windows[0]
    cap = next(p.max_nodes for p in prod_spec.node_pools if p.name == "guard-on-demand")
    assert cap == 3
    rng = random.Random(17)
    for _ in range(60):
        windows = []
        for _ in range(rng.randint(1, 4)):
            start = rng.choice([rng.randrange(week), 0, 6, week - 1])
            end = rng.choice([rng.randrange(week), (start + rng.randint(1, 600)) % week, (start + 6) % week])
            windows.append(base.model_copy(update={"start_minute_of_week": start, "end_minute_of_week": end,
                                                   "replicas": rng.randint(1, 30)}))
        spec = prod_spec.model_copy(update={"endpoints": tuple(
            e.model_copy(update={"floor": e.floor.model_copy(update={"windows": tuple(windows)})})
            if e.name == "guard" else e for e in prod_spec.endpoints)})
        replicas = [0] * week
        for w in windows:
            m = (w.start_minute_of_week - 6) % week
            while m != w.end_minute_of_week:
                replicas[m] = max(replicas[m], w.replicas)
                m = (m + 1) % week
        want = [min(cap, -(-max(0, r - 7) // 7)) for r in replicas]
        changes = pool_minimums(spec).get("guard-on-demand", ())
        if not changes:
            assert len(set(want)) == 1
            continue
        minutes = [c.minute_of_week for c in changes]
        assert minutes == sorted(set(minutes))
        got, level = [], changes[-1].min_nodes  # before the first change: the level the week ends with
        by_minute = {c.minute_of_week: c.min_nodes for c in changes}
        for m in range(week):
            level = by_minute.get(m, level)
            got.append(level)
        assert got == want, windows
        assert all(c.min_nodes != want[(c.minute_of_week - 1) % week] for c in changes)  # each one a change


def test_scheduled_actions_change_only_the_groups_minimum():
    rec = recording("prod")
    schedules = rec.of_type("aws:autoscaling/schedule:Schedule")
    # one action per change of an on-demand pool's minimum: guard's and autocomplete's 5 weekday windows
    # (up, down: 10 each) and assist's three evening windows (6)
    assert len(schedules) == 26
    # named after the pool and a digest (components/gpu_node_pool.py node_group_physical_name)
    groups = {r.inputs["nodeGroupName"].rsplit("-", 1)[0]: r for r in rec.of_type("aws:eks/nodeGroup:NodeGroup")}
    pools = ("guard-on-demand", "autocomplete-on-demand", "assist-on-demand")
    per_pool = {p: 0 for p in pools}
    for s in schedules:
        i = s.inputs
        # -1 = unchanged; the provider's default is 0, which would empty the group at every action
        assert i["maxSize"] == -1 and i["desiredCapacity"] == -1
        (pool,) = [p for p in pools if i["autoscalingGroupName"].startswith(f"eks-{p}-")]
        per_pool[pool] += 1
        assert 0 <= i["minSize"] <= groups[pool].inputs["scalingConfig"]["maxSize"]
        assert i["timeZone"] == "America/New_York"
    assert per_pool == {"guard-on-demand": 10, "autocomplete-on-demand": 10, "assist-on-demand": 6}


def asg_templates(rec) -> dict[str, dict]:
    """What Cluster Autoscaler reads from each group's tags: discovery, labels, taints, resources."""
    groups: dict[str, dict] = {}
    for t in rec.of_type("aws:autoscaling/tag:Tag"):
        g = groups.setdefault(t.inputs["autoscalingGroupName"], {"tags": {}, "labels": {}, "taints": {}, "resources": {}})
        key, value = t.inputs["tag"]["key"], t.inputs["tag"]["value"]
        assert t.inputs["tag"]["propagateAtLaunch"] is False
        g["tags"][key] = value
        for kind in ("label", "taint", "resources"):
            prefix = f"{CA}node-template/{kind}/"
            if key.startswith(prefix):
                g["labels" if kind == "label" else "taints" if kind == "taint" else "resources"][key[len(prefix):]] = value
    return groups


def fits(pod: dict, template: dict) -> bool:
    """The scheduler's predicates CA simulates on a template node: selector, taints, extended resources."""
    if any(template["labels"].get(k) != v for k, v in pod.get("nodeSelector", {}).items()):
        return False
    tolerated = {t["key"] for t in pod.get("tolerations", []) if t.get("operator") == "Exists"}
    if any(k not in tolerated for k in template["taints"]):
        return False
    for c in pod["containers"]:
        for res, qty in c.get("resources", {}).get("requests", {}).items():
            if "/" in res and int(template["resources"].get(res, "0")) < int(qty):
                return False
    return True


@pytest.mark.parametrize("stack", ["prod"])
def test_every_pool_can_grow_from_zero_for_its_pods_whole_gpus_and_mig_slices(stack):
    rec = recording(stack)
    cluster = rec.outputs["clusterName"]
    templates = asg_templates(rec)
    node_groups = {r.inputs["nodeGroupName"]: r.inputs for r in rec.of_type("aws:eks/nodeGroup:NodeGroup")}
    assert len(templates) == len(node_groups)
    by_pool = {}
    for asg, t in templates.items():
        group = asg.removeprefix("eks-").rsplit("-", 1)[0]
        by_pool[group.rsplit("-", 1)[0]] = t  # the group is named after its pool and a digest
        ng = node_groups[group]
        # discovery by the chart's default tags
        assert t["tags"][f"{CA}enabled"] == "true" and t["tags"][f"{CA}{cluster}"] == "owned"
        # the template says what the group's nodes will really carry
        assert t["labels"] == ng["labels"]
        assert t["taints"] == {x["key"]: f"{x['value']}:NoSchedule" for x in ng["taints"] if x["effect"] == "NO_SCHEDULE"}
    spec = rec.outputs["spec"]
    pools = {p["name"]: p for p in spec["node_pools"]}
    for name, p in pools.items():
        res = by_pool[name]["resources"]
        if p["mig_layout"]:
            assert res == {**{f"nvidia.com/mig-{prof}": str(n * p["gpus_per_node"]) for prof, n in p["mig_layout"]["devices"].items()},
                           "nvidia.com/gpu": "0"}
        else:
            assert res == {"nvidia.com/gpu": str(p["gpus_per_node"])}

    deployments = by_name(objects(rec, "Deployment"))
    for e in spec["endpoints"]:
        if not e["node_pools"]:
            continue
        pod = deployments[f"{e['name']}-vllm"]["spec"]["template"]["spec"]
        on_demand = [n for n in e["node_pools"] if pools[n]["capacity_type"] == "on_demand"]
        assert on_demand and all(fits(pod, by_pool[n]) for n in on_demand), e["name"]
        # and no other endpoint's pool would be chosen for it
        assert not any(fits(pod, by_pool[n]) for n in pools if n not in e["node_pools"])


def test_cluster_autoscaler_from_the_official_chart_with_its_own_pod_identity():
    rec = recording("prod")
    [release] = [r for r in rec.of_type("kubernetes:helm.sh/v3:Release") if r.inputs["chart"] == "cluster-autoscaler"]
    i = release.inputs
    assert (i["version"], i["repositoryOpts"]["repo"]) == (CHART_VERSION, CHART_REPO) == ("9.59.0", "https://kubernetes.github.io/autoscaler")
    v = i["values"]
    assert v["autoDiscovery"]["clusterName"] == rec.outputs["clusterName"]
    assert v["awsRegion"] == "us-east-1" and v["cloudProvider"] == "aws"
    assert v["rbac"]["serviceAccount"] == {"create": True, "name": "cluster-autoscaler"}
    assert v["image"]["tag"].startswith("v1.33.")  # matches the cluster's minor version
    [assoc] = [a for a in rec.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
               if a.inputs["serviceAccount"] == "cluster-autoscaler"]
    assert assoc.inputs["namespace"] == "kube-system"
    assert any(d.rsplit("::", 1)[1] == "node-autoscaler-pod-identity" for d in release.dependencies)
    [policy] = [p for p in rec.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == "node-autoscaler-role-policy"]
    doc = json.loads(policy.inputs["policy"])
    scale = next(s for s in doc["Statement"] if "autoscaling:SetDesiredCapacity" in s["Action"])
    assert scale["Condition"] == {"StringEquals": {f"aws:ResourceTag/{CA}{rec.outputs['clusterName']}": "owned"}}


def test_a_later_up_keeps_the_nodes_the_autoscaler_added():
    """Pulumi fills an ignore_changes field with its old input (pulumi step_generator.go processIgnoreChanges) and
    the AWS provider sends the declared desired size with any change of a node group's bounds
    (terraform-provider-aws expandNodegroupScalingConfig): a desired size declared at the minimum and ignored set
    an on-demand pool back to 0 nodes whenever its maximum moved, under its floor replicas. A later `up` declares the
    size EKS reports, within the new bounds; a pool not created yet, its minimum."""
    from offline.mockrun import read_stack_config, run_program

    stack, config = read_stack_config(Path(__file__).resolve().parent.parent / "stacks" / "Pulumi.prod.yaml")
    first = {r.inputs["nodeGroupName"]: r.inputs["scalingConfig"]
             for r in run_program(stack, config).resources if r.type == "aws:eks/nodeGroup:NodeGroup"}
    on_demand = {n: c for n, c in first.items() if c["minSize"] < c["maxSize"]}
    assert on_demand and all(c["desiredSize"] == c["minSize"] == 0 for c in on_demand.values())
    # the autoscaler has grown each on-demand pool: to 2 nodes, and one past what the plan now allows
    live = {n: 2 for n in on_demand}
    over = max(on_demand, key=lambda n: -on_demand[n]["maxSize"])  # the smallest maximum
    live[over] = on_demand[over]["maxSize"] + 1
    later = {r.inputs["nodeGroupName"]: r for r in run_program(stack, config, node_groups=live).resources
             if r.type == "aws:eks/nodeGroup:NodeGroup"}
    for n, c in first.items():
        got = later[n].inputs["scalingConfig"]
        assert (got["minSize"], got["maxSize"]) == (c["minSize"], c["maxSize"])
        if n in on_demand:
            assert got["desiredSize"] == min(live[n], c["maxSize"]), n
        else:  # a reserved pool (min = max) declares its size
            assert got["desiredSize"] == c["minSize"], n
        assert "scalingConfig.desiredSize" not in later[n].ignore_changes
