"""Offline engine throughput against HF transformers static batching, in one script.

Workload: SmolLM2-135M, ~100-token prompts, 128 output tokens with ignore_eos, for several batch
sizes submitted at once. Prints output tokens/s and model-FLOPs utilization (2 x parameters per
token processed, prompt and output) against a large bf16 matmul measured in the same run.

    python benchmarks/bench_engine.py [--sizes 1,16,64,256] [--dtype bfloat16] [--no-hf]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from surge import LLM, SamplingParams
from surge.models.formats.resolve import resolve_model

PROMPT_LEN = 100
OUTPUT_LEN = 128


def matmul_peak(dtype: torch.dtype, n: int = 2048, iters: int = 8) -> float:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    for _ in range(2):
        a @ b
    t = time.perf_counter()
    for _ in range(iters):
        a @ b
    return 2 * n**3 * iters / (time.perf_counter() - t)


def make_prompts(llm: LLM, n: int) -> list[list[int]]:
    text = (
        "Large language models are served to many users at once: requests join a running batch "
        "at every step, and the KV cache lives in fixed-size blocks. "
    ) * 8
    return [llm.tokenizer.encode(f"Request {i}. {text}")[:PROMPT_LEN] for i in range(n)]


def run_surge(llm: LLM, prompts: list[list[int]]) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_LEN, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)  # type: ignore[arg-type]
    dt = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == OUTPUT_LEN for o in outs)
    return dt


def run_hf(model: torch.nn.Module, prompts: list[list[int]], pad_id: int) -> float:
    """Static batch: left-padded prompts, generate() to the full length."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            ids,
            attention_mask=mask,
            max_new_tokens=OUTPUT_LEN,
            do_sample=False,
            pad_token_id=pad_id,
        )
    dt = time.perf_counter() - t
    assert out.shape[1] == width + OUTPUT_LEN
    return dt


def load_hf_plain(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    """HF at its strongest: transformers reads the GGUF, then its (dequantized) weights go into a
    plain model in `dtype`. Loaded straight from GGUF, transformers keeps the weights packed and
    dequantizes them in float32 at every matmul, which is several times slower."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    packed = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    model = LlamaForCausalLM(packed.config)
    model.load_state_dict(packed.state_dict(), strict=False)
    model.tie_weights()
    model.generation_config.eos_token_id = None
    return model.to(dtype).eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,16,64,256")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-kernels", action="store_true", help="torch-ops attention only")
    ap.add_argument("--out", default="results/bench_engine.json")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    dtype = getattr(torch, args.dtype)
    sizes = [int(s) for s in args.sizes.split(",")]

    peak = matmul_peak(torch.bfloat16)
    print(f"bf16 matmul peak (2048^3): {peak / 1e9:.0f} GFLOP/s; threads {torch.get_num_threads()}")
    path = resolve_model("smollm2-135m")
    llm = LLM(
        str(path),
        dtype=args.dtype,
        quantization="none",  # the float path HF runs, not the file's 4-bit blocks
        max_num_seqs=max(sizes),
        use_kernels=not args.no_kernels,
    )
    num_params = sum(p.numel() for p in llm.engine.model.parameters())
    flops_per_token = 2 * num_params
    llm.generate(make_prompts(llm, 2), SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up

    hf = None
    if not args.no_hf:
        hf = load_hf_plain(path, dtype)

    rows = []
    header = f"{'n':>5} {'surge tok/s':>12} {'MFU':>6} {'hf tok/s':>10} {'ratio':>6}"
    print(header)
    for n in sizes:
        prompts = make_prompts(llm, n)
        dt = run_surge(llm, prompts)
        processed = sum(len(p) for p in prompts) + n * OUTPUT_LEN
        tok_s = n * OUTPUT_LEN / dt
        mfu = processed * flops_per_token / dt / peak
        hf_tok_s = None
        if hf is not None:
            hf_dt = run_hf(hf, prompts, pad_id=llm.tokenizer.eos_token_id or 0)
            hf_tok_s = n * OUTPUT_LEN / hf_dt
        ratio = f"{tok_s / hf_tok_s:5.2f}x" if hf_tok_s else "-"
        hf_str = f"{hf_tok_s:10.1f}" if hf_tok_s else f"{'-':>10}"
        print(f"{n:5d} {tok_s:12.1f} {mfu:6.1%} {hf_str} {ratio:>6}", flush=True)
        rows.append({"n": n, "surge_tok_s": tok_s, "mfu": mfu, "hf_tok_s": hf_tok_s})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"dtype": args.dtype, "peak_flops": peak, "params": num_params}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
