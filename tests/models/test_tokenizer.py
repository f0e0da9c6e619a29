"""Our GGUF / HF-folder tokenizer against transformers' tokenizer for the real SmolLM2 model."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import gguf
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import pre_tokenizers

from surge.models.formats.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello world",
    "hello, World! How are you?",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "   ",
    "",
    "multiple   spaces\tand\t\ttabs",
    "line one\nline two\n\n\nline five\r\nwindows",
    "12345 + 678 = 999",
    "pi is 3.14159, e is 2.71828",
    "x1y22z333 v0.19.0 2026-12-02",
    "emoji 😀🎉 and 👍🏽 skin tone, family 👨‍👩‍👧",
    "日本語のテキストです。",
    "中文测试：你好，世界！",
    "한국어 문장",
    "café naïve résumé façade Ångström",
    "Ελληνικά και русский текст",
    "العربية والعبرية עברית",
    "def f(x):\n    return x ** 2  # square\n",
    'fn main() { println!("{}", 42); }',
    '<div class="a">&amp; &lt;tag&gt;</div>',
    "SELECT * FROM users WHERE id = 7;",
    "don't you'll I'M they've we'd",
    "Ω≈ç√∫˜µ≤≥÷",
    "\u200b zero width \u00a0 nbsp",
    "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|>",
    "a<|im_end|>b<|im_start|>c",
    "<repo_name>surge<file_sep>README.md",
    "<|im_start|> spaced <|im_end|>",
    "not special: <|im_sta rt|> <im_end>",
    "tab\tnewline\nmix \t \n end",
    "ALL CAPS SHOUTING!!!???",
    "mixedCASE snake_case kebab-case CONSTANT_CASE",
    "https://example.com/path?q=1&r=two#frag",
]
# Unicode numerals outside 0-9. SmolLM2 (and llama.cpp's "smollm" pre-tokenizer) isolates every
# \p{N} character; transformers' GGUF loader uses the plain GPT-2 split here instead, so these
# are checked against SmolLM2's own tokenizer.json pre-tokenizer (Digits + ByteLevel).
NUMERAL_TEXTS = ["½ ² ٣", "x² + y² = z²", "Ⅻ and ⅷ", "١٢٣ ४५६", "①② steps"]

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [
        {"role": "user", "content": "Tell me a joke 😀"},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why?"},
    ],
]


@pytest.fixture(scope="module")
def ours(smollm2_gguf_path: Path) -> Tokenizer:
    return Tokenizer.from_gguf(gguf.GGUFReader(smollm2_gguf_path))


@pytest.fixture(scope="module")
def hf(smollm2_gguf_path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    path = smollm2_gguf_path
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def hf_folder(hf: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    hf.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return folder


def test_facts(ours: Tokenizer) -> None:
    assert ours.vocab_size == 49152
    assert (ours.bos_token_id, ours.eos_token_id, ours.eos_token_ids) == (1, 2, (2,))
    assert not ours.add_bos_token
    assert ours.chat_template is not None
    assert ours.is_special(1) and ours.is_special(0) and not ours.is_special(905)
    assert ours.id_to_token(905) == "Ġworld"
    assert ours.encode("Hi", add_special_tokens=True) == ours.encode("Hi", False)
    with pytest.raises(ValueError, match="out of range"):
        ours.decode([49152])


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(ours: Tokenizer, hf: Any, text: str) -> None:
    ids = ours.encode(text)
    assert ids == hf.encode(text)
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
            ids, skip_special_tokens=skip
        )
    assert [ours.id_to_token(i) for i in ids] == hf.convert_ids_to_tokens(ids)


def test_unicode_numerals_split_like_smollm2(ours: Tokenizer, hf: Any) -> None:
    reference = HFTokenizer.from_str(hf.backend_tokenizer.to_str())
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    for text in NUMERAL_TEXTS:
        ids = ours.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids) == text


def test_decode_random_ids_matches_transformers(ours: Tokenizer, hf: Any) -> None:
    rng = random.Random(1234)
    for _ in range(200):
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(1, 30))]
        if rng.random() < 0.5:
            ids.insert(rng.randrange(len(ids)), rng.randrange(17))  # a special token
        for skip in (True, False):
            assert ours.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    ours: Tokenizer, hf: Any, conversation: list[dict[str, Any]], add_generation_prompt: bool
) -> None:
    expected = hf.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.apply_chat_template(conversation, add_generation_prompt) == expected


def test_no_chat_template_raises(ours: Tokenizer) -> None:
    bare = Tokenizer(ours.backend, bos_token_id=None, eos_token_id=2)
    with pytest.raises(ValueError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "hi"}])


def test_hf_folder_matches_transformers(hf_folder: Path, hf: Any) -> None:
    ours = Tokenizer.from_hf_folder(hf_folder)
    assert (ours.bos_token_id, ours.eos_token_id, ours.eos_token_ids) == (1, 2, (2, 0))
    assert ours.vocab_size == len(hf)
    assert not ours.add_bos_token
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == hf.encode(text)
        assert ours.decode(ids, False) == hf.decode(ids, skip_special_tokens=False)
    for conversation in CONVERSATIONS:
        assert ours.apply_chat_template(conversation) == hf.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True
        )


def test_hf_folder_template_in_config_and_add_bos(hf_folder: Path, tmp_path: Path) -> None:
    # Older transformers kept the template inside tokenizer_config.json.
    template = (hf_folder / "chat_template.jinja").read_text()
    config = json.loads((hf_folder / "tokenizer_config.json").read_text())
    config.update(chat_template=template, add_bos_token=True)
    (tmp_path / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = Tokenizer.from_hf_folder(tmp_path)
    assert ours.chat_template == template
    assert ours.encode("Hi") == [1, *ours.encode("Hi", add_special_tokens=False)]
