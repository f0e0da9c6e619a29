"""Tokenizers rebuilt from small GGUF vocabularies written here, against transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from tokenizers import pre_tokenizers

from surge.models.formats.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

PIECES = ["▁", "t", "h", "e", "▁t", "he", "▁the", "a", "n", "d", "an", "▁an", "▁and", "o", "r"]
PIECES += ["or", "▁or", "x", "y", "i", "s", "is", "▁is", "1", "2", "3"]
# Byte-level merges that join digits, so the digit split of each pre-tokenizer shows.
DIGIT_MERGES = ["1 2", "12 3", "4 5", "3 4", "Ġ t", "h e", "Ġt he"]
TEXTS = ["12345 and 6789", "the 1234", "x1y22z333", "don't stop", "a\n\n b  c", "ünï 😀"]


def write_vocab_gguf(path: Path, model: str, pre: str | None = None) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(32)
    writer.add_head_count(2)
    writer.add_tokenizer_model(model)
    if model == "llama":  # SentencePiece: byte-fallback tokens, scored pieces, no merges
        tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *PIECES]
        types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)
        writer.add_token_scores([0.0] * 259 + [10.0 * len(p) - 100 for p in PIECES])
        writer.add_unk_token_id(0)
    else:
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        merged = [m.replace(" ", "") for m in DIGIT_MERGES]
        tokens = ["<|endoftext|>", "<|im_end|>", *alphabet, *merged]
        types = [3, 3] + [1] * (len(tokens) - 2)
        writer.add_token_merges(DIGIT_MERGES)
        writer.add_tokenizer_pre(pre or "default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2 if model == "llama" else 1)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def load_both(tmp_path: Path, model: str, pre: str | None = None) -> tuple[Tokenizer, Any]:
    path = tmp_path / "vocab.gguf"
    write_vocab_gguf(path, model, pre)
    ours = Tokenizer.from_gguf(gguf.GGUFReader(path))
    return ours, transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt2"])
def test_byte_level_pre_tokenizers_match_transformers(tmp_path: Path, pre: str) -> None:
    ours, hf = load_both(tmp_path, "gpt2", pre)
    assert not ours.add_bos_token
    for text in [*TEXTS, "end<|im_end|>"]:
        ids = ours.encode(text)
        assert ids == hf.encode(text), text
        assert (
            ours.decode(ids)
            == hf.decode(ids, skip_special_tokens=True)
            == text.replace("<|im_end|>", "")
        )


def test_digit_split_differs_by_pre_tokenizer(tmp_path: Path) -> None:
    # llama3 groups up to 3 digits, qwen2 and smollm isolate each digit.
    expected = {"llama-bpe": ["123", "45"], "qwen2": list("12345"), "smollm": list("12345")}
    for pre, pieces in expected.items():
        folder = tmp_path / pre
        folder.mkdir()
        write_vocab_gguf(folder / "v.gguf", "gpt2", pre)
        tok = Tokenizer.from_gguf(gguf.GGUFReader(folder / "v.gguf"))
        assert [tok.id_to_token(i) for i in tok.encode("12345")] == pieces, pre


def test_sentencepiece_vocab_matches_transformers(tmp_path: Path) -> None:
    ours, hf = load_both(tmp_path, "llama")
    assert ours.add_bos_token and ours.bos_token_id == 1
    # Merges are rebuilt from scores; bytes outside the pieces use byte fallback.
    for text in ["the and or", "theory is", "the  and", "ünï x 😀", "and\nor", "xyz"]:
        ids = ours.encode(text)
        assert ids == hf.encode(text), text
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True) == text
    # Like SentencePiece and llama.cpp, a space is prefixed even to text starting with one.
    assert ours.encode(" the", add_special_tokens=False) == [
        ours.backend.token_to_id("▁"),
        ours.backend.token_to_id("▁the"),
    ]
