"""The gateway pod's image against what it really is (issue #12 items 1-3).

Facts from docker-library/haproxy (3.0/Dockerfile, "Update 3.0 to 3.0.25", commit 84fe98d; read at ec437dd): the
image creates its user with `useradd --uid 99` / `groupadd --gid 99` and switches to it by name
(`USER haproxy`); it installs Debian's ca-certificates for @system-ca. The kubelet refuses `runAsNonRoot` for an image whose user is a
name unless the pod states a numeric `runAsUser` ("image has non-numeric user").
"""

from __future__ import annotations

import os
import ssl
import subprocess
from dataclasses import replace

import pytest

from components.gateway_config import HAPROXY_IMAGE, StaticServers, render_gateway_config
from tests.fake_upstream import FakeUpstream
from tests.gateway_harness import (HaproxyProcess, no_recorder, free_port, local_haproxy_major_minor, lua_path, pod_ca_dir,
                                   require_haproxy)
from tests.test_gateway import body, post
from tests.test_gateway_component import declare

IMAGE_UID = IMAGE_GID = 99  # docker-library/haproxy 3.0/Dockerfile: useradd --uid 99, groupadd --gid 99


def test_pod_runs_as_the_images_numeric_user(planned_stacks):
    rec = declare(planned_stacks["prod"][1])
    (dep,) = [o for o in rec.kubernetes_objects() if o["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    # the kubelet's rule: with runAsNonRoot and a named image user, only a numeric runAsUser passes
    assert isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] != 0
    assert (sc["runAsUser"], sc.get("runAsGroup")) == (IMAGE_UID, IMAGE_GID)


def test_image_is_the_haproxy_line_the_tests_run():
    binary = require_haproxy()
    (container_image,) = {HAPROXY_IMAGE.tag}
    assert container_image.startswith("haproxy:")
    assert HAPROXY_IMAGE.major_minor == local_haproxy_major_minor(binary), (
        f"the pod runs {HAPROXY_IMAGE.tag} but the config is validated and exercised with "
        f"haproxy {local_haproxy_major_minor(binary)}: pin the same release line")


def test_deployment_uses_the_one_stated_tag(planned_stacks):
    rec = declare(planned_stacks["prod"][1])
    (dep,) = [o for o in rec.kubernetes_objects() if o["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == HAPROXY_IMAGE.tag


def _render_cluster_like(spec, tmp_path, ca_dir, burst_url="https://acme-prod--assist.modal.run"):
    rendered = render_gateway_config(
        spec, quality_servers=no_recorder(), burst_urls={"assist": burst_url, "autocomplete": burst_url},
        floor_servers={e.name: StaticServers(("127.0.0.1:1",)) for e in spec.endpoints},
        canary_servers={e.name: StaticServers(("127.0.0.1:1",)) for e in spec.endpoints},
        binds={e.name: f"127.0.0.1:{free_port()}" for e in spec.endpoints if e.tier != "managed_api"},
        shadow_binds={e.name: f"127.0.0.1:{free_port()}" for e in spec.endpoints if e.tier != "managed_api"},
        stats_bind=f"127.0.0.1:{free_port()}", lua_path=lua_path(tmp_path), ca_path=str(ca_dir))
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    return rendered


def _haproxy_check(binary, tmp_path, rendered):
    env = {**os.environ, **{var: f"test-{key}" for var, key in rendered.secret_env.items()}}
    return subprocess.run([binary, "-c", "-f", str(tmp_path / "haproxy.cfg")], env=env,
                          capture_output=True, text=True, timeout=30)


def test_rendered_config_draws_no_rule_order_warning(planned_stacks, tmp_path):
    # HAProxy runs a backend's http-request rules before its use-server rules whatever their order in the
    # text, and warns when the text reads otherwise: the rendered config says what runs
    binary = require_haproxy()
    rendered = _render_cluster_like(planned_stacks["prod"][1], tmp_path, pod_ca_dir(tmp_path / "ca"))
    out = _haproxy_check(binary, tmp_path, rendered)
    assert out.returncode == 0, out.stderr
    assert "will still be processed before" not in out.stdout + out.stderr


def test_tls_to_modal_has_a_trust_store_in_the_pod(planned_stacks, tmp_path):
    binary = require_haproxy()
    spec = planned_stacks["prod"][1]
    rendered = _render_cluster_like(spec, tmp_path, pod_ca_dir(tmp_path / "ca"))
    out = _haproxy_check(binary, tmp_path, rendered)
    assert out.returncode == 0, out.stderr
    assert "0 CA were loaded" not in out.stdout + out.stderr
    # the same check sees the defect: an image without a trust store (as haproxy:2.6.12 was)
    bare = tmp_path / "bare"
    bare.mkdir()
    rendered = _render_cluster_like(spec, bare, pod_ca_dir(bare / "ca", replace(HAPROXY_IMAGE, trust_store_package=None)))
    out = _haproxy_check(binary, bare, rendered)
    assert "0 CA were loaded" in out.stdout + out.stderr


def _self_signed(tmp_path, name):
    key, crt = tmp_path / f"{name}.key", tmp_path / f"{name}.crt"
    # SAN DNS and IP 127.0.0.1: haproxy checks the name it sent as SNI against the DNS names
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=DNS:127.0.0.1,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True, timeout=60)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    return ctx, crt


@pytest.mark.parametrize("trusted", [False, True], ids=["unknown-ca-refused", "known-ca-served"])
def test_burst_tls_is_verified_against_the_trust_store(planned_stacks, tmp_path, trusted):
    binary = require_haproxy()
    spec = planned_stacks["dev"][1]  # assist is serverless_only there: everything goes to burst
    gated = [e.name for e in spec.endpoints if e.tier != "managed_api"]
    ctx, crt = _self_signed(tmp_path, "burst")
    ca = pod_ca_dir(tmp_path / "ca")
    if trusted:  # the pod's CAs plus this test's own CA, as Modal's chain is to a public root there
        (ca / "test-burst-ca.pem").write_text(crt.read_text())
    burst = FakeUpstream("burst", tls=ctx).start()
    port = free_port()
    try:
        rendered = render_gateway_config(
            spec, quality_servers=no_recorder(), burst_urls={n: f"https://{burst.address}" for n in gated}, floor_servers={},
            canary_servers={n: StaticServers((f"127.0.0.1:{free_port()}",)) for n in gated},
            binds={n: f"127.0.0.1:{port if n == 'assist' else free_port()}" for n in gated},
            shadow_binds={n: f"127.0.0.1:{free_port()}" for n in gated},
            stats_bind=f"127.0.0.1:{free_port()}", lua_path=lua_path(tmp_path), ca_path=str(ca))
        env = {var: f"test-{key}" for var, key in rendered.secret_env.items()}
        proc = HaproxyProcess(rendered, tmp_path, env, [port])
        try:
            status, headers, _, rid = post(port, body(), key=env["GW_ASSIST_ACME_API_KEY"])
        finally:
            proc.stop()
    finally:
        burst.stop()
    seen = [r for r in burst.log.completions() if r.request_id == rid]
    if trusted:
        assert status == 200 and headers["x-served-by"] == "burst" and len(seen) == 1
    else:
        # no request over a connection the store cannot vouch for
        assert status == 503 and headers.get("x-served-by") is None and seen == []
