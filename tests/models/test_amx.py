"""The int8 GEMM on AMX tiles (kernels/amx_gemm.h): the same bits as the VNNI tiles, op by op,
through the fused stack and through the engine. Run here with the tile operations emulated in
plain C++ (SURGE_AMX=emulate), so the kernel's indexing (tiles of 16 rows, panel pairs, the
padding rows, K in steps of 64) is checked on any CPU with AVX-512 VNNI; on a CPU with AMX the
hardware path is checked against the VNNI tiles at load (its self-check) and below."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from surge import LLM, SamplingParams
from surge.models import amx
from surge.models.kernels import load_q4_decode, load_w8a8_linear
from surge.models.quant import Int8Linear
from tests.conftest import write_tiny_llama

w8a8 = load_w8a8_linear()
needs_vnni = pytest.mark.skipif(
    w8a8 is None or not w8a8.supported or load_q4_decode() is None,
    reason="the AMX path sits beside the VNNI tiles: needs AVX-512 VNNI and the toolchain",
)


@pytest.fixture(scope="module")
def tiny_q4_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf_path: Path) -> Path:
    """A tiny random Llama whose widths all suit the 4-bit layout and the fused stack (head
    size 64): its steps run through the stack's int8 path."""
    shapes = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 64}  # fmt: skip
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-q4"), smollm2_gguf_path, shapes=shapes)


@pytest.fixture(autouse=True)
def engine_off_after() -> Iterator[None]:
    yield
    amx.set_engine("off")


def test_the_crossover_is_where_amx_wins_from_then_on() -> None:
    # (rows, VNNI seconds, AMX seconds)
    timings = [(16, 1.0, 1.2), (32, 1.0, 0.9), (64, 1.0, 1.0), (128, 2.0, 1.0), (256, 4.0, 1.5)]
    assert amx.crossover(timings) == 128  # 32 wins, 64 does not: only from 128 on
    assert amx.crossover([(16, 1.0, 0.5), (32, 1.0, 0.5)]) == 16
    assert amx.crossover([(16, 1.0, 0.5), (32, 1.0, 1.1)]) is None  # loses at the largest
    assert amx.crossover([(16, 1.0, 0.97)]) is None  # within the noise margin


@needs_vnni
@pytest.mark.parametrize("engine", ["emulated", "hardware"])
@pytest.mark.parametrize("k,n,bias", [(576, 960, True), (1536, 576, False), (128, 40, True)])
def test_the_amx_tiles_give_the_vnni_bits(k: int, n: int, bias: bool, engine: str) -> None:
    """Emulated everywhere; the AMX instructions themselves where the CPU has them."""
    if engine == "hardware" and not amx.hardware_ok():
        pytest.skip("no usable AMX on this CPU")
    torch.manual_seed(k + n)
    layer = Int8Linear.from_float(nn.Linear(k, n, bias=bias), "int8", kernels=True)
    assert layer.packed
    for rows in (1, 5, 8, 12, 15, 16, 17, 31, 32, 33, 100):  # AMX from 8 rows: padded tiles
        x = torch.randn(rows, k) * (1 + torch.rand(rows, 1) * 4)
        assert amx.set_engine("off")
        want = layer(x)
        before = amx.calls()
        assert amx.set_engine(engine, 8)
        got = layer(x, torch.float32)
        assert (amx.calls() > before) == (rows >= 8), rows
        assert torch.equal(got, want.float()), (rows, (got - want).abs().max().item())


@needs_vnni
def test_a_width_not_in_steps_of_64_stays_on_vnni() -> None:
    layer = Int8Linear.from_float(nn.Linear(100, 48), "int8", kernels=True)
    x = torch.randn(40, 100)
    want = layer(x)
    assert amx.set_engine("emulated", 16)
    before = amx.calls()
    assert torch.equal(layer(x), want)
    assert amx.calls() == before


def test_hardware_is_refused_where_the_cpu_has_none() -> None:
    if amx.hardware_ok():
        pytest.skip("this CPU runs AMX")
    assert not amx.set_engine("hardware")
    choice = amx.configure(nn.Module(), "auto")
    assert choice.engine == "off"


@needs_vnni
@pytest.mark.parametrize("engine", ["emulated", "hardware"])
def test_the_engine_answers_the_same_on_amx_tiles(tiny_q4_dir: Path, engine: str) -> None:
    """17 requests at once (prefill chunks of hundreds of rows, decode steps of 17 rows through
    the fused stack's int8 path): the same tokens and the same logprobs, bit for bit."""
    if engine == "hardware" and not amx.hardware_ok():
        pytest.skip("no usable AMX on this CPU")
    llm = LLM(str(tiny_q4_dir), dtype="float32", quantization="q4-int8", max_num_seqs=32,
              enable_prefix_caching=False)  # fmt: skip
    assert llm.engine.runner.fused is not None
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 4000, (30 + i,), generator=gen).tolist() for i in range(17)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)

    def answers() -> list[tuple[list[int], list[float]]]:
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs or []])
                for o in outs]  # fmt: skip

    assert amx.set_engine("off")
    want = answers()
    assert amx.set_engine(engine, 16)
    before = amx.calls()
    got = answers()
    assert amx.calls() > before
    assert got == want


@needs_vnni
def test_surge_amx_reaches_the_fused_stack(tiny_q4_dir: Path) -> None:
    """SURGE_AMX in a fresh process (no kernel module loaded before the engine starts): the
    fused stack's own module runs the AMX kernels for a 40-row prefill, the int8 GEMM's and,
    on a bf16 cache where the build has the tiles, the prefill attention's."""
    script = (
        "import sys\n"
        "from surge import LLM, SamplingParams\n"
        "from surge.models.kernels import load_q4_decode\n"
        "llm = LLM(sys.argv[1], dtype='bfloat16', quantization='q4-int8',\n"
        "          enable_prefix_caching=False)\n"
        "assert llm.engine.runner.fused is not None\n"
        "m = load_q4_decode()\n"
        "gemm, attn = m.amx_calls(), m.amx_attention_calls()\n"
        "llm.generate([[5] * 40], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)\n"
        "print(m.amx_calls() - gemm, m.amx_attention_calls() - attn, int(m.amx_attention_ok()))\n"
    )
    env = dict(os.environ, SURGE_AMX="emulate")
    run = subprocess.run([sys.executable, "-c", script, str(tiny_q4_dir)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    gemm, attn, _ = (int(x) for x in run.stdout.strip().splitlines()[-1].split())
    assert gemm > 0  # the 40-row prefill's projections on AMX's kernel
    if load_q4_decode().amx_attention_kernel:
        assert attn > 0  # and its attention
