"""`python -m topology render` enforces the policy pack's rules over what it recorded: one rule set offline
and in `pulumi preview --policy-pack policies`."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import yaml

from offline.mockrun import RecordedResource, Recording, read_stack_config
from offline.render import policies_allow
from pulumi_support import ROOT, recording


def test_render_refuses_a_stack_that_breaks_a_mandatory_policy(tmp_path):
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    doc["config"]["aws:secretKey"] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # pasted in plain text
    bad = tmp_path / "Pulumi.dev.yaml"
    bad.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "topology", "render", str(bad), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("error: policy credentials-from-secret-config (mandatory): stack config aws:secretKey holds a credential "
            "in plain text. Remove it and set it with `pulumi config set --secret secretKey ...`") in r.stderr
    assert "render refused" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()  # nothing written


def test_render_prints_advisories(tmp_path, capsys):
    rec = recording("dev")
    res = copy.deepcopy(rec.resources)
    i = next(i for i, r in enumerate(res) if r.name == "guard-burst-deploy")
    inputs = copy.deepcopy(res[i].inputs)
    spec = json.loads(inputs["environment"]["LLM_SERVING_BURST_SPEC"])
    spec["burst"]["min_containers_schedule"] = [
        {"start_minute_of_week": d * 1440 + 540, "end_minute_of_week": d * 1440 + 1080, "min_containers": 1} for d in range(5)]
    inputs["environment"]["LLM_SERVING_BURST_SPEC"] = json.dumps(spec)
    res[i] = RecordedResource(**{**res[i].__dict__, "inputs": inputs})
    policies_allow(Recording("dev", res), ROOT / "stacks" / "Pulumi.dev.yaml",
                   read_stack_config(ROOT / "stacks" / "Pulumi.dev.yaml")[1])
    printed = capsys.readouterr().out
    assert "advisory [morning-floor-before-demand-rise]: endpoint guard:" in printed and "Monday 09:00" in printed
