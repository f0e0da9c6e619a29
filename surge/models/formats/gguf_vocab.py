"""Rebuild a `tokenizers.Tokenizer` from the vocabulary llama.cpp stores in GGUF metadata.

A GGUF has no tokenizer.json: it keeps tokens, merges, token types and the name of the
pre-tokenizer ("tokenizer.ggml.pre"), and llama.cpp hard-codes the split regex for each name.
We mirror those regexes so token ids match what the model was trained on.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from surge.models.formats.gguf_file import GGUFSource

logger = logging.getLogger(__name__)

# llama.cpp token types (llama_token_type).
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The pre-tokenizer names llama.cpp gives each split; names not listed get plain GPT-2.
_LLAMA3_NAMES = frozenset(
    {"llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe", "falcon3", "pixtral", "lfm2"}
)
_QWEN2_NAMES = frozenset({"qwen2", "deepseek-r1-qwen", "megrez"})
# StarCoder family: every digit on its own, then the GPT-2 regex.
_DIGIT_NAMES = frozenset(
    {"smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva-7b"}
)
_GPT2_NAMES = frozenset({"gpt2", "default", "gpt-2", "olmo", "mpt", "jais", "phi-2", "stablelm2"})


def tokenizer_from_gguf(reader: GGUFSource) -> HFTokenizer:
    """Build the backend tokenizer for the vocabulary described by `reader`."""
    kind = _field(reader, "tokenizer.ggml.model")
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens") or [])
    if not tokens:
        raise ValueError("GGUF file has no tokenizer.ggml.tokens; cannot build a tokenizer")
    types: list[int] = list(_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = _field(reader, "tokenizer.ggml.merges")
    if kind == "gpt2":
        pre = str(_field(reader, "tokenizer.ggml.pre", "default"))
        tok = _byte_level(tokens, types, merges, pre)
    elif kind == "llama":
        scores = list(_field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens))
        add_space = bool(_field(reader, "tokenizer.ggml.add_space_prefix", True))
        tok = _sentencepiece(tokens, types, merges, scores, add_space)
    else:
        raise ValueError(
            f"unsupported GGUF tokenizer model {kind!r}; supported: gpt2 (byte-level BPE), "
            "llama (SentencePiece BPE)"
        )
    _add_special_tokens(tok, tokens, types)
    return tok


def _byte_level(tokens: list[str], types: list[int], merges: Any, pre: str) -> HFTokenizer:
    if merges is None:
        raise ValueError("byte-level GGUF vocabulary has no tokenizer.ggml.merges")
    alphabet = set(_byte_to_char().values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if types[index] not in (_CONTROL, _USER_DEFINED) and not set(token) <= alphabet:
            # Some converters store plain text; the BPE model needs the byte alphabet spelling.
            token = "".join(_byte_to_char()[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, index)
    pairs = [_split_merge(m) for m in merges]
    model = models.BPE(vocab, pairs, fuse_unk=False, ignore_merges=pre in _LLAMA3_NAMES)
    tok = HFTokenizer(model)
    tok.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    return tok


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre in _LLAMA3_NAMES or pre in _QWEN2_NAMES:
        split = _LLAMA3_SPLIT if pre in _LLAMA3_NAMES else _QWEN2_SPLIT
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_NAMES:
        digits = pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")
        return pre_tokenizers.Sequence([digits, gpt2])
    if pre not in _GPT2_NAMES:
        logger.warning("unknown GGUF pre-tokenizer %r; using the GPT-2 split", pre)
    return gpt2


def _sentencepiece(
    tokens: list[str], types: list[int], merges: Any, scores: list[float], add_space: bool
) -> HFTokenizer:
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    pairs = (
        [_split_merge(m) for m in merges]
        if merges is not None
        else _merges_from_scores(vocab, scores)
    )
    unk = next((t for t, ty in zip(tokens, types, strict=True) if ty == _UNKNOWN), None)
    model = models.BPE(vocab, pairs, unk_token=unk, fuse_unk=True, byte_fallback=True)
    tok = HFTokenizer(model)
    # llama.cpp prefixes a space to the text and after every special token: Prepend does both.
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", "\u2581")]
    if add_space:
        steps.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    strip: list[decoders.Decoder] = [decoders.Strip(" ", 1, 0)] if add_space else []
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tok


def _merges_from_scores(vocab: dict[str, int], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece GGUFs often lack merges: a merge exists for every split of a piece into
    two pieces, and better-scored pieces merge first."""
    found: list[tuple[float, int, int, str, str]] = []
    for piece, piece_id in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((-scores[piece_id], vocab[left], vocab[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _add_special_tokens(tok: HFTokenizer, tokens: list[str], types: list[int]) -> None:
    # Whole-token matching in text, as llama.cpp does: control/unknown are special
    # (skipped when decoding with skip_special_tokens), user-defined are plain added tokens.
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty in (_CONTROL, _UNKNOWN)
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty == _USER_DEFINED
    ]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)


def _split_merge(merge: str) -> tuple[str, str]:
    left, sep, right = merge.partition(" ")
    if not sep:
        raise ValueError(f"malformed GGUF merge {merge!r}: expected two tokens")
    return left, right


@cache
def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _field(reader: GGUFSource, name: str, default: Any = None) -> Any:
    field = reader.get_field(name)
    return default if field is None else field.contents()
