"""benchmarks/make_shape_gguf.py: a GGUF with a named model's shapes and random weights that
Surge opens with the spec and vocabulary of that shape and generates from, end to end; the named
shapes hold the published parameter counts; llama-quantize's files (where llama.cpp is built)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from surge import LLM, SamplingParams
from surge.models.formats.model_files import ModelFiles, open_model

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "benchmarks" / "make_shape_gguf.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_shape_gguf", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


shapes = _script()


def _assert_shape(files: ModelFiles, want: Any, smollm2: ModelFiles) -> None:
    s = files.spec
    assert (s.hidden_size, s.num_layers, s.num_heads, s.num_kv_heads) == (
        want.hidden, want.layers, want.heads, want.kv_heads)  # fmt: skip
    assert (s.intermediate_size, s.head_dim, s.vocab_size) == (want.ffn, want.head_dim, want.vocab)
    assert s.tie_word_embeddings is want.tied
    assert (s.rope_theta, s.max_position_embeddings) == (want.rope_theta, want.context)
    assert s.attention_bias is want.qkv_bias and s.qk_norm is want.qk_norm
    if want.llama3_rope_factor is None:
        assert s.rope_scaling is None
    else:  # Surge matched the rope_freqs tensor to Llama 3's scaling
        assert s.rope_scaling is not None and s.rope_scaling.kind == "llama3"
        assert s.rope_scaling.factor == want.llama3_rope_factor
    tok, ref = files.tokenizer, smollm2.tokenizer
    assert tok.vocab_size == want.vocab
    assert (tok.bos_token_id, tok.eos_token_id) == (ref.bos_token_id, ref.eos_token_id)
    assert tok.chat_template == ref.chat_template
    text = "Serving many users at once, 42 times."
    assert tok.decode(tok.encode(text)) == text
    assert files.layer_format == "F16"


def _greedy(path: Path, n: int = 4) -> list[int]:
    llm = LLM(str(path), dtype="float32", quantization="none", kv_cache_memory_gib=0.05)
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    (out,) = llm.generate(["The capital of France is"], params, use_tqdm=False)
    return list(out.outputs[0].token_ids)


def test_named_shapes_hold_the_published_parameter_counts() -> None:
    """What Hugging Face lists for the real checkpoints (rope_freqs is no parameter there)."""
    for name, published in (("llama-3.2-1b", 1_235_814_400), ("llama-3.1-8b", 8_030_261_248),
                            ("mistral-7b", 7_248_023_552)):  # fmt: skip
        plan = shapes.tensor_plan(shapes.SHAPES[name])
        assert sum(t.size for t in plan if t.kind != "rope") == published, name


def test_cli_writes_tiny_and_surge_generates_from_it(
    tmp_path: Path, smollm2_gguf_path: Path
) -> None:
    """The script as a benchmark runs it: the file is whole, Surge reads the tiny shape's spec and
    padded vocabulary, and generates; a second run keeps the file it finds."""
    cmd = [sys.executable, str(SCRIPT), "tiny", "--out-dir", str(tmp_path), "--no-quantize"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    path = tmp_path / "tiny.F16.gguf"
    assert done.stdout.startswith(f"{path}  ") and "vocab 49280 (tokenizer 49280)" in done.stdout
    assert "random weights" in done.stderr and not list(tmp_path.glob("*.part"))
    files, smollm2 = open_model(path), open_model(smollm2_gguf_path)
    _assert_shape(files, shapes.SHAPES["tiny"], smollm2)
    assert files.tokenizer.id_to_token(49279) == "[PAD49279]"  # padding, past SmolLM2's 49152
    ids = _greedy(path)
    assert len(ids) == 4 and all(0 <= i < 49280 for i in ids)
    written = path.stat().st_mtime_ns
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    assert "writing" not in again.stderr and path.stat().st_mtime_ns == written


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3"])
def test_qwen_layouts_load_and_generate(tmp_path: Path, smollm2_gguf_path: Path, name: str) -> None:
    """Qwen2's q/k/v biases and Qwen3's q/k norms (head_dim apart from hidden / heads) are
    written under the converter's names, so Surge builds those layers and runs them."""
    shape = shapes.SHAPES[name]
    path = shapes.write_shape_gguf(shape, tmp_path / f"{name}.F16.gguf", smollm2_gguf_path,
                                   progress=False)  # fmt: skip
    _assert_shape(open_model(path), shape, open_model(smollm2_gguf_path))
    assert len(_greedy(path, n=3)) == 3


def test_llama_1b_shapes_cut_to_one_layer(tmp_path: Path, smollm2_gguf_path: Path) -> None:
    """Llama-3.2-1B's layer shapes, RoPE scaling and tied head, one layer, the vocabulary cut
    below SmolLM2's (the path Mistral's 32,768 takes): the merges kept still encode text."""
    shape = replace(shapes.SHAPES["llama-3.2-1b"], layers=1, vocab=8192)
    path = shapes.write_shape_gguf(shape, tmp_path / "cut.F16.gguf", smollm2_gguf_path,
                                   progress=False)  # fmt: skip
    files = open_model(path)
    _assert_shape(files, shape, open_model(smollm2_gguf_path))
    assert (files.spec.hidden_size, files.spec.intermediate_size) == (2048, 8192)
    header_and_padding = path.stat().st_size - sum(t.nbytes for t in shapes.tensor_plan(shape))
    assert 0 < header_and_padding < 2_000_000  # the tensors' bytes, F16 matrices, no more


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    run = [sys.executable, str(SCRIPT), "tiny", "--out-dir", str(tmp_path)]
    bad = subprocess.run([*run, "--types", "Q4_K_X"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown --types ['Q4_K_X']" in bad.stderr
    missing = subprocess.run([*run, "--quantize", str(tmp_path / "nope")], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert missing.returncode != 0 and "not an executable file" in missing.stderr
    nothing = subprocess.run([*run, "--no-quantize", "--drop-f16"], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert nothing.returncode != 0 and "keeps nothing" in nothing.stderr
    small = subprocess.run([*run, "--vocab", "200", "--no-quantize"], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert small.returncode != 0 and "cuts off byte tokens (keep 252)" in small.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(
    not shapes.DEFAULT_QUANTIZE.is_file(),
    reason="llama.cpp not built (BUILD_ONLY=1 bash benchmarks/bench_llamacpp.sh)",
)
def test_llama_quantize_files_open_in_surge(tmp_path: Path) -> None:
    cmd = [sys.executable, str(SCRIPT), "tiny", "--out-dir", str(tmp_path), "--types",
           "Q8_0,Q4_0", "--drop-f16"]  # fmt: skip
    subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == ["tiny.Q4_0.gguf", "tiny.Q8_0.gguf"]
    for kind in ("Q8_0", "Q4_0"):
        files = open_model(tmp_path / f"tiny.{kind}.gguf")
        assert files.spec.num_layers == 2 and files.tokenizer.vocab_size == 49280
        assert files.layer_format in (kind, "mixed")  # small rows may fall back to another type
