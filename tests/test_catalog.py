"""MIG layouts are validated against each GPU's profile table before anything is declared."""

import pytest
import yaml

from topology.catalog import GPU_KINDS, MigLayoutError, validate_mig_layout


@pytest.mark.parametrize(
    "gpu, devices",
    [
        ("H100-80GB", {"3g.40gb": 2}),
        ("H100-80GB", {"1g.10gb": 7}),
        ("A100-80GB", {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}),
        ("A100-40GB", {"1g.5gb": 7}),
        ("H200-141GB", {"3g.71gb": 2}),
    ],
)
def test_valid_layouts_pass(gpu, devices):
    validate_mig_layout(gpu, devices)


def test_public_blueprint_with_eight_compute_slices_is_rejected_with_the_counts():
    # 1g.10gb:3 + 2g.20gb:1 + 3g.40gb:1 on an A100-80GB = 3 + 2 + 3 = 8 compute slices
    with pytest.raises(MigLayoutError) as e:
        validate_mig_layout("A100-80GB", {"1g.10gb": 3, "2g.20gb": 1, "3g.40gb": 1})
    msg = str(e.value)
    assert "A100-80GB" in msg and "1g.10gb:3 + 2g.20gb:1 + 3g.40gb:1" in msg
    assert "8 compute slices (max 7)" in msg


def test_memory_slices_over_eight_are_rejected():
    with pytest.raises(MigLayoutError, match=r"10 memory slices \(max 8\)"):
        validate_mig_layout("H100-80GB", {"3g.40gb": 2, "1g.20gb": 1})


def test_profile_that_does_not_exist_for_that_gpu_is_named():
    with pytest.raises(MigLayoutError, match=r"unknown GPU kind 'B200'"):
        validate_mig_layout("B200", {"1g.23gb": 1})
    with pytest.raises(MigLayoutError, match=r"H100-80GB has no MIG profile 1g\.5gb; its profiles are 1g\.10gb"):
        validate_mig_layout("H100-80GB", {"1g.5gb": 7})
    with pytest.raises(MigLayoutError, match="does not support MIG"):
        validate_mig_layout("L40S-48GB", {"1g.10gb": 1})


def test_instance_limits_per_profile():
    with pytest.raises(MigLayoutError, match=r"at most 4 × 1g\.20gb"):
        validate_mig_layout("H100-80GB", {"1g.20gb": 5})


def test_catalog_matches_the_gpu_operator_default_configs(root):
    """Every homogeneous layout the planner can emit exists in the GPU operator's default mig-parted config."""
    doc = yaml.safe_load((root / "schemas" / "gpu-operator_default-mig-parted-config.yaml").read_text())
    configs = yaml.safe_load(doc["data"]["config.yaml"])["mig-configs"]
    for kind in GPU_KINDS.values():
        for p in kind.mig_profiles:
            if p.name.endswith("+me"):
                continue
            name = f"all-{p.name}"
            assert name in configs, name
            counts = [c["mig-devices"].get(p.name) for c in configs[name] if c.get("mig-enabled")]
            assert p.max_instances_per_gpu in counts, (name, counts)
