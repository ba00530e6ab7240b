"""What one sampled exchange becomes in the evaluation sink: pure functions, no I/O.

The gateway posts a sampled exchange as its original request body followed by the response bytes exactly
as the client received them (a JSON completion, or an SSE stream with the gateway's own error events and
keep-alive comments), with the version, route, tenant and timestamps in `X-Quality-*` headers. No request
header is ever forwarded: API keys, Authorization and Modal's proxy-auth never reach this code. The record
keeps the prompt, the sampling parameters and the reassembled completion per choice; a `cache_salt` (the
gateway stamps it into what the engine gets, not into what it posts here) is removed if present anyway.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

SCHEMA = "llm-serving.quality-sample/1"
ROUTES = ("floor", "burst", "canary", "shadow")
_NEVER_RECORDED = ("cache_salt",)  # a per-tenant secret of the prefix cache


class BadExchange(ValueError):
    """The post is not a well-formed exchange; `reason` labels the drop counter."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Exchange:
    endpoint: str
    version: str
    route: str
    tenant: str | None
    request_id: str | None
    path: str
    status: int
    started_ms: int
    ended_ms: int
    request: bytes
    response: bytes
    truncated: bool
    gateway_max_tokens: int | None = None
    client_left: bool = False  # the user went away mid-answer (the gateway saw the request side close first)


def exchange_from_post(headers: Mapping[str, str], body: bytes) -> Exchange:
    """Parse the gateway's post (headers are matched case-insensitively)."""
    h = {k.lower(): v for k, v in headers.items()}

    def need(name: str) -> str:
        v = h.get(f"x-quality-{name}")
        if v is None or v == "":
            raise BadExchange("malformed", f"missing header X-Quality-{name}")
        return v

    def integer(name: str) -> int:
        v = need(name)
        try:
            return int(v)
        except ValueError:
            raise BadExchange("malformed", f"X-Quality-{name}={v!r} is not an integer") from None

    route = need("route")
    if route not in ROUTES:
        raise BadExchange("malformed", f"X-Quality-Route={route!r}; allowed: {', '.join(ROUTES)}")
    n_req = integer("request-bytes")
    if not 0 <= n_req <= len(body):
        raise BadExchange("malformed", f"X-Quality-Request-Bytes={n_req} but the body has {len(body)} bytes")
    return Exchange(
        endpoint=need("endpoint"), version=need("version"), route=route,
        tenant=h.get("x-quality-tenant") or None, request_id=h.get("x-quality-request-id") or None,
        path=h.get("x-quality-path") or "/", status=integer("status"), started_ms=integer("started-ms"),
        ended_ms=integer("ended-ms"), request=body[:n_req], response=body[n_req:],
        truncated=h.get("x-quality-truncated") == "1",
        gateway_max_tokens=integer("gateway-max-tokens") if h.get("x-quality-gateway-max-tokens") else None,
        client_left=h.get("x-quality-client-left") == "1",
    )


def _choice_text(choice: Mapping[str, Any]) -> str:
    # completions: "text"; chat: "message.content" (whole) or "delta.content" (streamed)
    if isinstance(choice.get("text"), str):
        return choice["text"]
    for key in ("delta", "message"):
        part = choice.get(key)
        if isinstance(part, Mapping) and isinstance(part.get("content"), str):
            return part["content"]
    return ""


def _sse_events(text: str):
    """Data of each SSE event (data lines joined), with its event type; comments skipped."""
    for block in text.replace("\r\n", "\n").split("\n\n"):
        kind, data = "message", []
        for line in block.split("\n"):
            if line.startswith(":") or not line:
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                kind = value
            elif field == "data":
                data.append(value)
        if data:
            yield kind, "\n".join(data)


def reassemble(response: bytes) -> dict[str, Any]:
    """The completion as the user received it: text and finish reason per choice, usage, any error."""
    text = response.decode("utf-8", errors="replace")
    choices: dict[int, dict[str, Any]] = {}
    out: dict[str, Any] = {"streamed": False, "usage": None, "error": None, "complete": False}

    def take(doc: Mapping[str, Any], append: bool) -> None:
        if isinstance(doc.get("error"), Mapping):
            out["error"] = doc["error"]
        for c in doc.get("choices") or ():
            if not isinstance(c, Mapping):
                continue
            i = c.get("index") if isinstance(c.get("index"), int) else 0
            slot = choices.setdefault(i, {"index": i, "text": "", "finish_reason": None})
            slot["text"] = slot["text"] + _choice_text(c) if append else _choice_text(c)
            if c.get("finish_reason") is not None:
                slot["finish_reason"] = c["finish_reason"]
        if isinstance(doc.get("usage"), Mapping):
            out["usage"] = doc["usage"]

    stripped = text.lstrip()
    if stripped.startswith(("data:", "event:", ":")):
        out["streamed"] = True
        for kind, data in _sse_events(text):
            if data.strip() == "[DONE]":
                out["complete"] = True
                continue
            try:
                doc = json.loads(data)
            except ValueError:
                continue  # a chunk cut by the capture limit
            if isinstance(doc, Mapping):
                take(doc, append=True)
                if kind == "error" and out["error"] is None:
                    out["error"] = doc.get("error", doc)
    else:
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, Mapping):
            take(doc, append=False)
            out["complete"] = out["error"] is None and bool(choices)
        elif text:
            out["error"] = {"message": "response is not JSON", "body": text[:2000]}
    out["choices"] = [choices[i] for i in sorted(choices)]
    return out


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")


def build_record(ex: Exchange, identity: Mapping[str, Any], *, record_id: str | None = None) -> dict[str, Any]:
    """One JSON record for one exchange. identity: the version's identity as the spec states it."""
    try:
        req = json.loads(ex.request.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        req = None
    if not isinstance(req, dict):
        raise BadExchange("malformed", "the request body is not a JSON object")
    for k in _NEVER_RECORDED:
        req.pop(k, None)
    chat = "messages" in req
    prompt = req.pop("messages" if chat else "prompt", None)
    answer = reassemble(ex.response)
    first = answer["choices"][0] if answer["choices"] else {"text": "", "finish_reason": None}
    return {
        "schema": SCHEMA,
        "id": record_id or uuid.uuid4().hex,
        "endpoint": ex.endpoint,
        "version": {"name": ex.version, **dict(identity)},
        "route": ex.route,
        "tenant": ex.tenant,
        "request_id": ex.request_id,
        "path": ex.path,
        "kind": "chat" if chat else "completion",
        "started_at": _iso(ex.started_ms),
        "ended_at": _iso(ex.ended_ms),
        "duration_ms": max(0, ex.ended_ms - ex.started_ms),
        "status": ex.status,
        "streamed": answer["streamed"],
        "prompt": prompt,
        "parameters": req,
        "gateway_max_tokens": ex.gateway_max_tokens,
        "completion": first["text"],
        "finish_reason": first["finish_reason"],
        "choices": answer["choices"],
        "usage": answer["usage"],
        "error": answer["error"],
        "complete": answer["complete"] and not ex.truncated,
        "truncated": ex.truncated,
        "client_left": ex.client_left,
    }
