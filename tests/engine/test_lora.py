"""LoRA adapters on the tiny Llama: token-identical to HF transformers + PEFT, in mixed batches,
with chunked prefill, preemption and the prefix cache; bad adapters refused with a reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams
from tests.lora_adapters import write_peft_adapter

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Paged attention keeps the KV cache in fixed-size blocks, " * 4,
]
MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {
        # every projection, rank 8
        "all": write_peft_adapter(tiny_model_dir, root / "all", r=8, alpha=16, seed=1),
        # attention only, rank 4, rsLoRA scaling and a per-module alpha
        "qv": write_peft_adapter(
            tiny_model_dir,
            root / "qv",
            r=4,
            alpha=8,
            targets=("q_proj", "v_proj"),
            seed=2,
            use_rslora=True,
            alpha_pattern={"v_proj": 32},
            scale=2.0,
        ),
    }


@pytest.fixture(scope="module")
def peft_reference(tiny_model_dir: Path, adapters: dict[str, Path]) -> dict[str, list[list[int]]]:
    """Greedy continuations from transformers + PEFT, one prompt at a time, per adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from surge.models.formats.model_files import open_model

    tok = open_model(tiny_model_dir).tokenizer
    out: dict[str, list[list[int]]] = {}
    for name, path in adapters.items():
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        model = PeftModel.from_pretrained(base, path).eval()
        runs = []
        for p in PROMPTS:
            ids = torch.tensor([tok.encode(p)])
            with torch.no_grad():
                gen = model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                    max_new_tokens=MAX_TOKENS, eos_token_id=None,
                )  # fmt: skip
            runs.append(gen[0, ids.shape[1] :].tolist())
        out[name] = runs
    return out


def _tokens(outs: list) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize(
    "engine_kwargs",
    [{}, {"block_size": 4, "num_blocks": 48}],
    ids=["default", "preempt"],
)
def test_mixed_batch_matches_peft(
    tiny_model_dir: Path,
    adapters: dict[str, Path],
    peft_reference: dict[str, list[list[int]]],
    engine_kwargs: dict[str, object],
) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32",
              lora_modules={k: str(v) for k, v in adapters.items()}, **engine_kwargs)  # fmt: skip
    base = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    # Every prompt three times in one batch: base, one adapter, the other, interleaved.
    names: list[str | None] = [None, "all", "qv"] * len(PROMPTS)
    prompts = [p for p in PROMPTS for _ in range(3)]
    got = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False, lora_name=names))
    for i, p in enumerate(PROMPTS):
        assert got[3 * i] == base[i], p
        assert got[3 * i + 1] == peft_reference["all"][i], p
        assert got[3 * i + 2] == peft_reference["qv"][i], p
    assert peft_reference["all"] != base and peft_reference["qv"] != base  # adapters matter
    if "num_blocks" in engine_kwargs:
        assert llm.engine.stats().scheduler.num_preemptions > 0
    assert llm.engine.stats().kv_cache_usage == 0.0


def test_prefix_cache_is_per_adapter(
    tiny_model_dir: Path, adapters: dict[str, Path], peft_reference: dict[str, list[list[int]]]
) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", lora_modules={"all": str(adapters["all"])})
    prompt = PROMPTS[3]
    llm.generate(prompt, GREEDY, use_tqdm=False)  # the base model's KV of this prompt, cached
    first = llm.generate(prompt, GREEDY, use_tqdm=False, lora_name="all")[0]
    assert first.num_cached_tokens == 0  # another adapter's KV is never reused
    assert first.outputs[0].token_ids == peft_reference["all"][3]
    again = llm.generate(prompt, GREEDY, use_tqdm=False, lora_name="all")[0]
    assert again.num_cached_tokens > 0  # the same adapter's is
    assert again.outputs[0].token_ids == peft_reference["all"][3]


def test_load_unload_at_run_time(
    tiny_model_dir: Path, adapters: dict[str, Path], peft_reference: dict[str, list[list[int]]]
) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", enable_lora=True, max_loras=1)
    with pytest.raises(ValueError, match="no LoRA adapter named 'all'"):
        llm.generate("Hello", GREEDY, use_tqdm=False, lora_name="all")
    llm.add_lora("all", str(adapters["all"]))
    with pytest.raises(ValueError, match="all 1 LoRA slots are in use"):
        llm.add_lora("qv", str(adapters["qv"]))
    assert _tokens(llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, lora_name="all")) == [
        peft_reference["all"][0]
    ]
    # Unloading with a request in flight: it finishes on its adapter, the slot is freed after.
    from surge.engine.client.outputs import EngineCoreRequest

    engine = llm.engine
    engine.add_request(EngineCoreRequest("inflight", llm.tokenizer.encode(PROMPTS[1]), GREEDY,
                                         lora_name="all"))  # fmt: skip
    tokens = [t for out in engine.step() for t in out.new_token_ids]
    llm.remove_lora("all")
    with pytest.raises(ValueError, match="all 1 LoRA slots are in use"):
        llm.add_lora("qv", str(adapters["qv"]))  # still held by the request in flight
    while engine.has_work():
        for out in engine.step():
            tokens += out.new_token_ids
    assert tokens == peft_reference["all"][1]
    engine.step()  # an idle step frees the slot
    llm.add_lora("qv", str(adapters["qv"]))
    assert (
        _tokens(llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False, lora_name="qv"))
        == (peft_reference["qv"][:2])
    )
    with pytest.raises(ValueError, match="no LoRA adapter named 'all'"):
        llm.generate("Hello", GREEDY, use_tqdm=False, lora_name="all")


def test_lora_needs_enabling(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32")
    with pytest.raises(ValueError, match="not enabled"):
        llm.generate("Hello", GREEDY, use_tqdm=False, lora_name="any")


def _edited(src: Path, dst: Path, **config: object) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "adapter_config.json").read_text()) | config
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return dst


def test_bad_adapters_are_refused_with_a_reason(
    tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", enable_lora=True, max_lora_rank=4)
    cases = {
        "rank 8 is above --max-lora-rank 4": adapters["all"],
        "no adapter_config.json": tmp_path / "missing",
        "DoRA is not supported": _edited(adapters["qv"], tmp_path / "dora", use_dora=True),
        "peft_type 'PREFIX_TUNING'": _edited(
            adapters["qv"], tmp_path / "prefix", peft_type="PREFIX_TUNING"
        ),
        "modules_to_save": _edited(adapters["qv"], tmp_path / "mts", modules_to_save=["lm_head"]),
    }
    for reason, path in cases.items():
        with pytest.raises(ValueError, match=reason):
            llm.add_lora("x", str(path))
    # An adapter trained for another model's shapes.
    from safetensors.torch import load_file, save_file

    odd = shutil.copytree(adapters["qv"], tmp_path / "odd")
    tensors = load_file(str(odd / "adapter_model.safetensors"))
    key = next(k for k in tensors if "lora_A" in k)
    tensors[key] = torch.zeros(4, 7)
    save_file(tensors, str(odd / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="do not fit this model"):
        llm.add_lora("x", str(odd))
    assert llm.engine.list_loras() == ()  # nothing half-loaded
    llm.add_lora("x", str(adapters["qv"]))  # the slot is still free
    assert [n for n, _ in llm.engine.list_loras()] == ["x"]


@pytest.mark.parametrize("kwargs", [{"dtype": "bfloat16"}, {"quantization": "int8"}])
def test_lora_on_lower_precision(
    tiny_model_dir: Path,
    adapters: dict[str, Path],
    peft_reference: dict[str, list[list[int]]],
    kwargs: dict[str, object],
) -> None:
    """The adapter runs beside a bf16 or int8 base: its delta is applied (the output moves
    away from that base's own), and the first token agrees with fp32 + PEFT's for most
    prompts (a random model's greedy path diverges after a near-tie)."""
    llm = LLM(str(tiny_model_dir), lora_modules={"all": str(adapters["all"])}, **kwargs)
    base = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    got = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_name="all"))
    assert all(g != b for g, b in zip(got, base, strict=True))
    agree = sum(g[0] == r[0] for g, r in zip(got, peft_reference["all"], strict=True))
    assert agree >= len(PROMPTS) - 1
