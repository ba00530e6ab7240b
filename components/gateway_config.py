"""Render the HAProxy gateway configuration from the TopologySpec. Pure: no pulumi import.

One frontend per endpoint (its own port), each with a floor backend (session-sticky rendezvous
hashing in Lua, `maxconn` = this pod's share of the spec's overflow threshold per replica), a
burst backend (Modal, proxy-auth headers injected from environment variables that Kubernetes fills
from a Secret) and, when the spec has a canary, a candidate backend chosen by a stable hash of the
user or session; a canary user is sent to the incumbent when every candidate replica is full or none
is up. In the rollout's shadow stage a share of requests is mirrored to the candidate by a Lua task
through a loopback-only frontend: the user's request never waits for it (see `llm_shadow`).

What each piece enforces:
- overflow: the session key picks its replica (rendezvous hashing); if that one is at the
  threshold the next in the key's order, and when every replica is at the threshold the request
  goes to burst; decided before any byte goes upstream, so nothing waits in HAProxy's queue;
- bodies: 413 above max_request_body_bytes from Content-Length alone, before reading the body; the
  (size-capped) body is then buffered and checked by Lua (`gateway_lua.py`): the whole body valid JSON
  and an object, max_tokens within the endpoint cap (when absent from a chat request the engine's own cap
  applies: not stamped, which would refuse prompts longer than max_model_len − cap; stamped on a completion
  request, where vLLM's default is 16), no client-chosen cache_salt;
  the tenant's salt is stamped into the body, which is where vLLM reads it; an Idempotency-Key already
  in flight for the tenant gets 409;
- streams: responses are never buffered (`http-no-delay`, `X-Accel-Buffering: no`); a Lua response
  filter enforces the first-byte and inter-chunk gap limits and ends a stalled stream with an SSE
  error event, and sends an SSE comment after the spec's heartbeat interval of silence; there is no
  total request timeout on a stream;
- retries: `retries` = max_retries, only when the connection failed (refused, reset or TLS failure
  before the request was sent), redispatched to another replica. Never after the request went out:
  a request that crashes a replica before it answers ("empty response") would crash the next one.
  Such retries cost an engine nothing (the kernel refused), so no retry budget guards them; HAProxy
  2.6 cannot budget them per request anyway (`disable-l7-retry` leaves connection retries alone).

Secrets never appear in the rendered text: HAProxy expands "${VAR}" at start-up, and a `.if`
guard refuses to start when one is empty (an empty API key would otherwise match "Bearer ").
`managed_api` endpoints are not behind this gateway (the client calls the provider directly), so
they get no frontend. The same `render_gateway_config` output is what the tests run on loopback.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence
from urllib.parse import urlsplit

from components.gateway_lua import GATEWAY_LUA
from components.names import burst_backend_name, config_name, floor_backend_name
from topology.names import env_name  # noqa: F401  (components.gateway and tests import it from here)
from topology.gateway_timing import GATEWAY_CLIENT_IDLE_S
from topology.spec import CanarySpec, EndpointSpec, TopologySpec

@dataclass(frozen=True)
class HaproxyImage:
    """The gateway image, stated once: the component deploys `tag`, the tests check that the local
    haproxy they validate and run the config with has the same major.minor, and build a CA
    directory from `trust_store_package` holding exactly what the pod's `ca_dir` holds.

    Checked in docker-library/haproxy (3.0/Dockerfile at ec437dd, "Update 3.0 to 3.0.25", 2026-07-03):
    FROM debian:trixie-slim; `apt-get install ca-certificates` (for @system-ca); `groupadd --gid 99`,
    `useradd --uid 99`; `USER haproxy` (a name, so the kubelet needs runAsUser to prove non-root); built with
    Lua 5.4, OpenSSL, PCRE2 JIT and the Prometheus exporter (USE_PROMEX), options dev.py builds the tests'
    HAProxy with. The `-trixie` suffix pins the Debian release under it. 3.0 (LTS to 2029-Q2) rather than 2.6:
    its response forwarder still calls the Lua filter when an upstream cuts a stream, so the client can be
    sent an error event (#18 item 6; 2.6 took an error branch first).
    """

    tag: str
    uid: int
    gid: int
    trust_store_package: str | None  # Debian package that fills ca_dir; None: the image has no CA
    ca_dir: str = "/etc/ssl/certs"

    @property
    def major_minor(self) -> str:
        m = re.fullmatch(r"[^:]+:(\d+)\.(\d+)(?:\.\d+)?(?:-.*)?", self.tag)
        if m is None:
            raise ValueError(f"image tag {self.tag!r} has no major.minor version")
        return f"{m.group(1)}.{m.group(2)}"


HAPROXY_IMAGE = HaproxyImage(tag="haproxy:3.0.25-trixie", uid=99, gid=99, trust_store_package="ca-certificates")

GATEWAY_BASE_PORT = 8080  # a lone endpoint listens here; several: the stack's llm-serving:gateway.ports
SHADOW_BASE_PORT = 9080  # the i-th gated endpoint's shadow mirrors enter on 127.0.0.1:9080 + i (inside the pod only)
STATS_PORT = 8404  # /healthz for probes, /metrics (Prometheus exporter built into HAProxy)
LUA_FILE = "gateway.lua"
CONFIG_FILE = "haproxy.cfg"
MODAL_KEY_ENV = "GW_MODAL_KEY"
MODAL_SECRET_ENV = "GW_MODAL_SECRET"
BODY_WAIT_S = 10  # longest a client may take to upload a (size-capped) body
STATS_CONNECTIONS = 50  # kept for probes and the exporter on top of the endpoints' maxconn (a flood cannot starve them)
STREAM_BACKSTOP_MS = 1000  # native idle timeout = first-byte limit + this, so the Lua filter acts first
CONNECT_TIMEOUT_S = 3  # one connection attempt to an upstream (HAProxy's `timeout connect`)
# HAProxy waits min(timeout connect, 1 s) before a retry on the same server (doc/configuration.txt "retries",
# src/backend.c back_handle_st_cer, 3.0.11)
RETRY_TURNAROUND_MAX_MS = 1000
# (status, OpenAI error type, message) of each error HAProxy answers itself (defaults' http-error)
HAPROXY_ERRORS = (
    (400, "invalid_request_error", "the request is not valid HTTP"),
    (403, "invalid_request_error", "request refused"),
    (404, "invalid_request_error", "not an endpoint of this API"),
    (405, "invalid_request_error", "method not allowed here"),
    (408, "invalid_request_error", "request not received in time"),
    (410, "invalid_request_error", "no longer served"),
    (413, "invalid_request_error", "request too large"),
    (421, "invalid_request_error", "request sent to the wrong host"),
    (422, "invalid_request_error", "the request framing cannot be processed"),
    (425, "invalid_request_error", "request sent too early; retry"),
    (429, "rate_limit_error", "too many requests"),
    (500, "gateway_error", "the gateway failed on this request"),
    (501, "gateway_error", "not implemented by the gateway"),
    (502, "gateway_error", "upstream failed before responding"),
    (503, "gateway_error", "no upstream available"),
    (504, "gateway_error", "upstream sent no response in time"),
)
HEADER_ROOM_BYTES = 16384  # headers + the stamped prefix on top of the largest allowed body
HAPROXY_MAXREWRITE = 1024  # tune.maxrewrite's default (MAXREWRITE, HAProxy 3.0 defaults.h): kept free of reads
# allowance for HTX's bookkeeping when the request line, headers and body fill the buffer (measured on 3.0.11 with a
# body at assist's cap: full at ≈ 118 bytes below bufsize − maxrewrite; about 100 bytes + 4 a header)
HTX_OVERHEAD_BYTES = 512
# Quality sampling (spec rollout.quality_sampling; see `llm_quality` in gateway_lua.py): sampled exchanges are
# posted to the quality recorder through a loopback-only frontend (inside the pod only)
QUALITY_PORT = 9180
QUALITY_BYTES_PER_TOKEN = 512  # a vLLM SSE chunk carries one token in ~200-300 bytes of JSON; room for it
QUALITY_MAX_CAPTURE_BYTES = 1 << 20  # response bytes kept per sampled exchange; beyond: recorded as truncated
QUALITY_MAX_CAPTURES = 64  # sampled exchanges in progress per endpoint and pod (≤ 64 MiB of copies); beyond: dropped
QUALITY_MAX_POSTS = 16  # record posts in flight per pod; beyond: dropped (the recorder answers at once when up)
QUALITY_POST_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class StaticServers:
    """Explicit upstream addresses ("host:port"), e.g. fake upstreams in tests."""

    addresses: tuple[str, ...]


@dataclass(frozen=True)
class DnsServers:
    """A headless Service: one server slot per pod IP, resolved at run time (per-replica in-flight)."""

    hostname: str
    port: int
    slots: int


Servers = StaticServers | DnsServers


@dataclass(frozen=True)
class ClientLimits:
    """What one client (source) may hold at the gateway, against slow-connection floods (#18 item 4).

    source: what identifies a client. "src": the TCP peer (right when clients reach the pods directly, or
    through a load balancer that keeps client addresses); "proxy_protocol": the address the load balancer
    passes in the PROXY protocol header (binds get `accept-proxy`; the LB must send it); "xff": the last
    X-Forwarded-For value, appended by a trusted load balancer that hides client addresses. With "xff" the
    per-client limits apply once a request's headers are in, so header tricklers are bounded only by
    header_timeout_s (and the load balancer's own limits).
    max_conn_per_source: concurrent connections (xff: requests) per client; 0 = a tenth of max_connections,
    so no single client can take more than a tenth of the gateway.
    max_requests_per_source_10s: request starts per client per 10 s (0 = 10 × max_conn_per_source); above it 429.
    header_timeout_s: the whole request head must arrive within this (HAProxy `timeout http-request`);
    a client trickling its headers is dropped then. Honest clients send their head in one packet.
    """

    source: str = "src"
    max_conn_per_source: int = 0
    max_requests_per_source_10s: int = 0
    header_timeout_s: float = 5.0

    def resolved(self, max_connections: int) -> "ClientLimits":
        if self.source not in ("src", "proxy_protocol", "xff"):
            raise ValueError(f"ClientLimits.source={self.source!r}: allowed are 'src', 'proxy_protocol', 'xff'")
        if self.max_conn_per_source < 0 or self.max_requests_per_source_10s < 0 or not self.header_timeout_s > 0:
            raise ValueError(f"ClientLimits: limits must be >= 0 and header_timeout_s > 0, got {self}")
        conns = self.max_conn_per_source or max(1, max_connections // 10)
        return ClientLimits(self.source, conns, self.max_requests_per_source_10s or 10 * conns, self.header_timeout_s)


@dataclass(frozen=True)
class RenderedGateway:
    files: dict[str, str]
    secret_env: dict[str, str] = field(default_factory=dict)
    """Environment variable -> key in the Secret that fills it (API keys, cache salts, Modal auth)."""
    ports: dict[str, int] = field(default_factory=dict)
    """Endpoint -> listening port in the cluster (tests bind elsewhere)."""


def gated_endpoints(spec: TopologySpec) -> list[EndpointSpec]:
    """Endpoints served through the gateway: everything except managed_api."""
    return [e for e in spec.endpoints if e.gated]


def endpoint_ports(spec: TopologySpec, ports: Mapping[str, int] | None = None) -> dict[str, int]:
    """Each gated endpoint's listening port: from `ports` (the stack's llm-serving:gateway.ports, checked by
    components.stack_settings.gateway_ports), else by position from GATEWAY_BASE_PORT (one endpoint, or tests)."""
    if ports is None:
        return {e.name: GATEWAY_BASE_PORT + i for i, e in enumerate(gated_endpoints(spec))}
    return {e.name: int(ports[e.name]) for e in gated_endpoints(spec)}


def reserved_ports(n_endpoints: int) -> dict[int, str]:
    """Ports the gateway pod uses itself or may (no endpoint may listen on one): what each is for. The shadow
    listeners' whole range, not only the gated endpoints' share: a port accepted now must stay valid when another
    endpoint comes behind the gateway."""
    out = {p: "a shadow-mirror loopback listener" for p in range(SHADOW_BASE_PORT, QUALITY_PORT)}
    out.update({STATS_PORT: "the probes and metrics listener", QUALITY_PORT: "the quality-sample loopback listener"})
    if n_endpoints > QUALITY_PORT - SHADOW_BASE_PORT:
        raise ValueError(f"{n_endpoints} gated endpoints: the shadow listeners have room for "
                         f"{QUALITY_PORT - SHADOW_BASE_PORT}")
    return out


def per_pod_threshold(overflow_inflight_per_replica: int, gateway_replicas: int) -> int:
    """In-flight per floor replica one gateway pod allows: its share of the spec's threshold
    (rounded down, so all pods together never exceed it; at least 1)."""
    return max(1, overflow_inflight_per_replica // gateway_replicas)


def shadow_cap_of(e: EndpointSpec, gateway_replicas: int) -> int:
    """Mirrors one gateway pod keeps in flight for the endpoint's shadow (0: no shadow)."""
    return per_pod_threshold(e.gateway.shadow.max_inflight, gateway_replicas) if e.gateway.shadow is not None else 0


def connection_shares(endpoints: Sequence[EndpointSpec], max_connections: int) -> dict[str, int]:
    """Each endpoint frontend's maxconn: max_connections apportioned by what the endpoint can hold in flight at
    once (its floor at its most replicas × the per-replica admission cap, plus the burst's), largest remainders
    first, at least 1 each; they sum to max_connections. HAProxy's global maxconn is one per-process pool with no
    per-listener reserve ("Proxies will stop accepting connections when this limit is reached", 3.0
    configuration.txt): with every endpoint frontend at max_connections, three busy endpoints under their own
    limits filled the pool and the stats listener stopped accepting, so the kubelet's probes timed out and
    restarted both pods, every stream with them."""
    if max_connections < len(endpoints):
        raise ValueError(f"max_connections {max_connections} < {len(endpoints)} endpoint frontends: each needs one")
    weights = {}
    for e in endpoints:
        floor = 0
        if e.floor is not None and e.floor.replicas_by_hour:
            most = max(max(e.floor.replicas_by_hour), e.autoscaling.max_replicas if e.autoscaling else 0)
            floor = most * max(e.gateway.admission_inflight_per_floor_replica, e.gateway.overflow_inflight_per_replica)
        weights[e.name] = max(1, floor + (e.gateway.admission_burst_inflight if e.burst is not None else 0))
    total = sum(weights.values())
    spare = max_connections - len(endpoints)  # one each first, the rest by weight
    exact = {n: spare * w / total for n, w in weights.items()}
    shares = {n: 1 + int(x) for n, x in exact.items()}
    left = max_connections - sum(shares.values())
    for n in sorted(exact, key=lambda n: (-(exact[n] - int(exact[n])), n))[:left]:
        shares[n] += 1
    return shares


def floor_capacity(overflow_inflight_per_replica: int, replicas: int, gateway_replicas: int = 1) -> int:
    """Requests one gateway pod sends to the floor before overflowing to burst."""
    return replicas * per_pod_threshold(overflow_inflight_per_replica, gateway_replicas)


def request_limit_s(e: EndpointSpec) -> int:
    """Longest a single request may run. A non-streamed completion sends nothing until it is done,
    so this is its only limit (max_tokens at the inter-token SLO, plus prefill, from the spec)."""
    g = e.gateway
    return max(g.max_request_s, g.first_byte_timeout_s)


def idempotency_claim_ttl_ms(e: EndpointSpec) -> int:
    """How long an Idempotency-Key claim lasts before the request's response starts (and, counted from each
    renewal, while a stream is alive): every wait after the claim, which the gate takes once the body is in
    (wait-for-body comes before it). Each of the max_retries + 1 connection attempts may wait in the queue
    (HAProxy gives a requeued request a fresh `timeout queue`) and for the connection, with HAProxy's
    turn-around before a retry; then the response headers come within `timeout server` (the whole request
    when not streamed, the first-byte backstop when streamed). A stream renews its claim every third of this
    from the llm filter's watch, which runs at least every heartbeat or gap limit: never less than twice the
    longer gap limit, so a renewal due at a third lands by five sixths of it, a sixth before the expiry. The
    expiry is only the backstop for a claim whose stream ended without its release."""
    g = e.gateway
    first_ms, inter_ms = _ms(g.first_byte_timeout_s), _ms(g.inter_chunk_timeout_s)
    connect_ms = CONNECT_TIMEOUT_S * 1000
    # `timeout queue` of the backends a user's request may take (see common() in _endpoint_sections): floor and
    # burst wait the admission timeout, the canary (and every backend without admission control) the first-byte limit
    queue_ms = first_ms
    if g.admission_queue_timeout_s is not None:
        queue_ms = _ms(g.admission_queue_timeout_s)
        if g.canary is not None:
            queue_ms = max(queue_ms, first_ms)
    attempts = g.max_retries + 1
    before_response_ms = (attempts * (queue_ms + connect_ms) + g.max_retries * min(connect_ms, RETRY_TURNAROUND_MAX_MS)
                          + max(_ms(request_limit_s(e)), first_ms + STREAM_BACKSTOP_MS))
    return max(before_response_ms, 2 * max(first_ms, inter_ms))


def longest_request_s(spec: TopologySpec) -> int:
    return max(request_limit_s(e) for e in gated_endpoints(spec))


def needs_floor(e: EndpointSpec) -> bool:
    return e.has_floor


def needs_burst(e: EndpointSpec) -> bool:
    return e.has_burst


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


# What a tenant may call through an endpoint frontend (exact paths, no query string in the match): generation by
# POST, the model list by GET. Everything else the engine serves is refused at the gateway (endpoint_frontend).
SERVED_POST_PATHS = ("/v1/chat/completions", "/v1/completions")
SERVED_GET_PATHS = ("/v1/models",)

def adapter_rule(e: EndpointSpec) -> bool:
    """Several tenants share the endpoint's engine and it serves LoRA adapters: an adapter named `<tenant>-…` is
    then that tenant's alone (the gateway refuses the name to the others; any other name is shared), and the
    gateway answers the model list itself (the engine's would name every tenant's adapters it has loaded: vLLM
    0.11.0 serving_models.py show_available_models). vLLM's filesystem resolver loads any adapter a request names.
    A tenant name that is another's prefix with its dash (`acme`, `acme-eu`) would blur the rule: refused."""
    if not (len(e.gateway.tenants) > 1 and e.engine.serves_lora):
        return False
    names = [t.name for t in e.gateway.tenants]
    for a in names:
        for b in names:
            if a != b and b.startswith(a + "-"):
                raise ValueError(f"endpoint {e.name!r}: tenant {b!r} starts with tenant {a!r} and a dash, so {a!r}'s "
                                 f"adapters ({a}-…) would include {b!r}'s; rename one of them")
    return True


# The client's own request id travels to the engines in this header, never as their request id (request_ids)
CLIENT_REQUEST_ID_HEADER = "X-Client-Request-Id"
MAX_CLIENT_REQUEST_ID = 255  # bytes of a client's X-Request-Id (as an Idempotency-Key's); longer: 400


def request_ids() -> list[str]:
    """Rules that give each request the gateway's own id upstream.

    vLLM takes a request's id from its X-Request-Id header (0.11.0 entrypoints/openai/serving_engine.py
    `_base_request_id`; chat's id is `chatcmpl-<it>`) and refuses a second request while one with the same id runs
    ("Request id … already running", v1/engine/output_processor.py). Engines are shared by tenants (and a burst
    container by every pod of the gateway), so a client's id, which another tenant's client may use as well
    (counters from 1, a fixed string, a retry that reuses it), would fail unrelated requests. Upstream the header is
    the gateway's unique id (`unique-id-format`: a random UUID, so neither the pod's name nor a count reaches
    clients, whose response body `id` vLLM builds from it; logged as %ID); the client's id goes along as
    X-Client-Request-Id, stays the quality record's request id (the gateway's where the client sent none), and comes
    back as the response's X-Request-Id (the gateway's id where the client sent none)."""
    return [
        f"    http-request set-header {CLIENT_REQUEST_ID_HEADER} %[var(txn.client_rid)] if {{ var(txn.client_rid) -m found }}",
        "    http-request set-header X-Request-Id %[unique-id]",
    ]


def _json_reply(status: int, message: str, kind: str, close: bool = False) -> str:
    """The reply part of an OpenAI-style JSON error (`http-request return` and `http-error` take the same words).
    HAProxy single-quoted string: no escaping needed for these fixed messages. close: the request's body was not all
    read, so the connection cannot carry another request (HAProxy's own 400 and 408 pages say so too)."""
    return (
        f"status {status} content-type application/json " + ("hdr Connection close " if close else "")
        + f"string '{{\"error\":{{\"message\":\"{message}\",\"type\":\"{kind}\",\"code\":{status}}}}}'"
    )


def _json_error(status: int, message: str, kind: str, close: bool = False) -> str:
    return "http-request return " + _json_reply(status, message, kind, close)


def _parse_burst_url(endpoint: str, url: str) -> tuple[str, int, bool]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"burst URL for endpoint {endpoint!r} must be http(s)://host[:port], got {url!r}")
    if parts.path not in ("", "/"):
        raise ValueError(f"burst URL for endpoint {endpoint!r} must have no path, got {url!r}")
    tls = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if tls else 80), tls


def _is_ip(host: str) -> bool:
    return bool(re.fullmatch(r"[0-9.]+|\[?[0-9a-fA-F]*:[0-9a-fA-F:]*\]?", host))


def _server_lines(prefix: str, servers: Servers, options: str) -> list[str]:
    if isinstance(servers, StaticServers):
        if not servers.addresses:
            raise ValueError(f"{prefix}: no server addresses given")
        return [f"    server {prefix}{i + 1} {a} {options}" for i, a in enumerate(servers.addresses)]
    if servers.slots < 1:
        raise ValueError(f"{prefix}: DnsServers.slots must be >= 1, got {servers.slots}")
    return [
        f"    server-template {prefix} {servers.slots} {servers.hostname}:{servers.port} "
        f"{options} resolvers cluster init-addr none"
    ]


def _slot_count(servers: Servers) -> int:
    return len(servers.addresses) if isinstance(servers, StaticServers) else servers.slots


def _canary_seed(canary: CanarySpec) -> int:
    # a new candidate reshuffles who is in the canary; the same candidate never does. Seeded by the candidate's
    # model-version name (a new identity must take a new name: topology/plan/rollout.py), not its weights revision:
    # an engine-only candidate (KV dtype, quantization, image) on the incumbent's weights would otherwise canary the
    # very users every earlier candidate on those weights did, so the same users carried every risk
    return int.from_bytes(hashlib.sha256((canary.version or canary.revision).encode()).digest()[:4], "big")


def _ns_cap_lines(ns_cap: int) -> list[str]:
    """Burst backend: a non-streamed request gets the stamp with max_tokens lowered to ns_cap (llm_gate
    prepared it; the llm filter applies it when txn.ns_capped is set) and its new Content-Length."""
    if ns_cap <= 0:
        return []
    return ["    http-request set-var(txn.ns_capped) int(1) if { var(txn.gate_len_b) -m found }",
            "    http-request set-header Content-Length %[var(txn.gate_len_b)] if { var(txn.ns_capped) -m found }"]


def _secret_guards(secret_env: Mapping[str, str]) -> list[str]:
    lines = []
    for var, key in secret_env.items():
        lines += [f'.if streq("${{{var}}}","")', f'.alert "gateway secret {key} (env {var}) is empty"', ".endif"]
    return lines


def render_gateway_config(
    spec: TopologySpec,
    *,
    burst_urls: Mapping[str, str | None],
    floor_servers: Mapping[str, Servers],
    canary_servers: Mapping[str, Servers] | None = None,
    binds: Mapping[str, str] | None = None,
    stats_bind: str | None = None,
    lua_path: str = f"/usr/local/etc/haproxy/{LUA_FILE}",
    health_check_interval_ms: int = 2000,
    log_target: str = "stdout format raw local0",
    max_connections: int = 4000,
    gateway_replicas: int = 1,
    ca_path: str = HAPROXY_IMAGE.ca_dir,
    shadow_binds: Mapping[str, str] | None = None,
    client_limits: ClientLimits = ClientLimits(),
    quality_servers: Servers | None = None,
    quality_bind: str = f"127.0.0.1:{QUALITY_PORT}",
    ports: Mapping[str, int] | None = None,
) -> RenderedGateway:
    """haproxy.cfg + gateway.lua for every gated endpoint of `spec`.

    burst_urls: endpoint -> Modal web URL (floor_plus_burst and serverless_only endpoints); None
    when the app has no URL yet (not deployed): its backend then has no server and answers a
    JSON 503, so overflow fails loudly instead of pointing anywhere made up.
    floor_servers: endpoint -> floor replicas (dedicated_only and floor_plus_burst endpoints).
    canary_servers: endpoint -> candidate replicas, required when the endpoint's spec has a canary.
    binds: endpoint -> "addr:port" (default "*:<8080+i>"); stats_bind likewise (default "*:8404").
    gateway_replicas: HAProxy pods sharing the floor. Each pod sees only its own in-flight
    requests, so each enforces its share of the per-replica threshold (`per_pod_threshold`).
    shadow_binds: endpoint -> loopback "127.0.0.1:port" where its shadow mirrors enter (default
    127.0.0.1:<9080+i>, i its place among the gated endpoints); only endpoints whose spec has a shadow use it.
    ports: endpoint -> listening port (the stack's llm-serving:gateway.ports); None: by position from 8080.
    quality_servers: the quality recorder (required when an endpoint's rollout samples quality); quality_bind:
    the loopback frontend sampled exchanges are posted to, which forwards them to it.
    ca_path: the trust store TLS to Modal is verified against: the image's CA directory (explicit,
    because haproxy's `@system-ca` is OpenSSL's compiled-in directory and ignores SSL_CERT_DIR,
    so tests could not point it elsewhere); tests pass a directory holding exactly the pod's CAs.
    """
    if gateway_replicas < 1:
        raise ValueError(f"gateway_replicas must be >= 1, got {gateway_replicas}")
    canary_servers = canary_servers or {}
    ports = endpoint_ports(spec, ports)
    binds = dict(binds or {e: f"*:{p}" for e, p in ports.items()})
    shadow_binds = dict(shadow_binds or {e: f"127.0.0.1:{SHADOW_BASE_PORT + i}" for i, e in enumerate(ports)})
    secret_env: dict[str, str] = {}
    endpoints = gated_endpoints(spec)
    if not endpoints:
        raise ValueError("spec has no endpoint behind the gateway (all are managed_api)")
    max_body = max(e.gateway.max_request_body_bytes for e in endpoints)
    bufsize = -(-(max_body + HEADER_ROOM_BYTES) // 1024) * 1024

    sampled = [e.name for e in endpoints if quality_sampling(e) is not None]
    if sampled and quality_servers is None:
        raise ValueError(f"endpoints {sampled} sample quality (rollout.quality_sampling); no quality recorder "
                         "servers given (quality_servers)")
    sections: list[str] = []
    shares = connection_shares(endpoints, max_connections)
    limits = client_limits.resolved(max_connections)
    for e in endpoints:
        if e.name not in binds:
            raise ValueError(f"no bind address for endpoint {e.name!r}; given: {sorted(binds)}")
        # a client's connections: the per-source limit, at most the endpoint's own share (its frontend's maxconn)
        own = replace(limits, max_conn_per_source=min(limits.max_conn_per_source, shares[e.name]))
        sections.append(_endpoint_sections(e, burst_urls, floor_servers, canary_servers, binds[e.name],
                                           health_check_interval_ms, secret_env, gateway_replicas, ca_path,
                                           max_connections, shares[e.name], shadow_binds.get(e.name), own,
                                           quality_bind if sampled else None, bufsize))
    if sampled:
        sections.append(_quality_sections(quality_servers, quality_bind, health_check_interval_ms))
    # every listener's maxconn fits in the global pool with the stats room left over: the endpoints' shares, the
    # loopback frontends the Lua tasks connect to (shadow mirrors, quality posts), and the probes
    loopback = sum(shadow_cap_of(e, gateway_replicas) for e in endpoints) + (QUALITY_MAX_POSTS if sampled else 0)

    head = [
        # no inputs hash here: the pods roll when this text changes, and a price or another endpoint's input
        # that leaves the gateway as it was must not restart it (the spec's hash is in the stack outputs)
        "# Rendered by components/gateway_config.py from the TopologySpec "
        f"(project {spec.project}, environment {spec.environment}).",
        "# Do not edit: re-render.",
        *_secret_guards(secret_env),
        "global",
        f"    log {log_target}",
        # one Lua state per thread: HAProxy 2.6 with a single shared state let concurrent Lua
        # filters on two threads corrupt each other (seen under load: hung streams)
        f"    lua-load-per-thread {lua_path}",
        # tune.lua.forced-yield stays at its default (10000 instructions per pause with a per-thread state): any
        # value leaves pause points, so what must not be paused (Idempotency-Key claims, the gate's floor pick)
        # runs where HAProxy never pauses it (gateway_lua.py, unpaused), and the tests run it at 5
        # One thread: the floor choice (Lua) and the server assignment then happen without another
        # stream in between, so two requests can never both take a replica's last slot. One
        # HAProxy thread carries thousands of LLM streams; more capacity = more gateway pods.
        "    nbthread 1",
        # on a rollout the old process stops accepting and lets streams finish, at most this long
        f"    hard-stop-after {longest_request_s(spec)}s",
        # bodies are validated and stamped in one buffer: it must hold the largest allowed body
        f"    tune.bufsize {bufsize}",
        # the endpoints' frontends split max_connections (connection_shares), the loopback frontends have theirs:
        # the stats frontend (probes, the exporter) keeps its room whatever the clients do
        f"    maxconn {max_connections + loopback + STATS_CONNECTIONS}",
        "",
        "resolvers cluster",
        "    parse-resolv-conf",
        "    hold valid 5s",
        "    accepted_payload_size 8192",
        "",
        "defaults",
        "    mode http",
        "    log global",
        '    log-format "%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %tsc %ac/%fc/%bc/%sc/%rc %sq/%bq '
        '{%[var(txn.tenant)]} {%[var(txn.route)]} %ID %{+Q}r"',
        # the id an engine knows a request by (request_ids): random (nothing of the pod reaches clients or engines)
        "    unique-id-format %[uuid(4)]",
        "    option abortonclose",  # a client that leaves while queued is dropped, never sent upstream
        "    option http-no-delay",  # small SSE chunks leave at once (no Nagle/MSG_MORE batching)
        "    option dontlognull",
        f"    timeout connect {CONNECT_TIMEOUT_S}s",
        f"    timeout client {GATEWAY_CLIENT_IDLE_S}s",
        # the request head must be complete within this (header tricklers are dropped); bodies have
        # their own wait (wait-for-body, BODY_WAIT_S)
        f"    timeout http-request {_ms(limits.header_timeout_s)}",
        "    timeout http-keep-alive 10s",
        "    timeout client-fin 5s",
        "    timeout server-fin 5s",
        # HAProxy's own errors as OpenAI-style JSON, so clients parse every failure the same way: every status it
        # can generate (http_err_codes, HAProxy 3.0 src/http.c) but 200 (the monitor's) and the auth challenges it
        # is never asked for (401, 407): the body wait running out (408), a rewrite that does not fit (500), a rule's
        # plain deny. What the HTTP/1 parser refuses before a stream exists (a doubled Content-Length, bad chunking,
        # a body on an HTTP/1.0 GET: 400, 413, 422) mux_h1 writes from HAProxy's fixed HTML pages (h1_send_error,
        # 3.0.11), which http-error does not reach
        # (400 and 408 with Connection: close, as HAProxy's own pages: the request was not read to its end)
        *["    http-error " + _json_reply(code, msg, kind, close=code in (400, 408)) for code, kind, msg in HAPROXY_ERRORS],
        "",
    ]
    stats = [
        "frontend stats",
        f"    bind {stats_bind or f'*:{STATS_PORT}'}",
        f"    maxconn {STATS_CONNECTIONS}",
        "    monitor-uri /healthz",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        *(["    http-request use-service lua.llm_quality_metrics if { path /metrics/quality }"] if sampled else []),
        "    no log",
        "",
    ]
    cfg = "\n".join(head + stats + sections) + "\n"
    return RenderedGateway(files={CONFIG_FILE: cfg, LUA_FILE: GATEWAY_LUA}, secret_env=secret_env, ports=ports)


def _endpoint_sections(
    e: EndpointSpec,
    burst_urls: Mapping[str, str | None],
    floor_servers: Mapping[str, Servers],
    canary_servers: Mapping[str, Servers],
    bind: str,
    health_check_interval_ms: int,
    secret_env: dict[str, str],
    gateway_replicas: int,
    ca_path: str,
    max_connections: int,
    frontend_connections: int,
    shadow_bind: str | None,
    limits: ClientLimits,
    quality_bind: str | None,
    bufsize: int,
) -> str:
    g = e.gateway
    threshold = per_pod_threshold(g.overflow_inflight_per_replica, gateway_replicas)
    # admission control (spec: admission_*; None = today's behaviour): a replica holds up to floor_cap (its
    # sequence slots), the burst tier burst_cap; the floor pick still overflows at the threshold, so a request
    # waits in HAProxy's queue only when the floor and the burst are both full, then gets 429 + Retry-After
    admission = g.admission_queue_timeout_s is not None
    floor_cap = threshold
    if admission and g.admission_inflight_per_floor_replica > 0:
        floor_cap = per_pod_threshold(g.admission_inflight_per_floor_replica, gateway_replicas)
    pick_threshold = min(threshold, floor_cap)  # the pick never sends a replica past its maxconn (no queue)
    burst_cap = (per_pod_threshold(g.admission_burst_inflight, gateway_replicas)
                 if admission and g.admission_burst_inflight > 0 else None)
    queue_ms = _ms(g.admission_queue_timeout_s) if admission else None
    # Modal's web-request cap for non-streamed requests on burst (spec: burst.non_streamed_rule)
    ns_rule = e.burst.non_streamed_rule if (e.burst is not None and needs_burst(e)) else "fits"
    ns_cap = 0
    if ns_rule == "cap_max_tokens":
        ns_cap = e.burst.non_streamed_max_tokens or 0
        if ns_cap < 1:
            raise ValueError(f"endpoint {e.name!r}: burst.non_streamed_rule 'cap_max_tokens' needs "
                             f"burst.non_streamed_max_tokens >= 1, got {e.burst.non_streamed_max_tokens!r}")
    if ns_rule == "floor_only" and not needs_floor(e):
        raise ValueError(f"endpoint {e.name!r} ({e.tier}): burst.non_streamed_rule 'floor_only' needs a floor; "
                         "use 'require_streaming' or 'cap_max_tokens'")
    n = config_name(e.name)
    fe, be_floor, be_burst, be_canary = f"fe_{n}", floor_backend_name(e.name), burst_backend_name(e.name), f"be_{n}_canary"
    has_floor, has_burst = needs_floor(e), needs_burst(e)
    if has_floor and e.name not in floor_servers:
        raise ValueError(f"endpoint {e.name!r} ({e.tier}) needs floor servers; none given")
    if has_burst and e.name not in burst_urls:
        raise ValueError(f"endpoint {e.name!r} ({e.tier}) needs a burst URL; none given")
    if g.cache_isolation == "separate_pools":
        # SPEC: separate pools need one floor service per tenant; EndpointSpec has no such field yet.
        raise ValueError(
            f"endpoint {e.name!r}: cache_isolation 'separate_pools' needs per-tenant floor services, "
            "which the spec does not describe; use 'cache_salt'"
        )
    if g.canary is not None and e.name not in canary_servers:
        raise ValueError(f"endpoint {e.name!r} has a canary ({g.canary.revision}); no canary servers given")
    if g.shadow is not None and e.name not in canary_servers:
        raise ValueError(f"endpoint {e.name!r} has a shadow ({g.shadow.version}); no canary servers given "
                         "(the candidate's pods the mirrors go to)")
    if g.shadow is not None and not shadow_bind:
        raise ValueError(f"endpoint {e.name!r} has a shadow; no shadow bind address given")
    has_candidate = g.canary is not None or g.shadow is not None
    if g.max_retries < 0 or not 0 <= g.retry_budget_fraction <= 1:
        raise ValueError(f"endpoint {e.name!r}: max_retries must be >= 0 and retry_budget_fraction in [0, 1]")

    first_ms, inter_ms = _ms(g.first_byte_timeout_s), _ms(g.inter_chunk_timeout_s)
    whole_ms = _ms(request_limit_s(e))
    stamp = g.cache_isolation == "cache_salt"
    adapters_per_tenant = adapter_rule(e)

    fl = [f"frontend {fe}", f"    bind {bind}" + (" accept-proxy" if limits.source == "proxy_protocol" else ""),
          f"    maxconn {frontend_connections}"]
    # per-client limits (ClientLimits): connections per source counted from accept, so a trickler flood
    # from one client takes at most its share; request starts per 10 s, refused before any Lua runs
    fl.append(f"    stick-table type ipv6 size {max(1000, 4 * max_connections)} expire 60s "
              "store conn_cur,http_req_rate(10s)")
    too_many = ("    http-request deny deny_status 429 content-type application/json hdr Retry-After 10 string "
                "'{\"error\":{\"message\":\"too many requests from this client\",\"type\":\"rate_limit_error\","
                "\"code\":429}}' if { sc0_http_req_rate gt %d }" % limits.max_requests_per_source_10s)
    # echoed back, refusals too (request_ids); one longer than MAX_CLIENT_REQUEST_ID is refused below (copied into
    # the request with a body near the cap it overflowed the buffer: HAProxy's own 500), and not echoed
    client_rid = ("    http-request set-var(txn.client_rid) req.fhdr(x-request-id) "
                  f"if {{ req.fhdr(x-request-id),length le {MAX_CLIENT_REQUEST_ID} }}")
    if limits.source == "xff":
        fl.append("    http-request track-sc0 req.hdr_ip(x-forwarded-for,-1)")
        fl.append(client_rid)
        fl.append(too_many.replace("if { sc0_http_req_rate", f"if {{ sc0_conn_cur gt {limits.max_conn_per_source} }} || "
                                   "{ sc0_http_req_rate"))
    else:
        fl.append("    tcp-request connection track-sc0 src")
        fl.append(f"    tcp-request connection reject if {{ sc0_conn_cur gt {limits.max_conn_per_source} }}")
        fl.append(client_rid)  # after the tcp-request rules (HAProxy runs those first whatever their place)
        fl.append(too_many)
    # stamps "max_tokens" (and the tenant's cache_salt) into POST bodies; watches stream gaps; renews a
    # stream's Idempotency-Key claim while it is alive
    claim_ttl_ms = idempotency_claim_ttl_ms(e)
    fl.append(f"    filter lua.llm {first_ms} {inter_ms} {_ms(g.sse_heartbeat_s)} {claim_ttl_ms}")
    fl.append("    http-request set-var(txn.route) str(rejected)")
    # tenants: API key (from the Secret, via env) -> tenant
    for t in g.tenants:
        key_env = env_name(e.name, t.api_key_secret_key)
        secret_env[key_env] = t.api_key_secret_key
        fl.append(
            f'    http-request set-var(txn.tenant) str({config_name(t.name)}) '
            f'if {{ req.fhdr(authorization) -m str "Bearer ${{{key_env}}}" }}'
        )
    fl.append("    " + _json_error(401, "missing or unknown API key", "authentication_error")
              + " unless { var(txn.tenant) -m found }")
    fl.append("    " + _json_error(400, f"X-Request-Id is longer than {MAX_CLIENT_REQUEST_ID} bytes",
                                   "invalid_request_error")
              + f" if {{ req.fhdr(x-request-id),length gt {MAX_CLIENT_REQUEST_ID} }}")
    # the OpenAI-compatible serving API and nothing else of the engine: vLLM serves more on the same port — with
    # VLLM_SERVER_DEV_MODE (the burst tier's snapshots need /sleep and /wake_up) /sleep, /collective_rpc,
    # /reset_prefix_cache and /server_info, and with runtime LoRA updates /v1/load_lora_adapter — and the gateway
    # adds Modal's proxy credentials on the burst path: any tenant could put a burst container's engine to sleep
    fl.append(f"    acl llm_generate path {' '.join(SERVED_POST_PATHS)}")
    fl.append(f"    acl llm_listing path {' '.join(SERVED_GET_PATHS)}")
    fl.append("    " + _json_error(404, "not an endpoint of this API", "invalid_request_error")
              + " unless llm_generate || llm_listing")
    fl.append("    " + _json_error(405, "method not allowed here", "invalid_request_error")
              + " unless METH_POST llm_generate || METH_GET llm_listing")
    # a GET carries no body: one that does is refused, not handed to the engine with it (found by a fuzz)
    fl.append("    " + _json_error(400, "a GET request carries no body", "invalid_request_error", close=True)
              + " if METH_GET { req.hdr(content-length) -m int gt 0 } || METH_GET { req.hdr(transfer-encoding) -m found }")
    if adapters_per_tenant:  # the model list from the gateway: the base model only, no tenant's adapters
        fl.append("    http-request return status 200 content-type application/json string "
                  f"'{{\"object\":\"list\",\"data\":[{{\"id\":\"{e.engine.served_model_name}\",\"object\":\"model\","
                  "\"owned_by\":\"llm-serving\"}]}' if METH_GET llm_listing")
    fl.append("    " + _json_error(411, "a Content-Length is required", "invalid_request_error")
              + " if METH_POST !{ req.hdr(content-length) -m found }")
    fl.append("    " + _json_error(413, f"request body larger than {g.max_request_body_bytes} bytes",
                                   "invalid_request_error")
              + f" if {{ req.hdr(content-length) -m int gt {g.max_request_body_bytes} }}")
    fl.append(f"    http-request wait-for-body time {BODY_WAIT_S}s if METH_POST")
    fl.append("    http-request set-var(txn.body_size) req.body_size if METH_POST")
    fl.append("    http-request set-var(txn.body_len) req.body_len if METH_POST")
    # the buffer is sized so a body within the cap is complete here under headers of up to HEADER_ROOM_BYTES: a
    # partial body that fills the buffer (request line, headers, body and the rewrite reserve, HTX's bookkeeping
    # allowed for) came with headers too large, and is told so (a 408 would invite the same request again);
    # anything else partial was not received in time. Both leave body bytes unread: the connection closes
    full = bufsize - HAPROXY_MAXREWRITE - HTX_OVERHEAD_BYTES
    room = full - g.max_request_body_bytes  # what a body at this endpoint's cap leaves the request line and headers
    partial = "METH_POST { req.body_len,sub(txn.body_size) -m int lt 0 }"
    fl.append(f"    http-request set-var(txn.url_len) url,length if {partial}")
    fl.append("    " + _json_error(431, f"request headers too large: with a body near the {g.max_request_body_bytes}-byte "
                                   f"cap, the request line and headers must stay under {room} bytes",
                                   "invalid_request_error", close=True)
              + f" if {partial} {{ req.hdrs,length,add(txn.body_len),add(txn.url_len) -m int ge {full} }}")
    fl.append("    " + _json_error(408, "request body not received in time", "invalid_request_error", close=True)
              + f" if {partial}")
    for t in g.tenants:
        salt_env = "-"
        if stamp:
            if t.cache_salt_secret_key is None:
                raise ValueError(f"endpoint {e.name!r}: tenant {t.name!r} has no cache_salt_secret_key "
                                 "but cache_isolation is 'cache_salt'")
            salt_env = env_name(e.name, t.cache_salt_secret_key)
            secret_env[salt_env] = t.cache_salt_secret_key
        # Idempotency-Key dedupe: at most max_connections keys per tenant (HTTP/2 can carry more requests in
        # flight: past it a claim gets 429), each expiring after every wait up to the response (a stream renews it
        # while alive)
        # with a floor, the gate also makes the floor pick (below), saving a Lua call per request
        pick = (f"{be_floor} floor {_slot_count(floor_servers[e.name])} {pick_threshold} {g.sticky_hash_header}"
                if has_floor else "- - - - -")
        # the claims' table is the endpoint's tenant's: one tenant's keys on two endpoints (prod's `default` on
        # autocomplete and guard, one Lua state) are different requests, each with its own cap
        idem_table = f"{config_name(e.name)}/{config_name(t.name)}"
        # several tenants on an engine with LoRA adapters: an adapter named <tenant>-… is that tenant's alone, so a
        # name with another tenant's prefix is refused (vLLM would load any adapter it is asked for: adapter_rule)
        others = ",".join(f"{o.name}-" for o in g.tenants if o.name != t.name) if adapters_per_tenant else "-"
        # with LoRA, vLLM's filesystem resolver takes a requested name as a path under its folder: the gate refuses
        # a name other than the served model's that is one (an adapter is a folder's name)
        served = e.engine.served_model_name if e.engine.serves_lora else "-"
        fl.append(f"    http-request lua.llm_gate {g.max_tokens} {salt_env} {idem_table} {max_connections} "
                  f"{claim_ttl_ms} {ns_cap} {pick} {others} {served} if METH_POST "
                  f"{{ var(txn.tenant) -m str {config_name(t.name)} }}")
    # fail closed: a POST the gate did not finish (a Lua runtime error, after which HAProxy goes on with the next
    # rules) would reach the upstream unchecked and unstamped; its claim, if the gate took one, is freed first
    fl.append("    http-request lua.llm_idem_release if METH_POST !{ var(txn.gated) -m found } { var(txn.idem) -m found }")
    fl.append("    " + _json_error(500, "the gateway could not check this request", "gateway_error")
              + " if METH_POST !{ var(txn.gated) -m found }")
    # a request the gate refused holds no Idempotency-Key claim (it refuses before claiming); should one ever be
    # refused after, its claim goes with the answer, or the client's corrected retry would get 409 until it expired
    fl.append("    http-request lua.llm_idem_release if { var(txn.gate_error) -m found } { var(txn.idem) -m found }")
    fl.append("    http-request return status 400 content-type application/json "
              "lf-string '{\"error\":{\"message\":\"%[var(txn.gate_error)]\",\"type\":\"invalid_request_error\","
              "\"code\":400}}' if { var(txn.gate_error) -m found }")
    fl.append("    " + _json_error(409, "a request with this Idempotency-Key is already in flight", "conflict_error")
              + " if { var(txn.idem_refused) -m str busy }")
    fl.append("    " + _json_error(429, "too many requests with an Idempotency-Key in flight for this tenant",
                                   "rate_limit_error") + " if { var(txn.idem_refused) -m str full }")
    fl.append("    http-request set-header Content-Length %[var(txn.gate_len)] if { var(txn.gate_len) -m found }")
    # nothing the client sends may impersonate the gateway or leak its key upstream
    for h in ("Authorization", "Modal-Key", "Modal-Secret", "X-Gateway-Tenant", CLIENT_REQUEST_ID_HEADER):
        fl.append(f"    http-request del-header {h}")
    fl.append("    http-request set-header X-Gateway-Tenant %[var(txn.tenant)]")
    q = quality_sampling(e)
    if q is not None:
        # before the shadow action: it decides whether this request's exchange (and its mirror's) is recorded
        r = e.rollout
        candidate = r.candidate.version if (g.canary is not None or g.shadow is not None) else "-"
        # drawn natively per request (one in a million resolution), independently for the user's exchange and
        # for its shadow mirror: the Lua action (a transaction object per call) runs only for the sampled share
        ppm = max(1, int(round(q.sample_fraction * 1_000_000))) if q.sample_fraction > 0 else 0
        fl.append(f"    http-request set-var(txn.q_user) int(1) if METH_POST {{ rand(1000000) -m int lt {ppm} }}")
        if candidate != "-":
            fl.append(f"    http-request set-var(txn.q_mirror) int(1) if METH_POST {{ rand(1000000) -m int lt {ppm} }}")
        fl.append(f"    http-request lua.llm_quality {e.name} {r.served_version} {candidate} "
                  f"{quality_bind} {quality_capture_bytes(e)} {QUALITY_MAX_CAPTURES} {QUALITY_MAX_POSTS} "
                  f"{QUALITY_POST_TIMEOUT_MS} if {{ var(txn.q_user) -m found }} || {{ var(txn.q_mirror) -m found }}")
    # after the quality action (its record keeps the client's id), before the shadow's copy of the headers
    fl += request_ids()
    shadow_cap = shadow_cap_of(e, gateway_replicas)

    route: list[str] = []
    canary_threshold = threshold
    if g.canary is not None:
        hdr = g.sticky_hash_header if g.canary.hash_key == "session" else g.canary.user_header
        basis_points = int(round(g.canary.percent * 100))
        fl.append(f"    acl canary_key req.fhdr({hdr}) -m found")
        fl.append(f"    acl canary_side req.fhdr({hdr}),xxh32({_canary_seed(g.canary)}),mod(10000) "
                  f"-m int lt {basis_points}")
        if g.canary.overflow_to_incumbent:
            # the candidate replica is picked like a floor replica (session-sticky, below its full mark);
            # when every candidate replica is full or none is up the pick is empty and the canary user's
            # request takes the incumbent's route below (floor, then burst): never an error, never queued
            full = g.canary.full_at_inflight_per_replica or max_connections  # 0: no mark given, only "none up"
            canary_threshold = per_pod_threshold(full, gateway_replicas)
            c_slots = _slot_count(canary_servers[e.name])
            fl.append(f"    http-request set-var(txn.canary_server) lua.llm_pick_floor({be_canary},canary,{c_slots},"
                      f"{canary_threshold},{g.sticky_hash_header}) if canary_key canary_side")
            route.append(f"    use_backend {be_canary} if {{ var(txn.canary_server) -m beg canary }}")
        else:
            route.append(f"    use_backend {be_canary} if canary_key canary_side")
    if has_floor:
        slots = _slot_count(floor_servers[e.name])
        # requests the gate did not pick for (no POST body to gate); the pick's place among the rules does not
        # matter: no rule in between changes a replica's load, and one thread runs them without a pause
        fl.append(f"    http-request set-var(txn.floor_server) lua.llm_pick_floor({be_floor},floor,{slots},"
                  f"{pick_threshold},{g.sticky_hash_header}) unless {{ var(txn.floor_server) -m found }}"
                  + (" || { var(txn.canary_server) -m beg canary }" if g.canary is not None else ""))
    # where the request goes unless the floor or the candidate took it (both tiers checked natively)
    fl.append("    acl on_floor var(txn.floor_server) -m beg floor")
    fl.append("    acl on_canary var(txn.canary_server) -m beg canary")
    fl.append("    acl nonstream var(txn.stream) -m int eq 0")  # set by llm_gate for every accepted POST
    off_floor = "!on_floor !on_canary" if has_floor else "!on_canary"
    if ns_rule == "require_streaming":
        # the gate claimed the request's Idempotency-Key before its route was known; a request the rules
        # answer themselves never reaches the filter's release, so it frees the key here (the client's
        # streamed retry with the same key must not get a 409)
        fl.append(f"    http-request lua.llm_idem_release if nonstream {off_floor} {{ var(txn.idem) -m found }}")
        fl.append("    " + _json_error(400, f"non-streamed requests are not served while this endpoint overflows to "
                                           f"its burst tier, which ends a web request after "
                                           f"{e.burst.web_request_cap_s} s: send stream true",
                                       "invalid_request_error") + f" if nonstream {off_floor}")
    if burst_cap is not None and has_burst:
        fl.append(f"    acl burst_full be_conn({be_burst}) ge {burst_cap}")
        fl.append(f"    http-request set-var(txn.admit) int(1) if {off_floor} burst_full")
    if admission and has_floor and not has_burst:
        fl.append(f"    http-request set-var(txn.admit) int(1) if {off_floor}")
    if admission and ns_rule == "floor_only":
        fl.append(f"    http-request set-var(txn.admit) int(1) if nonstream {off_floor}")
    if admission and has_floor and g.admission_queue_per_floor_replica > 0:
        # the admission queue's bound: a request further back than the replicas up admit within the bounded wait
        # (admission_queue_per_floor_replica each, this pod's share) would wait it out and get 429 anyway; it gets
        # it at once. Without it the wait was bounded only up to the frontend's maxconn: a flood past it waited in
        # the kernel's accept backlog, then queued again (429s after up to 4× the bound)
        q_per = per_pod_threshold(g.admission_queue_per_floor_replica, gateway_replicas)
        fl.append(f"    http-request set-var(txn.admit_qmax) nbsrv({be_floor}),mul({q_per}) "
                  "if { var(txn.admit) -m found }")
        full_queue = f"{{ var(txn.admit) -m found }} {{ queue({be_floor}),sub(txn.admit_qmax) -m int ge 0 }}"
        fl.append(f"    http-request lua.llm_idem_release if {full_queue} {{ var(txn.idem) -m found }}")
        fl.append("    " + _json_error(429, "no capacity: every replica is busy and the wait for one is full; retry "
                                           "later", "overloaded_error") + f" if {full_queue}")
    if g.shadow is not None:
        # a validated request is mirrored (chosen per request) by a Lua task: this action only copies the
        # stamped body and returns; the user's request goes on at once and never waits for the mirror.
        # At most shadow_cap mirrors in flight from this pod; above that a mirror is skipped, never queued.
        # After every rule that refuses a request (a non-streamed one while the endpoint overflows to burst) and
        # every admission mark: the candidate never sees a request its user was refused, and a request that
        # waits for admission (the floor and the burst full: it may end in a 429) is not mirrored either — the
        # endpoint is saturated. Shadow and canary are different rollout stages, so no canary pick is made
        # between here and the route. Chosen natively (basis points of 10,000): the Lua action runs only for
        # the mirrored share
        fl.append(f"    http-request lua.llm_shadow {n} {shadow_bind} {shadow_cap} {whole_ms} "
                  f"if METH_POST !{{ var(txn.admit) -m found }} "
                  f"{{ rand(10000) -m int lt {int(round(g.shadow.percent * 100))} }}")
    if has_floor and has_burst:
        route.append(f"    use_backend {be_floor} if on_floor")
        if ns_rule == "floor_only":  # never to burst: wait on the floor (HAProxy's queue) instead
            route.append(f"    use_backend {be_floor} if nonstream !on_canary")
        if burst_cap is not None:  # floor and burst full: wait for a floor slot, bounded, then 429
            route.append(f"    use_backend {be_floor} if {{ var(txn.admit) -m found }} !on_canary")
        route.append(f"    default_backend {be_burst}")
    elif has_floor:
        route.append(f"    default_backend {be_floor}")
    else:
        route.append(f"    default_backend {be_burst}")
    fl += route
    if admission:
        # a wait past admission_queue_timeout_s ends in HAProxy's own 503: to the client it is a 429
        fl.append("    http-after-response set-status 429 if { status 503 } { var(txn.admit) -m found }")
        fl.append(f"    http-after-response set-header Retry-After {max(1, g.retry_after_s)} "
                  "if { status 429 } { var(txn.admit) -m found }")
    fl.append("    http-after-response set-header X-Request-Id %[var(txn.client_rid)] if { var(txn.client_rid) -m found }")
    fl.append("    http-after-response set-header X-Request-Id %[unique-id] unless { var(txn.client_rid) -m found }")
    fl.append("    http-after-response set-header X-Accel-Buffering no")
    fl.append("    http-after-response set-header Cache-Control no-cache if { res.hdr(content-type) -m beg text/event-stream }")
    fl.append("")


    def common(role: str) -> list[str]:
        return [
            f"    timeout server {whole_ms}",
            f"    timeout queue {queue_ms if queue_ms is not None and role in ('floor', 'burst') else first_ms}",
            # streams: the Lua gap filter enforces the exact limits once headers are in; this idle
            # timeout is the backstop for an upstream that sends no headers at all (-> JSON 504)
            f"    http-request set-timeout server {first_ms + STREAM_BACKSTOP_MS} "
            "if { var(txn.stream) -m int eq 1 }",
            f"    retries {g.max_retries}",
            # only failures before the request was sent (see the module docstring); also spares
            # HAProxy the copy of every request body that other retry-on kinds need
            "    retry-on conn-failure",
            "    option redispatch 1",
            f"    http-request set-var(txn.route) str({role})",
            f"    http-response set-header X-Served-By {role}",
            # a stream whose length the framing carries: its end without end-of-message is a cut (the llm
            # filter then sends an error event); a close-delimited one ends by closing
            "    http-response set-var(txn.res_len) bool(1) if { var(txn.stream) -m int eq 1 } "
            "{ res.hdr(transfer-encoding) -m found } || { var(txn.stream) -m int eq 1 } { res.hdr(content-length) -m found }",
        ]

    bl: list[str] = []
    floor_opts = (f"check inter {health_check_interval_ms} fall 2 rise 2 "
                  f"maxconn {floor_cap} maxqueue {floor_cap}")
    # with admission control a full floor and burst end in HAProxy's 503 (the frontend makes it a 429):
    # its body must not read as an outage
    overloaded = ([
        "    http-error status 503 content-type application/json string "
        "'{\"error\":{\"message\":\"no capacity: every replica is busy or unavailable; retry later\","
        "\"type\":\"overloaded_error\"}}'"] if admission else [])
    if has_floor:
        slots = _slot_count(floor_servers[e.name])
        bl += [f"backend {be_floor}",
               # the replica chosen in the frontend; leastconn only when none had room (dedicated_only)
               "    balance leastconn",
               # rules before use-server: HAProxy runs http-request rules first whatever their place, and
               # warns when the text says otherwise
               *common("floor"),
               *[f"    use-server floor{i} if {{ var(txn.floor_server) -m str floor{i} }}"
                 for i in range(1, slots + 1)],
               "    option httpchk GET /health",
               "    http-check expect status 200",
               *overloaded,
               *_server_lines("floor", floor_servers[e.name], floor_opts), ""]
    if has_candidate:
        c_slots = _slot_count(canary_servers[e.name])
        picked = g.canary is not None and g.canary.overflow_to_incumbent
        c_cap = canary_threshold if g.canary is not None else shadow_cap
        bl += [f"backend {be_canary}",
               *common("canary"),
               *([# the candidate replica chosen in the frontend (below its full mark)
                  "    balance leastconn",
                  *[f"    use-server canary{i} if {{ var(txn.canary_server) -m str canary{i} }}"
                    for i in range(1, c_slots + 1)]] if picked else
                 [# canary users stay on the candidate, by consistent hashing (no full mark given)
                  f"    balance hdr({g.sticky_hash_header})",
                  "    hash-type consistent"]),
               "    option httpchk GET /health",
               "    http-check expect status 200",
               *_server_lines("canary", canary_servers[e.name],
                              f"check inter {health_check_interval_ms} fall 2 rise 2 maxconn {c_cap} maxqueue {c_cap}"),
               ""]
    if g.shadow is not None:
        # mirrors from the Lua task enter here, on loopback only; same candidate backend and limits as users'
        # '-' is never in a folded endpoint name, so no endpoint's own frontend (fe_<name>) can take this one's
        # name (fe_{n}_shadow was endpoint '<n>-shadow''s frontend too: HAProxy refused the whole config)
        bl += [f"frontend {fe}-shadow",
               f"    bind {shadow_bind}",
               f"    maxconn {shadow_cap}",
               # a streamed mirror gets the same first-byte backstop as a user's stream (frees its slot sooner)
               "    http-request set-var(txn.stream) int(1) if { req.hdr(x-gateway-shadow) -m str stream }",
               f"    default_backend {be_canary}", ""]
    if has_burst and burst_urls[e.name] is None:
        bl += [f"backend {be_burst}",
               f"    # no Modal URL for {e.name} yet (app not deployed): requests here get a JSON 503",
               *common("burst"), *_ns_cap_lines(ns_cap), ""]
    elif has_burst:
        host, port, tls = _parse_burst_url(e.name, burst_urls[e.name])
        opts = ""  # no health check: probing Modal would keep (or wake) a container for nothing
        if tls:
            opts += f" ssl verify required ca-file {ca_path} sni str({host})"
        if not _is_ip(host):
            opts += " resolvers cluster init-addr last,libc,none"
        host_header = host if port in (80, 443) else f"{host}:{port}"
        auth: list[str] = []
        if e.burst is None or e.burst.requires_proxy_auth:
            secret_env[MODAL_KEY_ENV] = "modal-key"
            secret_env[MODAL_SECRET_ENV] = "modal-secret"
            auth = [f'    http-request set-header Modal-Key "${{{MODAL_KEY_ENV}}}"',
                    f'    http-request set-header Modal-Secret "${{{MODAL_SECRET_ENV}}}"']
        if burst_cap is not None:
            opts += f" maxconn {burst_cap}"
        bl += [f"backend {be_burst}",
               *common("burst"),
               *overloaded,
               *_ns_cap_lines(ns_cap),
               f"    http-request set-header Host {host_header}",
               *auth,
               f"    server burst {host}:{port}{opts}", ""]
    return "\n".join(fl + bl)


def quality_sampling(e: EndpointSpec):
    """The endpoint's quality sampling (rollout.quality_sampling), or None."""
    return e.rollout.quality_sampling if e.rollout is not None else None


def quality_capture_bytes(e: EndpointSpec) -> int:
    """Response bytes kept per sampled exchange: the endpoint's max_tokens streamed, within the pod-wide cap."""
    return min(QUALITY_MAX_CAPTURE_BYTES, e.gateway.max_tokens * QUALITY_BYTES_PER_TOKEN)


def _quality_sections(servers: Servers, bind: str, health_check_interval_ms: int) -> str:
    # loopback only: the Lua tasks post sampled exchanges here; the recorder answers once it has queued one
    return "\n".join([
        "frontend quality_records",
        f"    bind {bind}",
        f"    maxconn {QUALITY_MAX_POSTS}",
        "    default_backend be_quality_recorder",
        "",
        "backend be_quality_recorder",
        f"    timeout server {QUALITY_POST_TIMEOUT_MS}",
        "    timeout queue 1s",
        # one Service address: a retry would only hold the post (and its slot) for HAProxy's 1 s turn-around
        "    retries 0",
        "    option httpchk GET /healthz",
        "    http-check expect status 200",
        *_server_lines("recorder", servers, f"check inter {health_check_interval_ms} fall 2 rise 2"),
        "",
    ])
