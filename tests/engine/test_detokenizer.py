"""Streaming detokenization with the real SmolLM2 tokenizer: deltas add up to decode()."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import gguf
import pytest

from surge.engine.client.detokenizer import IncrementalDetokenizer
from surge.models.formats.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello world",
    " leading space and trailing ",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "日本語のテキストです。中文测试，한국어",
    "café naïve résumé Ångström Ελληνικά русский",
    "def f(x):\n    return x ** 2  # square\n\n",
    "digits 1234567890 and 3.14159 and ½ ² ٣",
    "   multiple   spaces\t\ttabs\n\n\nnewlines",
    "<|im_start|>assistant\nSure!<|im_end|>\n<|endoftext|>",
    "text then special<|im_end|>😀 after",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 ∀x∈ℝ",
    "",
]


@pytest.fixture(scope="module")
def tok(smollm2_gguf_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(gguf.GGUFReader(smollm2_gguf_path))


@pytest.fixture(scope="module")
def prompt(tok: Tokenizer) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": "Say something"}]))


def stream(tok: Tokenizer, prompt: Sequence[int], ids: Sequence[int], skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.flush())
    assert detok.text == "".join(deltas)
    return deltas


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip", [True, False])
def test_deltas_add_up_to_decode(tok: Tokenizer, prompt: list[int], text: str, skip: bool) -> None:
    ids = tok.encode(text)
    assert "".join(stream(tok, prompt, ids, skip)) == tok.decode(ids, skip_special_tokens=skip)
    assert "".join(stream(tok, [], ids, skip)) == tok.decode(ids, skip_special_tokens=skip)


def test_incomplete_character_is_held_back(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1  # the emoji is split into byte tokens
    deltas = stream(tok, [], ids, skip=True)
    assert deltas[:-2] == [""] * (len(ids) - 1)
    assert deltas[-2:] == ["😀", ""]
    assert all("\ufffd" not in d for d in stream(tok, [], tok.encode(TEXTS[2]), True))


def test_flush_returns_an_unfinished_character(tok: Tokenizer) -> None:
    ids = tok.encode("ok 😀")[:-1]  # cut inside the emoji
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    emitted = "".join(detok.add(i) for i in ids)
    assert emitted == "ok"  # " " shares a token with the emoji's first byte
    rest = detok.flush()
    assert rest.endswith("\ufffd")
    assert emitted + rest == tok.decode(ids)
    assert detok.flush() == ""


@pytest.mark.parametrize("skip", [True, False])
def test_random_token_sequences(tok: Tokenizer, prompt: list[int], skip: bool) -> None:
    rng = random.Random(7)
    # Single-byte tokens make invalid and split UTF-8 sequences likely.
    byte_tokens = [i for i in range(tok.vocab_size) if len(tok.id_to_token(i)) == 1]
    for _ in range(150):
        pool = byte_tokens if rng.random() < 0.5 else range(tok.vocab_size)
        ids = [rng.choice(pool) for _ in range(rng.randrange(1, 40))]
        expected = tok.decode(ids, skip_special_tokens=skip)
        assert "".join(stream(tok, prompt, ids, skip)) == expected, ids


def test_cost_per_token_does_not_grow(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    longest = 0
    real_decode = tok.decode

    def measured(ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        nonlocal longest
        longest = max(longest, len(ids))
        return real_decode(ids, skip_special_tokens)

    monkeypatch.setattr(tok, "decode", measured)
    ids = tok.encode("Streaming text, 日本語 and 😀 emoji. " * 300)
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    for token_id in ids:
        detok.add(token_id)
    detok.flush()
    assert len(ids) > 3000
    assert longest <= 8  # a few tokens of context, whatever the output length
    assert detok.text == real_decode(ids)
