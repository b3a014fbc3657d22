"""The tool benchmark client against a stub OpenAI-style server, and `summarize`."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvmem.bench.http_client import StreamOutcome, parse_prometheus
from kvmem.bench.main import main
from kvmem.bench.summarize import summarize_dir
from kvmem.bench.tools_data import ToolFormat, ToolsPlan, build_conversations, request_body
from kvmem.bench.tools_loop import add_round, round_delta
from kvmem.bench.tools_records import make_record, summarize_rounds


class StubState:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.prev_prompt = 0
        self.metrics = {
            "kvmem_prompt_seconds_total": 0.0,
            "kvmem_decode_seconds_total": 0.0,
            "kvmem_reselect_seconds_total": 0.0,
            "kvmem_stage_in_bytes_total": 0.0,
            "kvmem_stage_in_blocks_total": 0.0,
            "kvmem_host_store_bytes": 0.0,
        }
        # /props kvmem.transfer: each request adds one harvest read and one restore
        self.transfer: dict[str, dict[str, float]] = {}
        self.order: list[str] | None = None  # shared by stubs: which one served each request
        self.name = "stub"
        self.fail_at: int | None = None  # the request (0-based) answered with a 400

    def add_transfer(self, path: str, ms: float, n_bytes: int = 0) -> None:
        t = self.transfer.setdefault(path, {"calls": 0, "ms": 0.0, "bytes": 0, "gb_s": None})
        t["calls"] += 1
        t["ms"] += ms
        t["bytes"] += n_bytes


def make_handler(state: StubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/health":
                body = b'{"status": "ok"}'
            elif self.path == "/props":
                staging = {"bytes": 3 << 20, "staging_bytes": 2 << 20, "ahead_bytes": 1 << 20}
                body = json.dumps({"kvmem": {"transfer": {**state.transfer, "staging": staging}}})
                body = body.encode()
            elif self.path == "/metrics":
                body = "".join(
                    f"# TYPE {k} counter\n{k} {v}\n" for k, v in state.metrics.items()
                ).encode()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(req)
            if len(state.requests) - 1 == state.fail_at:
                body = b'{"error": {"message": "too long", "type": "invalid_request_error"}}'
                self.send_response(400)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            prompt = sum(len(m.get("content") or "") for m in req["messages"]) // 3
            cached = state.prev_prompt
            state.prev_prompt = prompt
            m = state.metrics
            m["kvmem_prompt_seconds_total"] += 0.5
            m["kvmem_decode_seconds_total"] += 0.1
            m["kvmem_reselect_seconds_total"] += 0.01
            m["kvmem_stage_in_bytes_total"] += 1000
            m["kvmem_stage_in_blocks_total"] += 2
            m["kvmem_host_store_bytes"] = 10.0 * prompt
            state.add_transfer("state_get", 8.0, 4000)
            state.add_transfer("copy_wait", 2.0)
            state.add_transfer("state_build_ahead", 6.0, 3000)
            state.add_transfer("ahead_wait", 1.0)
            state.add_transfer("state_set", 3.0, 3000)
            if state.order is not None:
                state.order.append(state.name)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunks = [
                {"choices": [{"index": 0, "delta": {"content": c}, "finish_reason": None}]}
                for c in "abc"
            ]
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            chunks.append(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": 3,
                        "prompt_tokens_details": {"cached_tokens": cached},
                    },
                }
            )
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


@pytest.fixture()
def stub() -> Iterator[tuple[str, StubState]]:
    state = StubState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def test_requests_are_deterministic_and_grow() -> None:
    plan = ToolsPlan(rounds=3, target_tokens=4000, gen_tokens=8, chars_per_token=3.0)
    convs = build_conversations(plan)
    assert convs == build_conversations(plan)
    assert len(convs) == 4
    for a, b in zip(convs, convs[1:], strict=False):
        assert b[: len(a)] == a and len(b) == len(a) + 2
    assert plan.segment_chars == int((4000 - 4 * 8) / 4 * 3.0)
    tool_msgs = [m for m in convs[-1] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == [
        "call_000",
        "call_001",
        "call_002",
        "call_003",
    ]
    assert all(len(m["content"]) == plan.segment_chars for m in tool_msgs)
    body = request_body(plan, convs[0], "x", stream=True, ignore_eos=False)
    assert body["max_tokens"] == 8 and body["temperature"] == 0.0 and "tools" in body
    text = ToolsPlan(rounds=1, tool_format=ToolFormat.TEXT)
    call = build_conversations(text)[0][2]
    assert (
        call["content"].startswith('<tool_call>{"name": "read_file"') and "tool_calls" not in call
    )


def test_make_record_client_timing_fallback() -> None:
    out = StreamOutcome(
        ttft_s=2.0,
        total_s=3.0,
        n_deltas=11,
        finish_reason="stop",
        usage={"prompt_tokens": 1000, "completion_tokens": 11, "prompt_cache_hit_tokens": 600},
    )
    r = make_record(4, out, None, None, 2048, None)
    assert (r.round, r.new_tokens, r.context_tokens, r.timing_source) == (4, 400, 1011, "client")
    assert r.prefill_s == 2.0 and r.decode_s == 1.0
    assert r.prefill_tok_s == 200.0 and r.initial_prefill_tok_s == 200.0
    assert r.decode_tok_s == 10.0  # 10 tokens after the first one, in 1 s
    assert r.stage_in_bytes is None and r.rss_bytes == 2048


def test_make_record_prefers_server_timings() -> None:
    out = StreamOutcome(
        ttft_s=2.0,
        total_s=3.0,
        n_deltas=5,
        finish_reason="stop",
        usage={"prompt_tokens": 100, "completion_tokens": 5},
        timings={"prompt_ms": 400.0, "predicted_ms": 250.0},
        kvmem={"reselect_ms": 100.0, "replay_ms": 50.0, "harvest_ms": 50.0, "stage_in_blocks": 3},
    )
    r = make_record(0, out, None, None, None, None)
    assert r.timing_source == "server" and r.prefill_s == 0.4 and r.decode_s == 0.25
    assert r.initial_prefill_s == pytest.approx(0.2) and r.initial_prefill_tok_s == pytest.approx(
        500.0
    )
    assert r.prefill_tok_s == pytest.approx(250.0) and r.decode_tok_s == 20.0
    assert r.reselect_s == 0.1 and r.stage_in_blocks == 3


def test_parse_prometheus() -> None:
    text = "# HELP a x\n# TYPE a counter\na 3\nllamacpp:prompt_tokens_total 5.5\nbad line x\n"
    assert parse_prometheus(text) == {"a": 3.0, "llamacpp:prompt_tokens_total": 5.5}


def test_tools_command_against_a_stub_server(
    stub: tuple[str, StubState], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, state = stub
    rc = main(
        [
            "tools",
            "--url",
            url,
            "--rounds",
            "3",
            "--target-tokens",
            "4000",
            "--gen-tokens",
            "8",
            "--label",
            "stub",
            "--server-pid",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    assert "tool benchmark summary" in capsys.readouterr().out
    assert len(state.requests) == 4 and all(r["stream"] for r in state.requests)
    rounds = [json.loads(line) for line in (tmp_path / "tools_stub.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert rounds[1]["cached_tokens"] == rounds[0]["prompt_tokens"]
    for r in rounds:
        assert r["timing_source"] == "server"
        assert r["prefill_s"] == pytest.approx(0.5) and r["decode_s"] == pytest.approx(0.1)
        assert r["initial_prefill_s"] == pytest.approx(0.49)
        assert r["decode_tok_s"] == pytest.approx(30.0)
        assert r["stage_in_bytes"] == 1000 and r["stage_in_blocks"] == 2
        assert r["rss_bytes"] is not None and r["completion_tokens"] == 3
    doc = json.loads((tmp_path / "tools_stub.json").read_text())
    new = sum(r["new_tokens"] for r in rounds)
    assert doc["summary"]["overall_prefill_tok_s"] == pytest.approx(new / 2.0)
    assert doc["summary"]["initial_prefill_tok_s"] == pytest.approx(new / 1.96)
    assert doc["summary"]["decode_tok_s"] == pytest.approx(30.0)
    assert (tmp_path / "tools_stub.png").stat().st_size > 1000
    # the loop report: the stub's profile grows by the same paths every request
    loop = doc["loop"]
    assert loop["harvest_reads"] == 4 and loop["harvest_read_ms"] == 32.0
    assert loop["harvest_ms"] == 40.0 and loop["harvested_bytes"] == 16000  # + copy_wait
    assert loop["build_ahead_ms"] == 24.0 and loop["built_ahead_blocks"] == 4
    assert (loop["build_on_path_ms"], loop["ahead_wait_ms"], loop["state_set_ms"]) == (0, 4, 12)
    assert loop["restore_ms"] == 16.0 and loop["build_wait_ms"] == 4.0
    assert loop["build_wait_share"] == 0.25 and loop["staging_bytes"] == 3 << 20
    assert loop["reselect_s"] == pytest.approx(0.04)
    assert loop["reselect_share"] == pytest.approx(0.04 / doc["summary"]["wall_s"])
    assert loop["prefill_ratio"] == pytest.approx(1.96 / 2.0)
    assert doc["transfer_rounds"]["state_get"]["calls"] == doc["transfer"]["state_get"]["calls"]
    assert doc["staging"]["ahead_bytes"] == 1 << 20 and "staging" not in doc["transfer"]
    text = summarize_dir(tmp_path)
    assert "tool benchmark summary" in text and "stub" in text


def test_several_servers_get_the_same_requests_interleaved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round k starts at server k mod n; every server gets byte-identical requests."""
    order: list[str] = []
    states, servers, args = [], [], ["tools", "--rounds", "3", "--target-tokens", "4000"]
    for name in ("a", "b"):
        state = StubState()
        state.order, state.name = order, name
        server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        states.append(state)
        servers.append(server)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        args += ["--url", url, "--label", name, "--server-pid", "1"]
    try:
        assert main([*args, "--gen-tokens", "8", "--out", str(tmp_path)]) == 0
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert states[0].requests == states[1].requests and len(states[0].requests) == 4
    out = capsys.readouterr().out
    table = out[out.index("tool loop: what the turns waited for") :].splitlines()
    assert [line.split()[0] for line in table[3:5]] == ["a", "b"]
    for name in ("a", "b"):
        doc = json.loads((tmp_path / f"tools_{name}.json").read_text())
        assert doc["label"] == name and doc["loop"]["harvest_reads"] == 4


def test_a_failed_round_still_reports_the_rounds_before_it(
    stub: tuple[str, StubState], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, state = stub
    state.fail_at = 2
    argv = ["tools", "--url", url, "--label", "stub", "--rounds", "3", "--server-pid", "1"]
    assert (
        main([*argv, "--target-tokens", "4000", "--gen-tokens", "8", "--out", str(tmp_path)]) == 2
    )
    captured = capsys.readouterr()
    assert "error: " in captured.err and "HTTP 400" in captured.err
    assert "tool loop: what the turns waited for" in captured.out
    doc = json.loads((tmp_path / "tools_stub.json").read_text())
    assert doc["summary"]["rounds"] == 1 and doc["loop"]["harvest_reads"] == 2


def test_tools_labels_must_match_the_urls(capsys: pytest.CaptureFixture[str]) -> None:
    two = ["tools", "--url", "http://127.0.0.1:1", "--url", "http://127.0.0.1:2"]
    assert main(two) == 2
    assert "error: --label: give one distinct --label per --url" in capsys.readouterr().err
    assert main([*two, "--label", "a", "--label", "b", "--server-pid", "1"]) == 2
    assert "error: --server-pid: give one --server-pid per --url" in capsys.readouterr().err


def test_round_deltas_survive_a_cleared_profile() -> None:
    """A round whose profile went down (the engine was reset) counts all of its after."""
    before = {"state_get": {"calls": 5, "ms": 50.0, "bytes": 500, "gb_s": 0.01}}
    after = {
        "state_get": {"calls": 2, "ms": 7.0, "bytes": 300, "gb_s": None},
        "state_set": {"calls": 1, "ms": 1.5, "bytes": 10},
        "staging": {"bytes": 1 << 26},
    }
    delta = round_delta(before, after)
    assert delta == {
        "state_get": {"calls": 2.0, "ms": 7.0, "bytes": 300.0, "net_bytes": 0.0},
        "state_set": {"calls": 1.0, "ms": 1.5, "bytes": 10.0, "net_bytes": 0.0},
    }
    grown = {"state_get": {"calls": 4, "ms": 9.5, "bytes": 700}}
    total: dict[str, dict[str, float]] = {}
    add_round(total, delta)
    add_round(total, round_delta(after, grown))
    assert total["state_get"] == {"calls": 4.0, "ms": 9.5, "bytes": 700.0, "net_bytes": 0.0}
    assert total["state_set"]["ms"] == 1.5


def test_summarize_reads_partial_logs_and_other_commands(tmp_path: Path) -> None:
    out = StreamOutcome(
        ttft_s=1.0,
        total_s=2.0,
        n_deltas=3,
        finish_reason="stop",
        usage={"prompt_tokens": 500, "completion_tokens": 3},
    )
    records = [make_record(i, out, None, None, None, None) for i in range(2)]
    (tmp_path / "tools_partial.jsonl").write_text(
        "\n".join(json.dumps({f: getattr(r, f) for f in r.__slots__}) for r in records) + "\n"
    )
    (tmp_path / "agent.json").write_text(
        json.dumps(
            {
                "command": "agent",
                "accuracy": {"full": {"single": 1.0, "multi": 0.5, "update": 0.0, "all": 0.5}},
            }
        )
    )
    text = summarize_dir(tmp_path)
    assert "partial (partial log)" in text
    assert summarize_rounds("x", records).new_tokens == 1000
    assert "agent" in text and "0.5000" in text


@pytest.mark.llama
@pytest.mark.model
def test_default_chars_per_token_fits_the_smollm2_tokenizer() -> None:
    """The default sizing lands the tool results within 4% of their token share."""
    import llama_cpp

    from kvmem.gguf.model_path import default_model_path

    plan = ToolsPlan(rounds=11, target_tokens=120000, gen_tokens=256)
    model = llama_cpp.Llama(str(default_model_path()), vocab_only=True, verbose=False)
    share = plan.target_tokens - 12 * plan.gen_tokens  # tokens of all tool results
    tool_texts = [m["content"] for m in build_conversations(plan)[-1] if m["role"] == "tool"]
    assert len(tool_texts) == 12
    n = sum(len(model.tokenize(t.encode(), add_bos=False, special=False)) for t in tool_texts)
    assert abs(n - share) / share < 0.04, (n, share)
