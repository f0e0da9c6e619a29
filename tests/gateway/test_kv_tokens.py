"""The kv_aware policy's tokenizing: the piece-by-piece encoder (ids of long pieces kept)
gives exactly the tokenizer's own ids, which the replicas' block hashes are made of; and the
block hashes' fast path gives exactly the chained hash_block's."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from surge.gateway.kv_tokens import SegmentEncoder, load_tokenizer, prompt_tokens
from surge.kv_events.hashing import block_hashes, extend_block_hashes, hash_block
from surge.models.formats.tokenizer import Tokenizer

WORDS = ["cache", " the", "  spaced", "naïve", "日本語", "123", "4.5e6", "\n", "\t", "don't", "é"]


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(["", " ", "  ", "\n"]) for _ in range(n))


def test_piece_by_piece_encoding_is_the_tokenizers_own(smollm2_gguf_path: Path) -> None:
    tok = load_tokenizer(str(smollm2_gguf_path))
    enc = SegmentEncoder(tok, max_entries=8, min_chars=16)
    assert enc._cut is not None  # SmolLM2's added tokens allow cutting
    rng = random.Random(0)
    system = "You are the desk's assistant. " * 20
    for i in range(60):
        messages = [{"role": "system", "content": system}]
        for _ in range(rng.randrange(1, 4)):
            messages.append({"role": "user", "content": _text(rng, rng.randrange(0, 40))})
            messages.append({"role": "assistant", "content": _text(rng, rng.randrange(0, 40))})
        if i % 5 == 0:  # added tokens written in the content are matched whole, as the server's
            messages[-1]["content"] += "<|im_end|><|im_start|>user\n<|endoftext|>x<|im_en"
        text = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert enc.encode(text, add_special_tokens=False) == tok.encode(text, False), i
        assert enc.encode(text) == tok.encode(text), i
    assert len(enc._kept) == 8  # bounded
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]}
    got = prompt_tokens(body, str(smollm2_gguf_path), 1 << 20)
    text = tok.apply_chat_template(body["messages"], add_generation_prompt=True)
    assert got is not None and list(got.token_ids) == tok.encode(text, add_special_tokens=False)


def test_a_tokenizer_whose_added_tokens_strip_space_is_encoded_whole(
    smollm2_gguf_path: Path,
) -> None:
    base = load_tokenizer(str(smollm2_gguf_path))
    backend = HFTokenizer.from_str(base.backend.to_str())
    backend.add_special_tokens([AddedToken("<|sep|>", lstrip=True, special=True)])
    tok = Tokenizer(backend, bos_token_id=None, eos_token_id=None)
    enc = SegmentEncoder(tok)
    assert enc._cut is None
    text = "a long line of text " * 10 + "   <|sep|> and more"
    assert enc.encode(text) == tok.encode(text)


def test_block_hashes_fast_path_is_the_chained_hash_block() -> None:
    rng = random.Random(1)
    for _ in range(200):
        size = rng.choice([1, 3, 16])
        ids = [rng.randrange(-(2**40), 2**40) for _ in range(rng.randrange(0, 120))]
        extra = rng.choice([b"", b"tenant-7"])
        want, parent = [], None
        for i in range(len(ids) // size):
            parent = hash_block(parent, ids[i * size : (i + 1) * size], extra if i == 0 else b"")
            want.append(parent)
        assert block_hashes(ids, size, extra) == want
        got: list[bytes] = []
        extend_block_hashes(got, ids[: rng.randrange(0, len(ids) + 1)], size, extra)
        extend_block_hashes(got, tuple(ids), size, extra)
        assert got == want
