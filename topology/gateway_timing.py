"""SSE heartbeat interval from the idle timeouts on a stream's path. Pure: no I/O, no clock.

While a stream is idle (a long prefill before the first token, a long gap), every hop between the
client and the gateway that closes idle connections may drop it. The gateway sends an SSE comment
line (`: keep-alive`) after this much silence, so each hop sees a byte well before its timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

# The gateway's own client-side idle limit (HAProxy `timeout client`); rendered from here.
GATEWAY_CLIENT_IDLE_S = 60
# Heartbeats per idle timeout of the tightest hop: one late heartbeat (a busy proxy, a slow client
# read) still leaves two more before the hop gives up.
HEARTBEATS_PER_IDLE_TIMEOUT = 4


@dataclass(frozen=True)
class IdleHop:
    """A hop on the client's path that closes a connection idle longer than `idle_timeout_s`."""

    name: str
    idle_timeout_s: float
    source: str


# Checked: AWS ELB docs "Edit attributes for your Application Load Balancer" (connection idle
# timeout, default 60 s) and "Update the TCP idle timeout for your Network Load Balancer listener"
# (350 s default for TCP flows, fixed at 350 s for TLS listeners).
PATH_IDLE_HOPS: tuple[IdleHop, ...] = (
    IdleHop("gateway (HAProxy timeout client)", GATEWAY_CLIENT_IDLE_S, "components/gateway_config.py"),
    IdleHop("AWS Application Load Balancer in front (default idle timeout)", 60,
            "docs.aws.amazon.com/elasticloadbalancing/latest/application/edit-load-balancer-attributes.html"),
    IdleHop("AWS Network Load Balancer in front (TCP idle timeout)", 350,
            "docs.aws.amazon.com/elasticloadbalancing/latest/network/update-idle-timeout.html"),
)


def heartbeat_interval_s(hops: tuple[IdleHop, ...] = PATH_IDLE_HOPS) -> float:
    """Seconds of silence after which the gateway sends an SSE heartbeat: the tightest hop's idle
    timeout divided by HEARTBEATS_PER_IDLE_TIMEOUT (whole seconds, at least 1)."""
    if not hops:
        raise ValueError("heartbeat_interval_s: no hop on the path; give at least the gateway's own")
    bad = [h for h in hops if not h.idle_timeout_s >= 2]
    if bad:
        raise ValueError(f"idle timeout of {bad[0].name!r} is {bad[0].idle_timeout_s!r} s; allowed: >= 2 s")
    tightest = min(h.idle_timeout_s for h in hops)
    return float(max(1, int(tightest // HEARTBEATS_PER_IDLE_TIMEOUT)))
