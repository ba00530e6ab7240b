"""The recorder's pure half (recorder/records.py) and its config checks, against hand-written OpenAI/vLLM
responses: what a reader of the record must find is what a client reading the same bytes would see."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from recorder.app import RecorderConfig
from recorder.records import BadExchange, Exchange, build_record, exchange_from_post, reassemble
from tests.quality_support import ROOT


def sse(*events: str, crlf: bool = False) -> bytes:
    text = "".join(f"{e}\n\n" for e in events)
    return (text.replace("\n", "\r\n") if crlf else text).encode()


def test_chat_stream_with_role_delta_heartbeats_and_crlf():
    body = sse('data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}',
               ": keep-alive",
               'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}',
               'data: {"choices":[{"index":0,"delta":{"content":"lo ✓"},"finish_reason":"stop"}]}',
               'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}',
               "data: [DONE]", crlf=True)
    out = reassemble(body)
    assert out["streamed"] and out["complete"] and out["error"] is None
    assert out["choices"] == [{"index": 0, "text": "Hello ✓", "finish_reason": "stop"}]
    assert out["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


def test_completions_stream_with_two_interleaved_choices():
    body = sse('data: {"choices":[{"index":0,"text":"a"}]}', 'data: {"choices":[{"index":1,"text":"x"}]}',
               'data: {"choices":[{"index":1,"text":"y","finish_reason":"length"}]}',
               'data: {"choices":[{"index":0,"text":"b","finish_reason":"stop"}]}', "data: [DONE]")
    assert reassemble(body)["choices"] == [{"index": 0, "text": "ab", "finish_reason": "stop"},
                                           {"index": 1, "text": "xy", "finish_reason": "length"}]


def test_stream_without_done_or_with_the_gateways_error_event_is_not_complete():
    cut = sse('data: {"choices":[{"index":0,"delta":{"content":"par"}}]}') + b'data: {"choices":[{"ind'
    out = reassemble(cut)
    assert out["choices"][0]["text"] == "par" and not out["complete"]
    ended = sse('data: {"choices":[{"index":0,"delta":{"content":"x"}}]}',
                'event: error\ndata: {"error":{"message":"upstream sent nothing for 30000 ms","type":"gateway_timeout","code":504}}')
    out = reassemble(ended)
    assert out["error"]["type"] == "gateway_timeout" and not out["complete"]


def test_whole_answers_and_errors():
    chat = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                    "finish_reason": "stop"}], "usage": {"completion_tokens": 1}}).encode()
    out = reassemble(chat)
    assert not out["streamed"] and out["complete"] and out["choices"][0]["text"] == "ok"
    comp = reassemble(b'{"choices":[{"index":0,"text":" done","finish_reason":"length"}]}')
    assert comp["choices"][0] == {"index": 0, "text": " done", "finish_reason": "length"}
    err = reassemble(b'{"error":{"message":"max_tokens exceeds","type":"invalid_request_error","code":400}}')
    assert err["error"]["code"] == 400 and not err["complete"] and err["choices"] == []
    assert reassemble(b"<html>bad gateway</html>")["error"]["message"] == "response is not JSON"


def _exchange(request: bytes, response: bytes = b'{"choices":[{"text":"t"}]}') -> Exchange:
    return Exchange(endpoint="ep", version="v1", route="floor", tenant="acme", request_id="r", path="/v1/completions",
                    status=200, started_ms=1_700_000_000_000, ended_ms=1_700_000_000_250, request=request,
                    response=response, truncated=False)


def test_record_keeps_prompt_and_parameters_never_a_cache_salt():
    r = build_record(_exchange(b'{"prompt":"p","max_tokens":5,"cache_salt":"s3cr3t"}'), {"identity_sha256": "ab"})
    assert r["prompt"] == "p" and r["kind"] == "completion" and r["parameters"] == {"max_tokens": 5}
    assert "s3cr3t" not in json.dumps(r) and r["version"] == {"name": "v1", "identity_sha256": "ab"}
    assert r["started_at"] == "2023-11-14T22:13:20.000+00:00" and r["duration_ms"] == 250
    with pytest.raises(BadExchange, match="not a JSON object"):
        build_record(_exchange(b"[1,2]"), {})


def test_a_post_must_say_what_it_is():
    headers = {"X-Quality-Endpoint": "ep", "X-Quality-Version": "v1", "X-Quality-Route": "floor",
               "X-Quality-Status": "200", "X-Quality-Started-Ms": "1", "X-Quality-Ended-Ms": "2",
               "X-Quality-Request-Bytes": "2"}
    ex = exchange_from_post(headers, b"{}rest")
    assert ex.request == b"{}" and ex.response == b"rest" and ex.tenant is None
    for broken, match in (({"X-Quality-Route": "elsewhere"}, "allowed: floor"),
                          ({"X-Quality-Request-Bytes": "99"}, "has 6 bytes"),
                          ({"X-Quality-Status": "ok"}, "not an integer")):
        with pytest.raises(BadExchange, match=match):
            exchange_from_post({**headers, **broken}, b"{}rest")
    with pytest.raises(BadExchange, match="missing header X-Quality-version"):
        exchange_from_post({k: v for k, v in headers.items() if k != "X-Quality-Version"}, b"{}")


def test_config_errors_name_the_field_and_the_service_exits_without_a_traceback(tmp_path):
    good = {"region": "us-east-1", "versions": {"ep": {"v1": {"bucket": "b", "prefix": "p/ep/v1/"}}}}
    assert RecorderConfig.from_json(good, "c.json").versions["ep"]["v1"]["prefix"] == "p/ep/v1/"
    for bad, match in (({**good, "bucket": "b"}, "unknown keys \\['bucket'\\]"),
                       ({**good, "versions": {"ep": {"v1": {"bucket": "b", "prefix": "/abs"}}}}, "versions.ep.v1.prefix"),
                       ({**good, "queue_max_records": 0}, "queue_max_records=0"),
                       ({"region": "us-east-1"}, "versions is required")):
        with pytest.raises(ValueError, match=match):
            RecorderConfig.from_json(bad, "c.json")
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**good, "batch_max_age_s": -1}))
    out = subprocess.run([sys.executable, "-m", "recorder.app", "--config", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "batch_max_age_s=-1" in out.stderr and "Traceback" not in out.stderr


def test_the_recorder_imports_only_what_its_image_installs():
    """recorder/Dockerfile copies recorder/ alone and installs recorder/requirements.txt: nothing else may be imported."""
    import ast

    pinned = {line.split("==")[0].strip().lower().replace("-", "_") for line in
              (ROOT / "recorder" / "requirements.txt").read_text().splitlines() if "==" in line}
    allowed = set(sys.stdlib_module_names) | pinned | {"recorder"}
    for path in sorted((ROOT / "recorder").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}, which the image does not install"


def test_a_lone_surrogate_in_a_sampled_prompt_is_recorded_and_the_writer_keeps_writing(moto_endpoint, aws_env):
    """`"\\ud800"` is valid JSON (a client slicing an emoji in half sends it) with no UTF-8 form: encoding its
    record raised inside the writer, which ended silently — the pod then accepted posts until its queue filled,
    refused everything after, and lost what was batched, its /healthz still ok. Now the record keeps the
    surrogate escaped, the next exchange is written too, to a real S3 API (moto), and the liveness answer follows
    the writer."""
    import asyncio

    from recorder.app import Recorder
    from tests.moto_support import client

    s3 = client("s3", moto_endpoint)
    s3.create_bucket(Bucket="quality-surrogate")
    cfg = RecorderConfig(region="us-east-1", batch_max_records=2, batch_max_age_s=60.0,
                         versions={"ep": {"v1": {"bucket": "quality-surrogate", "prefix": "ep/v1/", "identity": {}}}})

    async def run():
        rec = Recorder(cfg, s3)
        rec.start()
        bad = _exchange(b'{"prompt":"caf\\ud800e","max_tokens":4}')
        good = _exchange(b'{"prompt":"cafe","max_tokens":4}')
        for ex in (bad, good):
            rec.queue.put_nowait(ex)
        for _ in range(200):  # two records make a batch: flushed by the writer
            await asyncio.sleep(0.02)
            if rec.written.labels("ep", "v1")._value.get() == 2:
                break
        alive = rec.writing
        await rec.stop()
        return alive, rec.written.labels("ep", "v1")._value.get()

    alive, written = asyncio.run(run())
    assert alive and written == 2
    (obj,) = s3.list_objects_v2(Bucket="quality-surrogate")["Contents"]
    lines = s3.get_object(Bucket="quality-surrogate", Key=obj["Key"])["Body"].read().decode("utf-8").splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines]
    assert prompts == ["caf\ud800e", "cafe"]
