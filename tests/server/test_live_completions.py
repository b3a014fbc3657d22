"""llama-server's endpoints on a live kvmem-server (SmolLM2): text completion, tokenize,
templates, slots, metrics, and the chat fields that came with them."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import LiveServer

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
GREEDY = {"temperature": 0.0, "seed": 1}
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}]


def post(server: LiveServer, path: str, body: dict, status: int = 200) -> dict:
    r = httpx.post(server.base_url + path, json=body, timeout=600)
    assert r.status_code == status, r.text
    return r.json()


def sse(server: LiveServer, path: str, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", server.base_url + path, json=body, timeout=600) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_completion_stream_equals_non_stream_with_llama_server_fields(
    main_server: LiveServer,
) -> None:
    body = {"prompt": PROMPT, "n_predict": 6, "return_tokens": True, **GREEDY}
    full = post(main_server, "/completion", body)
    assert (full["stop"], full["stop_type"], full["truncated"]) == (True, "limit", False)
    assert len(full["tokens"]) == full["tokens_predicted"] == full["timings"]["predicted_n"] == 6
    assert full["generation_settings"]["n_predict"] == 6
    assert full["timings"]["prompt_n"] + full["timings"]["cache_n"] == full["tokens_evaluated"]
    chunks = sse(main_server, "/completion", {**body, "stream": True})
    assert [c["stop"] for c in chunks] == [False] * 6 + [True]
    assert "".join(c["content"] for c in chunks) == full["content"]
    assert [c["tokens"][0] for c in chunks[:-1]] == full["tokens"]
    # the same prompt again: the session reuses it
    assert chunks[-1]["timings"]["cache_n"] >= full["tokens_evaluated"] - 1


def test_v1_completions_with_the_openai_client(main_server: LiveServer) -> None:
    client = main_server.client()
    native = post(main_server, "/completion", {"prompt": PROMPT, "n_predict": 5, **GREEDY})
    res = client.completions.create(model="smol", prompt=PROMPT, max_tokens=5, **GREEDY)
    assert res.choices[0].text == native["content"]
    assert res.choices[0].finish_reason == "length"
    assert res.system_fingerprint is not None and res.system_fingerprint.startswith("b")
    assert res.usage is not None and res.usage.completion_tokens == 5
    stream = client.completions.create(
        model="smol", prompt=PROMPT, max_tokens=5, stream=True, **GREEDY
    )
    parts = [c.choices[0].text for c in stream if c.choices]
    assert "".join(parts) == native["content"]
    batch = client.completions.create(model="smol", prompt=[PROMPT, PROMPT], max_tokens=5, **GREEDY)
    assert [c.text for c in batch.choices] == [native["content"]] * 2
    lp = client.completions.create(model="smol", prompt=PROMPT, max_tokens=3, logprobs=2, **GREEDY)
    assert lp.choices[0].logprobs is not None
    assert "".join(lp.choices[0].logprobs.tokens or []) == lp.choices[0].text
    assert all(len(t) == 2 for t in lp.choices[0].logprobs.top_logprobs or [])


def test_n_probs_greedy_picks_the_top_token(main_server: LiveServer) -> None:
    body = {"prompt": PROMPT, "n_predict": 4, "n_probs": 3, **GREEDY}
    res = post(main_server, "/completion", body)
    probs = res["completion_probabilities"]
    assert len(probs) == 4
    for p in probs:
        assert len(p["top_logprobs"]) == 3
        assert p["id"] == p["top_logprobs"][0]["id"] and p["logprob"] <= 0.0
        assert [t["logprob"] for t in p["top_logprobs"]] == sorted(
            (t["logprob"] for t in p["top_logprobs"]), reverse=True
        )
    post_s = post(main_server, "/completion", {**body, "post_sampling_probs": True})
    for p in post_s["completion_probabilities"]:
        assert p["prob"] == 1.0 and [t["prob"] for t in p["top_probs"]] == [1.0]  # greedy


def test_backend_sampling_samples_as_the_cpu_chain(main_server: LiveServer) -> None:
    """llama-server's `backend_sampling` runs the same chain elsewhere: the tokens and the
    post-sampling probabilities of a seeded request are those without it."""
    body = {"prompt": PROMPT, "n_predict": 6, "n_probs": 5, "post_sampling_probs": True}
    body |= {"seed": 4242, "temperature": 1.0}
    on = post(main_server, "/completion", {**body, "backend_sampling": True})
    off = post(main_server, "/completion", {**body, "backend_sampling": False})
    assert len(on["completion_probabilities"]) == 6
    assert on["completion_probabilities"] == off["completion_probabilities"]
    assert on["content"] == off["content"]


def test_tokenize_detokenize_round_trip(main_server: LiveServer) -> None:
    text = "Hello world, 媽 🤗"
    tokens = post(main_server, "/tokenize", {"content": text})["tokens"]
    assert post(main_server, "/detokenize", {"tokens": tokens})["content"] == text
    pieces = post(main_server, "/tokenize", {"content": text, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == tokens
    joined = b"".join(
        p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces
    )
    assert joined.decode() == text


def test_apply_template_and_input_tokens_match_chat(main_server: LiveServer) -> None:
    prompt = post(main_server, "/apply-template", {"messages": CHAT})["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n") and "Name a fruit." in prompt
    chat = post(
        main_server,
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 2, "verbose": True, **GREEDY},
    )
    assert chat["__verbose"]["prompt"] == prompt
    counted = post(main_server, "/chat/completions/input_tokens", {"messages": CHAT})
    assert counted["input_tokens"] == chat["usage"]["prompt_tokens"]


def test_assistant_prefill_is_continued(main_server: LiveServer) -> None:
    messages = [*CHAT, {"role": "assistant", "content": "My answer: ban"}]
    res = post(
        main_server,
        "/v1/chat/completions",
        {"messages": messages, "max_tokens": 3, "verbose": True, **GREEDY},
    )
    assert res["__verbose"]["prompt"].endswith("<|im_start|>assistant\nMy answer: ban")
    two = [*messages, {"role": "assistant", "content": "again"}]
    err = post(main_server, "/v1/chat/completions", {"messages": two}, status=400)
    assert (
        err["error"]["message"]
        == "Cannot have 2 or more assistant messages at the end of the list."
    )


def test_slots_state_and_unsupported_save(main_server: LiveServer) -> None:
    r = httpx.get(main_server.base_url + "/slots", timeout=60)
    assert r.status_code == 200
    slots = r.json()
    assert len(slots) == 1 and slots[0]["id"] == 0 and slots[0]["is_processing"] is False
    assert slots[0]["n_ctx"] == 8192
    err = post(main_server, "/slots/0?action=save", {"filename": "x.bin"}, status=501)
    assert err["error"]["type"] == "not_supported_error"


def test_logit_bias_bans_tokens_and_rejects_other_biases(main_server: LiveServer) -> None:
    first = post(
        main_server, "/completion", {"prompt": PROMPT, "n_predict": 1, "n_probs": 1, **GREEDY}
    )
    top = first["completion_probabilities"][0]["id"]
    banned = post(
        main_server,
        "/completion",
        {
            "prompt": PROMPT,
            "n_predict": 1,
            "logit_bias": {str(top): -100},
            "return_tokens": True,
            **GREEDY,
        },
    )
    assert banned["tokens"] and banned["tokens"][0] != top
    assert banned["generation_settings"]["logit_bias"] == [{"token": top, "bias": None}]
    assert first["generation_settings"]["logit_bias"] == []
    ask = {"messages": CHAT, "max_tokens": 1, "logprobs": True, **GREEDY}
    plain = post(main_server, "/v1/chat/completions", ask)["choices"][0]["logprobs"]["content"][0]
    ids = post(main_server, "/tokenize", {"content": plain["token"]})["tokens"]
    biased = post(main_server, "/v1/chat/completions", {**ask, "logit_bias": [[ids[0], False]]})
    assert biased["choices"][0]["logprobs"]["content"][0]["token"] != plain["token"]
    err = post(main_server, "/completion", {"prompt": PROMPT, "logit_bias": {"5": 2.5}}, status=400)
    assert err["error"]["param"] == "logit_bias"


def test_grammar_and_json_schema_constrain_chat(main_server: LiveServer) -> None:
    res = post(
        main_server,
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 8, "grammar": 'root ::= "a"{5,5}', **GREEDY},
    )
    assert res["choices"][0]["message"]["content"] == "aaaaa"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    res = post(
        main_server,
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 24, "json_schema": schema, **GREEDY},
    )
    assert isinstance(json.loads(res["choices"][0]["message"]["content"])["n"], int)
    bad = post(
        main_server,
        "/v1/chat/completions",
        {"messages": CHAT, "grammar": "root ::= this is (not valid"},
        status=400,
    )
    assert bad["error"]["param"] == "grammar"


def test_chat_logprobs_stream_equals_non_stream(main_server: LiveServer) -> None:
    client = main_server.client()
    kwargs = {
        "model": "smol",
        "messages": CHAT,
        "max_tokens": 5,
        "logprobs": True,
        "top_logprobs": 2,
    }
    res = client.chat.completions.create(**kwargs, **GREEDY)
    content = res.choices[0].message.content or ""
    entries = res.choices[0].logprobs.content or []
    assert "".join(e.token for e in entries) == content and len(entries) == 5
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.content is None  # the role chunk
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]


def test_n_choices_and_context_overflow(main_server: LiveServer) -> None:
    res = post(
        main_server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "n": 2, **GREEDY}
    )
    assert [c["index"] for c in res["choices"]] == [0, 1]
    assert res["choices"][0]["message"] == res["choices"][1]["message"]  # greedy
    huge = {"prompt": "word " * 9000, "n_predict": 1}
    err = post(main_server, "/completion", huge, status=400)["error"]
    assert (err["type"], err["code"], err["n_ctx"]) == (
        "exceed_context_size_error",
        "context_length_exceeded",
        8192,
    )
    assert err["n_prompt_tokens"] > 8192


def test_llamacpp_metrics_count_a_request(main_server: LiveServer) -> None:
    def scrape() -> dict[str, tuple[str, float]]:
        r = httpx.get(main_server.base_url + "/metrics", timeout=60)
        assert r.status_code == 200 and int(r.headers["Process-Start-Time-Unix"]) > 0
        out = {}
        for fam in text_string_to_metric_families(r.text):
            for sample in fam.samples:
                out[sample.name] = (fam.type, sample.value)
        return out

    before = scrape()
    res = post(main_server, "/completion", {"prompt": "Count: 1 2 3", "n_predict": 4, **GREEDY})
    after = scrape()
    t = res["timings"]
    assert (
        after["llamacpp:tokens_predicted_total"][1] - before["llamacpp:tokens_predicted_total"][1]
        == t["predicted_n"]
    )
    assert (
        after["llamacpp:prompt_tokens_total"][1] - before["llamacpp:prompt_tokens_total"][1]
        == t["prompt_n"]
    )
    assert after["llamacpp:n_decode_total"][1] > before["llamacpp:n_decode_total"][1]
    assert after["llamacpp:requests_processing"] == ("gauge", 0.0)
    assert after["llamacpp:prompt_tokens_seconds"][0] == "gauge"
    assert after["llamacpp:n_decode_total"][0] == "counter"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completion", {"n_predict": 3}, "prompt"),
        ("/completion", {"prompt": [1, 10**9]}, "prompt"),
        ("/completion", {"prompt": "x", "n_probs": "3"}, "n_probs"),
        ("/completion", {"prompt": "x", "backend_sampling": "yes"}, "backend_sampling"),
        ("/v1/chat/completions", {"messages": CHAT, "backend_sampling": 1}, "backend_sampling"),
        ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
        ("/v1/completions", {"prompt": "x", "echo": True}, "echo"),
        ("/completion", {"prompt": ["a", "b"], "stream": True}, "prompt"),
        ("/completion", {"prompt": {"prompt_string": "x", "multimodal_data": ["A"]}}, "prompt"),
        ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
        ("/detokenize", {"tokens": ["a"]}, "tokens"),
        ("/apply-template", {"messages": "hi"}, "messages"),
        ("/chat/completions/input_tokens", {"messages": []}, "messages"),
    ],
)
def test_bad_input_to_new_endpoints_is_a_400_envelope(
    main_server: LiveServer, path: str, body: dict, param: str
) -> None:
    err = post(main_server, path, body, status=400)["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
BARE_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def test_bare_json_reply_is_a_tool_call_only_when_tools_are_given(main_server: LiveServer) -> None:
    grammar = "root ::= " + json.dumps(BARE_CALL)  # the model must write exactly BARE_CALL
    ask = {"messages": CHAT, "max_tokens": 160, "grammar": grammar, **GREEDY}
    with_tools = post(main_server, "/v1/chat/completions", {**ask, "tools": WEATHER})
    choice = with_tools["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    chunks = sse(main_server, "/v1/chat/completions", {**ask, "tools": WEATHER, "stream": True})
    deltas = [
        d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert deltas[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(d["function"].get("arguments", "") for d in deltas)) == {
        "city": "Paris"
    }
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks if c["choices"])
    without = post(main_server, "/v1/chat/completions", ask)["choices"][0]
    assert (without["message"]["content"], without["finish_reason"]) == (BARE_CALL, "stop")
    none = post(
        main_server, "/v1/chat/completions", {**ask, "tools": WEATHER, "tool_choice": "none"}
    )
    assert none["choices"][0]["message"]["content"] == BARE_CALL
