"""ChatML rendering with exact query spans, and the last-N-tokens baseline."""

from __future__ import annotations

from kvmem.bench.conversation import ChatMLRenderer, Message, Role, last_tokens_only
from kvmem.memory.spans import TokenSpan
from tests.fakes.bench import CharTokenizer

MESSAGES = [
    Message(Role.SYSTEM, "sys"),
    Message(Role.USER, "hello"),
    Message(Role.ASSISTANT, "hi"),
    Message(Role.TOOL, "out"),
    Message(Role.USER, "why?"),
]


def test_render_tokens_and_spans() -> None:
    tok = CharTokenizer()
    prompt = ChatMLRenderer(tok).render(MESSAGES)
    expected = "".join(f"<|im_start|>{m.role.value}\n{m.content}<|im_end|>\n" for m in MESSAGES)
    expected += "<|im_start|>assistant\n"
    assert prompt.tokens == tok.tokenize(expected)
    assert tok.detokenize(prompt.tokens) == expected
    # "<|im_start|>system\n" is 1 + 7 tokens; content "sys" is [8, 11); footer 2 tokens
    assert prompt.message_spans[0] == TokenSpan(8, 11)
    assert prompt.system_end == 13
    assert prompt.query == prompt.message_spans[4]
    assert tok.detokenize(prompt.tokens[prompt.query.start : prompt.query.end]) == "why?"
    for message, span in zip(MESSAGES, prompt.message_spans, strict=True):
        assert tok.detokenize(prompt.tokens[span.start : span.end]) == message.content


def test_prefix_is_stable_and_answer_prefix_appends() -> None:
    tok = CharTokenizer()
    renderer = ChatMLRenderer(tok, bos_token=0)
    short = renderer.render(MESSAGES[:2], add_generation_prompt=False)
    longer = renderer.render(MESSAGES, answer_prefix="The key is")
    assert short.tokens[0] == 0
    assert longer.tokens[: len(short.tokens)] == short.tokens
    assert tok.detokenize(longer.tokens).endswith("<|im_start|>assistant\nThe key is")
    assert renderer.reply_tokens(MESSAGES, "ok", longer) == [ord("o"), ord("k"), 2]


def test_last_tokens_only_keeps_system_and_tail() -> None:
    tok = CharTokenizer()
    prompt = ChatMLRenderer(tok).render(MESSAGES)
    n = len(prompt.tokens)
    cut = last_tokens_only(prompt, 30)
    assert len(cut.tokens) == 30
    assert cut.tokens[:13] == prompt.tokens[:13]
    assert cut.tokens[13:] == prompt.tokens[n - 17 :]
    assert cut.system_end == 13
    # the query (the last user message) lies inside the kept tail, shifted left
    shift = (n - 17) - 13
    assert cut.query == TokenSpan(prompt.query.start - shift, prompt.query.end - shift)
    assert tok.detokenize(cut.tokens[cut.query.start : cut.query.end]) == "why?"
    assert last_tokens_only(prompt, n) is prompt


def test_last_tokens_only_clips_a_query_that_starts_before_the_tail() -> None:
    tok = CharTokenizer()
    prompt = ChatMLRenderer(tok).render(MESSAGES)
    # the last 15 tokens: "y?" + <|im_end|> "\n" + <|im_start|> "assistant\n"
    cut = last_tokens_only(prompt, 13 + 15)
    assert tok.detokenize(cut.tokens[13:]) == "y?<|im_end|>\n<|im_start|>assistant\n"
    assert cut.query == TokenSpan(13, 15)
