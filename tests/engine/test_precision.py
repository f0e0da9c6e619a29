"""Precision chosen from the device, the KV cache dtype, int8 and torch.compile through the engine,
and the accuracy of bf16 and int8 against float32 on the real SmolLM2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from surge import LLM, SamplingParams
from surge.cli.main import main as cli_main
from surge.engine.config import ModelConfig
from surge.engine.runner.loader import q4_kernel_name, quantization_hint, resolve_quantization
from surge.models.device import (
    DeviceCaps,
    Precision,
    choose_kv_dtype,
    choose_precision,
    cpu_flags,
    device_caps,
)
from surge.models.evaluate import perplexity, score, token_logprobs
from surge.models.formats.model_files import ModelFiles, open_model
from surge.models.forms import estimate_weight_bytes
from surge.models.kernels import load_q4_linear
from surge.models.q4 import Q4Linear, dequantize_q4
from surge.models.quant import Int8Linear, cpu_int8_fast, weight_bytes

DATA = Path(__file__).resolve().parent.parent / "data"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def test_cpu_dtype_follows_the_declared_flags() -> None:
    cpu = torch.device("cpu")
    bf16 = device_caps(cpu, {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
    assert bf16.dtypes == ("bfloat16", "float32") and bf16.int8 and not bf16.fp8
    p = choose_precision("cpu", "auto", bf16)
    assert p.dtype == torch.bfloat16 and "AVX512_BF16" in p.reason
    amx = device_caps(cpu, {"amx_bf16", "amx_int8", "amx_fp16"})
    assert amx.dtypes == ("bfloat16", "float16", "float32") and amx.int8
    plain = device_caps(cpu, {"avx2"})
    assert plain.dtypes == ("float32",) and not plain.int8
    p = choose_precision("cpu", "auto", plain)
    assert p.dtype == torch.float32 and "without native bf16" in p.reason
    p = choose_precision("cpu", "float16", plain)
    assert p.dtype == torch.float16 and "emulated" in p.reason


@pytest.mark.parametrize(
    ("sm", "dtype"), [("sm75", torch.float16), ("sm80", torch.bfloat16), ("sm90", torch.bfloat16)]
)
def test_cuda_dtype_follows_compute_capability(sm: str, dtype: torch.dtype) -> None:
    # choose_precision reads only the capabilities: no GPU needed to check the rule.
    native = ("bfloat16", "float16", "float32") if sm >= "sm80" else ("float16", "float32")
    caps = DeviceCaps(torch.device("cuda"), "GPU", (sm,), native, True, sm >= "sm89", 1 << 34)
    p = choose_precision("cuda", "auto", caps)
    assert p.dtype == dtype and sm in p.reason


def test_config_and_model_agree_on_the_quantizations() -> None:
    from surge.engine import config
    from surge.models import quant

    assert ("auto", *quant.QUANTIZATIONS) == config.QUANTIZATIONS  # auto: resolved at load
    with pytest.raises(
        ValueError, match=r"auto\|none\|int8\|int8-weight-only\|w8a8\|q4\|q4-int8\|gguf, got 'int4'"
    ):
        config.ModelConfig(quantization="int4")


def test_kv_cache_dtype_auto_follows_the_model_but_not_a_float32_for_want_of_bf16() -> None:
    cpu = torch.device("cpu")
    native = choose_precision("cpu", "auto", device_caps(cpu, {"avx512f", "avx512_bf16"}))
    assert choose_kv_dtype("auto", native) == (torch.bfloat16, "follows the model dtype")
    assert choose_kv_dtype("float32", native) == (torch.float32, "requested")
    # auto chose float32 (no native bf16): the cache is bf16, half the bytes per token
    plain = device_caps(cpu, {"avx2", "fma", "f16c"})
    fallback = choose_precision("cpu", "auto", plain)
    kv, why = choose_kv_dtype("auto", fallback)
    assert fallback.dtype == torch.float32 and kv == torch.bfloat16
    assert "--kv-cache-dtype float32" in why
    assert choose_kv_dtype("float32", fallback)[0] == torch.float32
    # a named float32 keeps its float32 cache, and GPUs follow the model
    named = choose_precision("cpu", "float32", plain)
    assert choose_kv_dtype("auto", named) == (torch.float32, "follows the model dtype")
    cuda = DeviceCaps(
        torch.device("cuda"), "GPU", ("sm75",), ("float16", "float32"), True, False, 1
    )
    assert choose_kv_dtype("auto", choose_precision("cuda", "auto", cuda))[0] == torch.float16
    with pytest.raises(ValueError, match="kv cache dtype"):
        choose_kv_dtype("int4", fallback)


@pytest.mark.parametrize(("kv", "dtype"), [("bfloat16", torch.bfloat16), ("int8", torch.int8)])
def test_kv_cache_dtype_of_its_own(tiny_model_dir: Path, kv: str, dtype: torch.dtype) -> None:
    base = LLM(str(tiny_model_dir), dtype="float32", num_blocks=64)
    llm = LLM(str(tiny_model_dir), dtype="float32", kv_cache_dtype=kv, num_blocks=64)
    assert llm.engine.runner.kv_caches[0][0].dtype == dtype
    head_dim = base.engine.model.spec.head_dim
    row_bytes = {"bfloat16": 2 * head_dim, "int8": head_dim + 4}[kv]  # float32's: 4 * head_dim
    assert llm.engine.plan.bytes_per_block * 4 * head_dim == (
        base.engine.plan.bytes_per_block * row_bytes
    )
    prompts = ["Hello there", "One two three four five six seven eight nine ten eleven"]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    ref = [o.outputs[0].token_ids for o in base.generate(prompts, GREEDY, use_tqdm=False)]
    assert [len(t) for t in got] == [12, 12]
    assert got[0][:4] == ref[0][:4]  # bf16 or int8 K/V: same greedy start on a tiny model


@pytest.mark.parametrize("kv", ["bfloat16", "int8"])
def test_a_prefix_cache_hit_scores_as_one_pass_with_a_cache_dtype_of_its_own(
    tiny_model_dir: Path, kv: str
) -> None:
    """Fresh K/V are rounded to the cache's dtype before prefill attends to them: the prompt
    served from bf16 (or int8) blocks scores as the pass that wrote them (bf16: 7.9e-4 apart
    without that)."""
    llm = LLM(str(tiny_model_dir), dtype="float32", kv_cache_dtype=kv, num_blocks=64)
    prompt = (  # 18 tokens: one full block to hit, and a token of the next one to copy
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen"
    )
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=1, ignore_eos=True)
    first = llm.generate(prompt, params, use_tqdm=False)[0]
    second = llm.generate(prompt, params, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 17
    assert first.outputs[0].logprobs is not None and second.outputs[0].logprobs is not None
    a = [lp.logprob for lp in first.outputs[0].logprobs]
    b = [lp.logprob for lp in second.outputs[0].logprobs]
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 2e-5


@pytest.mark.parametrize(
    ("dtype", "quantization"),
    [
        ("float32", "none"),
        ("bfloat16", "none"),
        ("bfloat16", "int8"),
        ("float32", "w8a8"),
        ("bfloat16", "q4"),
    ],
)
def test_weight_memory_estimate_is_exact(
    tiny_model_dir: Path, dtype: str, quantization: str
) -> None:
    llm = LLM(str(tiny_model_dir), dtype=dtype, quantization=quantization, num_blocks=16)
    model = llm.engine.model
    spec = llm.engine.files.spec
    assert weight_bytes(model) == estimate_weight_bytes(spec, getattr(torch, dtype), quantization)
    projections = {name: m for name, m in model.named_modules() if name.endswith("_proj")}
    if quantization == "q4":  # 4-bit layers (no int8 copy), the head int8 only
        assert all(isinstance(m, Q4Linear) for m in projections.values())
        assert isinstance(model.lm_head, Int8Linear)
    elif quantization != "none":
        assert all(isinstance(m, Int8Linear) for m in projections.values())
        assert isinstance(model.lm_head, Int8Linear)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize(
    ("quantization", "num_prompts"), [("none", 3), ("int8", 3), ("q4", 3), ("none", 10)]
)
def test_compile_matches_eager(tiny_model_dir: Path, quantization: str, num_prompts: int) -> None:
    """Pure-decode steps run compiled: 3 requests padded to the bucket of 4, 10 in the graph with
    a dynamic batch dimension. The tokens are the eager ones."""
    text = "the quick brown fox jumps over a lazy dog while one two three four"
    prompts = [text[: 10 + 5 * i] for i in range(num_prompts)]
    kw = {"dtype": "float32", "num_blocks": 64, "quantization": quantization}
    eager = LLM(str(tiny_model_dir), **kw)  # type: ignore[arg-type]
    # Without the warm-up: each graph is compiled when a step first needs it.
    compiled = LLM(str(tiny_model_dir), compile=True, compile_warmup=False, **kw)  # type: ignore[arg-type]
    ref = [o.outputs[0].token_ids for o in eager.generate(prompts, GREEDY, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in compiled.generate(prompts, GREEDY, use_tqdm=False)]
    assert got == ref
    assert compiled.engine.runner._compiled_buckets == ({4} if num_prompts == 3 else {0})


def test_compiled_graphs_are_kept_under_surges_cache(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`surge` keeps inductor's cache beside its other caches (inductor's default is under /tmp)
    unless TORCHINDUCTOR_CACHE_DIR says otherwise; the engine process inherits the variable.
    Checked in fresh processes, where torch has not fixed the variable yet."""
    script = (
        "import os, sys\n"
        "import surge.cli.main as cli\n"
        "cli.cmd_info = lambda args: print(os.environ['TORCHINDUCTOR_CACHE_DIR']) or 0\n"
        "sys.exit(cli.main(['info', '--model', sys.argv[1]]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    run = [sys.executable, "-c", script, str(tiny_model_dir)]
    out = subprocess.run(run, env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split()[-1] == str(Path.home() / ".cache" / "surge" / "inductor")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run(run, env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split()[-1] == str(tmp_path)


@pytest.mark.long
@pytest.mark.slow
def test_compile_warmup_builds_every_graph_before_a_request(tiny_model_dir: Path) -> None:
    """With the warm-up (the default) every graph exists once the engine is built, on padding
    rows that touch only the scratch block: requests then compile nothing and get eager's
    tokens, at a bucket size (2 -> 2) and in the dynamic graph (12)."""
    from torch._dynamo.utils import counters

    kw = {"dtype": "float32", "num_blocks": 64}
    compiled = LLM(str(tiny_model_dir), compile=True, **kw)  # type: ignore[arg-type]
    assert compiled.engine.runner._compiled_buckets == {1, 2, 4, 8, 0}
    eager = LLM(str(tiny_model_dir), **kw)  # type: ignore[arg-type]
    text = "the quick brown fox jumps over a lazy dog while one two three four"
    graphs = counters["stats"]["unique_graphs"]
    for n in (2, 12):
        prompts = [text[: 10 + 4 * i] for i in range(n)]
        ref = [o.outputs[0].token_ids for o in eager.generate(prompts, GREEDY, use_tqdm=False)]
        got = [o.outputs[0].token_ids for o in compiled.generate(prompts, GREEDY, use_tqdm=False)]
        assert got == ref
    assert counters["stats"]["unique_graphs"] == graphs  # no compile after the warm-up


def test_info_reports_capacity(smollm2_gguf_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["info", "--model", str(smollm2_gguf_path), "--quantization", "int8"]
    assert cli_main([*args, "--kv-cache-memory-gib", "1"]) == 0
    out = capsys.readouterr().out
    assert "quantization  int8" in out and "weights       129.9 MiB" in out
    # bf16 KV on this default: 2 x 30 layers x 3 heads x 64 x 2 bytes = 22.5 KiB a token.
    kv_bf16 = "bfloat16" in out.split("KV cache", 1)[1].split("\n", 1)[0]
    tokens = (1 << 30) // (23040 * 16) * 16 if kv_bf16 else (1 << 30) // (46080 * 16) * 16
    assert f"-> {tokens:,} tokens" in out
    assert "max_num_seqs  recommended" in out
    assert "hint" not in out  # already quantized


def test_hint_names_the_4_bit_kernel_this_cpu_has() -> None:
    cpu = Precision(torch.device("cpu"), torch.float32, "test")
    for quantized in ("q4", "int8"):
        assert quantization_hint(ModelConfig(quantization=quantized), cpu) is None
    unquantized = ModelConfig(quantization="none")
    # torch ops: no gain
    assert quantization_hint(ModelConfig(quantization="none", use_kernels=False), cpu) is None
    hint = quantization_hint(unquantized, cpu)
    flags = cpu_flags()
    if "avx512_vnni" in flags:
        assert hint is not None and "AVX-512 VNNI" in hint
    elif {"avx2", "fma", "f16c"} <= flags:
        assert hint is not None and "AVX2 kernel" in hint
    else:
        assert hint is None
    cuda = Precision(torch.device("cuda"), torch.float16, "test")
    assert quantization_hint(unquantized, cuda) is None
    for quantized in ("q4", "int8"):  # no faster on a GPU: said so
        hint = quantization_hint(ModelConfig(quantization=quantized), cuda)
        assert hint is not None and f"--quantization {quantized} saves GPU memory" in hint


def test_auto_quantization_runs_a_q4_1_ggufs_own_blocks_where_the_kernel_is(
    smollm2_gguf_path: Path, tiny_model_dir: Path
) -> None:
    assert open_model(smollm2_gguf_path).layer_format == "Q4_1"
    assert open_model(tiny_model_dir).layer_format is None  # safetensors
    cpu = Precision(torch.device("cpu"), torch.float32, "test")
    auto = ModelConfig()
    assert auto.quantization == "auto"
    kernel = q4_kernel_name()
    mode, why = resolve_quantization(auto, cpu, "Q4_1")
    if kernel is not None and load_q4_linear() is not None:
        assert (mode, why) == ("q4", f"auto: the file's own Q4_1 blocks on the {kernel} kernel")
    else:
        assert mode == "none"
    # Named, a float file, no kernels, or a GPU: as named / unquantized.
    assert resolve_quantization(ModelConfig(quantization="int8"), cpu, "Q4_1")[0] == "int8"
    assert resolve_quantization(ModelConfig(quantization="none"), cpu, "Q4_1")[0] == "none"
    assert resolve_quantization(auto, cpu, None) == (
        "none",
        "auto: the layers are stored as floats or mixed",
    )
    assert resolve_quantization(auto, cpu, "F16")[0] == "none"
    assert resolve_quantization(ModelConfig(use_kernels=False), cpu, "Q4_1")[0] == "none"
    cuda = Precision(torch.device("cuda"), torch.bfloat16, "test")
    assert resolve_quantization(auto, cuda, "Q4_1")[0] == "none"
    # A K-quant GGUF (Gemma 3 270M's Q4_K_M): each matrix by its type (forms.FORM_BY_TYPE: the
    # K-quants on their own blocks); Q8_0 blocks int8, Q4_0 4-bit; floats on a GPU.
    mixed = resolve_quantization(auto, cpu, "mixed")
    assert mixed[0] == ("gguf" if kernel is not None and load_q4_linear() is not None else "int8")
    assert resolve_quantization(auto, cpu, "Q8_0") == (
        "int8", "auto: the layers are stored in Q8_0 blocks; int8 keeps them on this CPU",
    )  # fmt: skip
    if kernel is not None and load_q4_linear() is not None:
        assert resolve_quantization(auto, cpu, "Q4_0")[0] == "q4"
    assert resolve_quantization(auto, cuda, "mixed")[0] == "none"
    assert resolve_quantization(ModelConfig(use_kernels=False), cpu, "mixed")[0] == "none"


@pytest.mark.skipif(
    q4_kernel_name() is None or load_q4_linear() is None, reason="no vectorized 4-bit kernel"
)
def test_the_default_engine_and_info_take_the_files_4_bit_blocks(
    smollm2_gguf_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["info", "--model", str(smollm2_gguf_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    # A small model keeps the int8 copy for batches where the CPU has VNNI/AMX (q4-int8).
    mode = "q4-int8" if cpu_int8_fast() else "q4"
    assert (
        f"quantization  {mode} (auto: the file's own Q4_1 blocks on the {q4_kernel_name()}" in out
    )
    llm = LLM(str(smollm2_gguf_path), device="cpu", num_blocks=64)
    layer = llm.engine.model.layers[0]
    assert isinstance(layer.mlp.down_proj, Q4Linear)
    # The weights are the file's: its blocks come back exactly from the 4-bit copy.
    name = "model.layers.0.mlp.down_proj.weight"
    ref = next(w for n, w in open_model(smollm2_gguf_path).weights() if n == name)
    assert torch.equal(dequantize_q4(layer.mlp.down_proj.qs, layer.mlp.down_proj.dm), ref)
    # (To the chat question "What is the capital of France?" the file run this way answers
    # "L'Étoile, la Marseillaise, ...", as llama.cpp's llama-server does on the same file; its
    # dequantized floats answer Paris. BENCHMARKS.md, eleventh pass.)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    [o] = llm.generate(["The capital of France is"], params, use_tqdm=False)
    assert "Paris" in o.outputs[0].text


def test_auto_adds_the_int8_copy_only_for_a_small_model_on_a_vnni_cpu(
    smollm2_gguf_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """q4-int8 under auto where the copy is small and int8 dot products are fast; q4 (no larger
    than the file) for a 1B, and on a CPU without VNNI."""
    from surge.engine.runner import loader

    small = open_model(smollm2_gguf_path).spec
    big = replace(small, hidden_size=2048, intermediate_size=8192, num_layers=16, vocab_size=128256)
    cpu = Precision(torch.device("cpu"), torch.float32, "test")
    for fast, spec, want in [(True, small, "q4-int8"), (True, big, "q4"), (False, small, "q4")]:
        monkeypatch.setattr(loader, "cpu_int8_fast", lambda fast=fast: fast)
        assert loader._small_model_batch_copy(spec, cpu, None, "auto")[0] == want


# ---- accuracy on the real model -------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf_path: Path) -> Iterator[dict[str, LLM]]:
    files = open_model(smollm2_gguf_path)
    weights = list(files.weights())  # dequantize the GGUF once for every precision
    cached = ModelFiles(files.path, files.spec, files.tokenizer, lambda: iter(weights))
    llms: dict[str, LLM] = {}
    for name, kw in {
        "float32": {"dtype": "float32"},
        "bfloat16": {"dtype": "bfloat16"},
        "int8": {"dtype": "bfloat16", "quantization": "int8"},
        "q4": {"dtype": "bfloat16", "quantization": "q4"},
    }.items():
        llms[name] = LLM(str(files.path), files=cached, num_blocks=256, **kw)  # type: ignore[arg-type]
    yield llms


@pytest.mark.long
@pytest.mark.slow
def test_perplexity_close_to_float32(smollm2: dict[str, LLM]) -> None:
    tok = smollm2["float32"].tokenizer
    ids = tok.encode((DATA / "pride_and_prejudice_ch1.txt").read_text())
    assert len(ids) > 400
    # In chunks of 8 rows: the kernels a decode step runs (q4's 4-bit one, int8's GEMV).
    ppl = {
        name: perplexity(token_logprobs(llm.engine.model, ids, chunk_size=8))
        for name, llm in smollm2.items()
    }
    # The float32 model with an int8 KV cache (bench_precision: +0.44%; bf16's -0.01%).
    ppl["kv_int8"] = perplexity(token_logprobs(smollm2["float32"].engine.model, ids, torch.int8))
    print(f"perplexity: {ppl}")
    assert 5 < ppl["float32"] < 40  # the real model reads English
    assert abs(ppl["bfloat16"] / ppl["float32"] - 1) < 0.01
    assert abs(ppl["int8"] / ppl["float32"] - 1) < 0.03
    assert abs(ppl["q4"] / ppl["float32"] - 1) < 0.03
    assert abs(ppl["kv_int8"] / ppl["float32"] - 1) < 0.015


@pytest.mark.long
@pytest.mark.slow
def test_greedy_agreement_with_float32(smollm2: dict[str, LLM]) -> None:
    """8 prompts x 24 greedy tokens, batched (the full 64 x 64 is benchmarks/bench_precision.py).
    Free-running outputs part ways after a near tie, so the check that tells precision apart is
    teacher-forced: fed float32's text, how often is each precision's next greedy token the same?
    """
    prompts = (DATA / "prompts.txt").read_text().splitlines()[:8]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    runs = {name: llm.generate(prompts, params, use_tqdm=False) for name, llm in smollm2.items()}
    ref = runs["float32"]
    for name in ("bfloat16", "int8", "q4"):
        model = smollm2[name].engine.model
        first = sum(
            r.outputs[0].token_ids[0] == g.outputs[0].token_ids[0]
            for r, g in zip(ref, runs[name], strict=True)
        )
        forced = 0
        for r in ref:
            text = r.prompt_token_ids + r.outputs[0].token_ids
            greedy = score(model, text, chunk_size=8)[1][len(r.prompt_token_ids) - 1 :].tolist()
            forced += sum(a == b for a, b in zip(greedy, r.outputs[0].token_ids, strict=True))
        print(f"{name}: first tokens {first}/8, teacher-forced {forced}/{24 * 8}")
        assert first >= 7
        # bench_precision (64 x 64, 8-row chunks): int8 96.0%, q4 96.1%
        assert forced >= 0.85 * 24 * 8
