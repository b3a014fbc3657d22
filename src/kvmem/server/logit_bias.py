"""`logit_bias` of OpenAI and llama-server, honoured where the sampler can: bans.

Accepted forms: OpenAI's `{"token id": bias}` and llama-server's `[[token id or text,
bias or false], ...]` (also `{"text": bias}`); a text entry applies to each of its tokens.
A bias of -100 or below, or `false`, bans the token; 0 changes nothing. Any other bias is
rejected with a 400, since the sampler chain applies bans only (never a silent no-op).
"""

from __future__ import annotations

from typing import Any

from kvmem.chat.protocol import ChatEngine
from kvmem.errors import InvalidRequestError

BAN_AT = -100.0


def banned_tokens(vocab: ChatEngine, logit_bias: Any) -> tuple[int, ...]:
    if logit_bias is None:
        return ()
    if isinstance(logit_bias, dict):
        entries = list(logit_bias.items())
    elif isinstance(logit_bias, list):
        entries = []
        for item in logit_bias:
            if not (isinstance(item, list) and len(item) == 2):
                raise InvalidRequestError(
                    "'logit_bias' entries must be [token, bias] pairs", "logit_bias"
                )
            entries.append((item[0], item[1]))
    else:
        raise InvalidRequestError("'logit_bias' must be an object or a list of pairs", "logit_bias")
    banned: list[int] = []
    n_vocab = vocab.info.n_vocab
    for key, bias in entries:
        tokens = _tokens(vocab, key, n_vocab)
        if bias is False:
            banned += tokens
            continue
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise InvalidRequestError("a logit_bias value must be a number or false", "logit_bias")
        if bias <= BAN_AT:
            banned += tokens
        elif bias != 0:
            raise InvalidRequestError(
                f"logit_bias {bias} is not supported: only bans (-100 or false) and 0 are",
                "logit_bias",
            )
    return tuple(dict.fromkeys(banned))


def _tokens(vocab: ChatEngine, key: Any, n_vocab: int) -> list[int]:
    if isinstance(key, int) and not isinstance(key, bool):
        token = key
    elif isinstance(key, str) and key.strip().lstrip("-").isdigit():
        token = int(key)
    elif isinstance(key, str):
        return vocab.tokenize(key, add_special=False, parse_special=False)
    else:
        raise InvalidRequestError("a logit_bias key must be a token id or text", "logit_bias")
    if not 0 <= token < n_vocab:
        raise InvalidRequestError(f"logit_bias token {token} is out of range", "logit_bias")
    return [token]
