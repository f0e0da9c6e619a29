"""What serving LoRA adapters costs: the same batch on the base model, on one adapter, and on a
mix of adapters, in one engine.

The default model and settings, with `--adapters` random rank-`--rank` adapters on every
projection (PEFT's file format, written here for SmolLM2's shapes). B requests of the same
prompts decode `--max-tokens` greedy tokens (ignore_eos): all on the base model, all on one
adapter, and spread over every adapter plus the base, alternating, `--rounds` times each.
Prints output tokens per second for each and the ratio to the base model's.

    python benchmarks/bench_lora.py --batch 1,16 --max-tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from surge.engine.llm import LLM
from surge.models.lora import TARGETS, _module_shape
from surge.models.resolve import resolve_model
from surge.models.spec import ModelSpec
from surge.models.weights import open_model
from surge.sampling_params import SamplingParams

PROMPTS = [
    "Explain how a paged KV cache works.",
    "Write a short poem about the sea.",
    "What are the three laws of thermodynamics?",
    "Give me a recipe for pancakes.",
]


def write_adapter(folder: Path, spec: ModelSpec, rank: int, seed: int) -> Path:
    """A random PEFT LoRA adapter on every projection of every layer."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for module in TARGETS:
            in_f, out_f = _module_shape(spec, module)
            owner = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{owner}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) / in_f**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * 0.01
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(TARGETS),
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    path = resolve_model("smollm2-135m")
    spec = open_model(path).spec
    with tempfile.TemporaryDirectory() as tmp:
        names = {f"lora{i}": str(write_adapter(Path(tmp) / f"a{i}", spec, args.rank, i))
                 for i in range(args.adapters)}  # fmt: skip
        llm = LLM(str(path), lora_modules=names, max_loras=args.adapters, max_lora_rank=args.rank)
    tok = llm.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    adapter_names = list(names)
    print(f"model {path.name}, {args.adapters} adapters of rank {args.rank} on every projection")
    for b in (int(x) for x in args.batch.split(",")):
        prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(b)]
        modes: dict[str, list[str | None]] = {
            "base": [None] * b,
            "one adapter": [adapter_names[0]] * b,
        }
        if b > 1:  # every adapter and the base model, round robin
            modes["mixed"] = [([None, *adapter_names])[i % (len(names) + 1)] for i in range(b)]
        llm.generate(prompts, params, use_tqdm=False, lora_name=modes["one adapter"])  # warm-up
        rates: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for mode, loras in modes.items():
                t0 = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False, lora_name=loras)
                dt = time.perf_counter() - t0
                rates[mode].append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
        base = statistics.median(rates["base"])
        for mode, r in rates.items():
            med = statistics.median(r)
            print(f"batch {b:>3}  {mode:<12} {med:8.1f} tok/s  {med / base:5.2f}x base  "
                  f"(rounds: {', '.join(f'{x:.1f}' for x in r)})")  # fmt: skip


if __name__ == "__main__":
    main()
