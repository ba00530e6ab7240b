"""The quality recorder: sampled exchanges from the gateway → JSON Lines objects under each version's sink prefix.

    python -m recorder.app --config /etc/quality-recorder/config.json

Off the user's path: the gateway posts a sampled exchange after the user got all of it, and this service
answers as soon as the exchange is queued (202) — or at once with 503 when the queue is full. One writer
turns queued exchanges into records (`recorder.records`), batches them per (endpoint, version) and
uploads a batch when it holds `batch_max_records` records or its oldest is `batch_max_age_s` old. Memory
is bounded: at most `queue_max_records` exchanges of at most `max_exchange_bytes` each wait, plus the open
batches. A slow or failed upload never blocks the gateway: while it runs, new exchanges queue and beyond
the bound are dropped; a failed upload drops its batch. Every drop is counted, with its reason
(`llm_quality_records_dropped_total`); `…_received_total` and `…_written_total` count the rest.

Config (JSON, written by components/quality_recorder.py from the spec): region, port, pod_name,
versions {endpoint: {version: {bucket, prefix, identity}}}, and the limits above. Only the versions listed are
written, each under its own prefix: the IAM role allows exactly these prefixes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from recorder.records import BadExchange, Exchange, build_record, exchange_from_post

log = logging.getLogger("quality-recorder")


@dataclass(frozen=True)
class RecorderConfig:
    region: str
    versions: Mapping[str, Mapping[str, Mapping[str, Any]]]  # endpoint -> version -> {bucket, prefix, identity}
    port: int = 8080
    pod_name: str = "recorder"
    batch_max_records: int = 100
    batch_max_age_s: float = 30.0
    queue_max_records: int = 1000
    max_exchange_bytes: int = 4 << 20
    upload_timeout_s: float = 10.0

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], source: str) -> "RecorderConfig":
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(doc) - known)
        if extra:
            raise ValueError(f"{source}: unknown keys {extra}; allowed: {sorted(known)}")
        for key in ("region", "versions"):
            if not doc.get(key):
                raise ValueError(f"{source}: {key} is required")
        cfg = cls(**doc)
        for name in ("batch_max_records", "queue_max_records", "max_exchange_bytes"):
            if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
                raise ValueError(f"{source}: {name}={getattr(cfg, name)!r}; must be an integer >= 1")
        for name in ("batch_max_age_s", "upload_timeout_s"):
            if not isinstance(getattr(cfg, name), (int, float)) or not getattr(cfg, name) > 0:
                raise ValueError(f"{source}: {name}={getattr(cfg, name)!r}; must be a number > 0")
        for ep, versions in cfg.versions.items():
            for v, entry in versions.items():
                prefix = entry.get("prefix") if isinstance(entry, Mapping) else None
                if not isinstance(prefix, str) or not prefix.endswith("/") or prefix.startswith("/"):
                    raise ValueError(f"{source}: versions.{ep}.{v}.prefix={prefix!r}; must be a key prefix ending in '/'")
                if not isinstance(entry.get("bucket"), str) or not entry["bucket"]:
                    raise ValueError(f"{source}: versions.{ep}.{v}.bucket is required")
        return cfg


@dataclass
class _Batch:
    opened: float
    lines: list[bytes] = field(default_factory=list)


class Recorder:
    """Queue, batches, uploads and counters. `s3` is a boto3 S3 client (blocking calls run in a thread)."""

    def __init__(self, cfg: RecorderConfig, s3, registry: CollectorRegistry | None = None):
        self.cfg = cfg
        self.s3 = s3
        self.registry = registry or CollectorRegistry()
        labels = ("endpoint", "version")
        self.received = Counter("llm_quality_records_received", "Sampled exchanges accepted from the gateway.",
                                labels, registry=self.registry)
        self.written = Counter("llm_quality_records_written", "Records written to the evaluation sink.",
                               labels, registry=self.registry)
        self.dropped = Counter("llm_quality_records_dropped",
                               "Sampled exchanges not written, by reason (queue_full, upload_failed, malformed, "
                               "unknown_version, too_large).", (*labels, "reason"), registry=self.registry)
        self.queued = Gauge("llm_quality_queue_records", "Exchanges waiting to become records.", registry=self.registry)
        self.queue: asyncio.Queue[Exchange] = asyncio.Queue(maxsize=cfg.queue_max_records)
        self.batches: dict[tuple[str, str], _Batch] = {}
        self._seq = 0
        self._writer: asyncio.Task | None = None

    # ── the gateway's side: never waits on the sink ─────────────────────────────────────────────
    async def post_record(self, request: web.Request) -> web.Response:
        ep = request.headers.get("X-Quality-Endpoint", "?")[:64]
        version = request.headers.get("X-Quality-Version", "?")[:64]
        if request.content_length is not None and request.content_length > self.cfg.max_exchange_bytes:
            self.dropped.labels(ep, version, "too_large").inc()
            return web.json_response({"error": "exchange larger than max_exchange_bytes"}, status=413)
        body = await request.read()
        try:
            ex = exchange_from_post(request.headers, body)
        except BadExchange as e:
            self.dropped.labels(ep, version, e.reason).inc()
            return web.json_response({"error": str(e)}, status=400)
        if ex.version not in self.cfg.versions.get(ex.endpoint, {}):
            self.dropped.labels(ep, version, "unknown_version").inc()
            return web.json_response({"error": f"no sink prefix for {ex.endpoint}/{ex.version}"}, status=400)
        try:
            self.queue.put_nowait(ex)
        except asyncio.QueueFull:
            self.dropped.labels(ex.endpoint, ex.version, "queue_full").inc()
            return web.json_response({"error": "queue full"}, status=503)
        self.received.labels(ex.endpoint, ex.version).inc()
        self.queued.set(self.queue.qsize())
        return web.json_response({"queued": True}, status=202)

    # ── the sink's side ─────────────────────────────────────────────────────────────────────────
    def start(self) -> None:
        self._writer = asyncio.create_task(self._write_loop())

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            try:
                await self._writer
            except asyncio.CancelledError:
                pass
            except Exception:  # noqa: BLE001 — a writer that died must not cost what is still queued and batched
                log.exception("the writer had stopped on an error")
        while not self.queue.empty():  # what was accepted gets one last chance, bounded by the upload timeout
            self._add(self.queue.get_nowait())
        for key in list(self.batches):
            await self._flush(key)

    def _add(self, ex: Exchange) -> tuple[str, str] | None:
        entry = self.cfg.versions[ex.endpoint][ex.version]
        try:
            record = build_record(ex, entry.get("identity", {}))
            try:
                line = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
            except UnicodeEncodeError:
                # a lone surrogate ("\ud800", valid JSON that a client slicing an emoji in half sends) has no
                # UTF-8 form: the record keeps it escaped, exactly as sent
                line = json.dumps(record, ensure_ascii=True, separators=(",", ":")).encode()
        except BadExchange as e:
            self.dropped.labels(ex.endpoint, ex.version, e.reason).inc()
            return None
        except Exception:  # noqa: BLE001 — one exchange the builder cannot read is dropped, counted, never fatal
            log.exception("exchange for %s/%s not recorded", ex.endpoint, ex.version)
            self.dropped.labels(ex.endpoint, ex.version, "malformed").inc()
            return None
        key = (ex.endpoint, ex.version)
        batch = self.batches.setdefault(key, _Batch(opened=time.monotonic()))
        batch.lines.append(line)
        return key

    @property
    def writing(self) -> bool:
        """The writer is running (a liveness probe's question: a dead writer would accept until the queue fills
        and then refuse everything, while the other replica hides it from the namespace-wide alert)."""
        return self._writer is not None and not self._writer.done()

    async def _write_loop(self) -> None:
        while True:
            now = time.monotonic()
            due = [k for k, b in self.batches.items() if now - b.opened >= self.cfg.batch_max_age_s]
            for k in due:
                await self._flush(k)
            wait = min((b.opened + self.cfg.batch_max_age_s - time.monotonic() for b in self.batches.values()),
                       default=self.cfg.batch_max_age_s)
            try:
                ex = await asyncio.wait_for(self.queue.get(), timeout=max(wait, 0.01))
            except asyncio.TimeoutError:
                continue
            self.queued.set(self.queue.qsize())
            key = self._add(ex)
            if key is not None and len(self.batches[key].lines) >= self.cfg.batch_max_records:
                await self._flush(key)

    async def _flush(self, key: tuple[str, str]) -> None:
        batch = self.batches.pop(key, None)
        if not batch or not batch.lines:
            return
        endpoint, version = key
        entry = self.cfg.versions[endpoint][version]
        bucket, prefix = entry["bucket"], entry["prefix"]
        now = dt.datetime.now(dt.timezone.utc)
        self._seq += 1
        object_key = (f"{prefix}dt={now:%Y-%m-%d}/hour={now:%H}/"
                      f"{self.cfg.pod_name}-{int(now.timestamp() * 1000)}-{self._seq:06d}.jsonl")
        body = b"\n".join(batch.lines) + b"\n"
        try:
            await asyncio.wait_for(asyncio.to_thread(
                self.s3.put_object, Bucket=bucket, Key=object_key, Body=body,
                ContentType="application/x-ndjson"), timeout=self.cfg.upload_timeout_s)
        except Exception as e:  # noqa: BLE001 — any failure of the sink drops the batch, counted, never raised
            log.warning("upload of %d records to s3://%s/%s failed: %s", len(batch.lines), bucket,
                        object_key, e.__class__.__name__)
            self.dropped.labels(endpoint, version, "upload_failed").inc(len(batch.lines))
            return
        self.written.labels(endpoint, version).inc(len(batch.lines))


def make_app(rec: Recorder) -> web.Application:
    app = web.Application(client_max_size=rec.cfg.max_exchange_bytes)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(rec.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        if not rec.writing:
            return web.Response(text="writer stopped", status=503)
        return web.Response(text="ok")

    async def on_startup(_: web.Application) -> None:
        rec.start()

    async def on_cleanup(_: web.Application) -> None:
        await rec.stop()

    app.router.add_post("/v1/records", rec.post_record)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def s3_client(cfg: RecorderConfig):
    """boto3 S3 client for the cluster's region. Credentials: EKS Pod Identity (the container credential
    provider); the endpoint from AWS_ENDPOINT_URL when set (tests). One attempt per upload, bounded by
    upload_timeout_s: a retry would hold the writer while the queue fills."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", region_name=cfg.region, config=Config(
        connect_timeout=cfg.upload_timeout_s, read_timeout=cfg.upload_timeout_s,
        retries={"max_attempts": 1, "mode": "standard"}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Quality recorder: sampled exchanges → evaluation sink (S3).")
    p.add_argument("--config", required=True, help="JSON config (components/quality_recorder.py writes it)")
    p.add_argument("--host", default="0.0.0.0")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        with open(args.config, encoding="utf-8") as f:
            doc = json.load(f)
        cfg = RecorderConfig.from_json(doc, args.config)
    except (OSError, ValueError, TypeError) as e:
        print(f"quality-recorder: bad config: {e}", file=sys.stderr)
        return 2
    if os.environ.get("POD_NAME"):
        cfg = RecorderConfig(**{**cfg.__dict__, "pod_name": os.environ["POD_NAME"]})
    rec = Recorder(cfg, s3_client(cfg))
    web.run_app(make_app(rec), host=args.host, port=cfg.port, print=None, handle_signals=True,
                shutdown_timeout=cfg.upload_timeout_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
