"""Where one engine step's time goes: scheduler, input prep, model (matmuls, attention, other ops),
sampler, update. Decode steps of N requests with ~100-token prompts, SmolLM2, bf16 by default.

    python benchmarks/profile_step.py [--requests 64] [--steps 20] [--dtype bfloat16]
        [--quantization int8] [--compile] [--model gemma3-270m] [--kv-cache-dtype int8]
        [--context 100]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from surge import LLM, SamplingParams
from surge.engine.client.outputs import EngineCoreRequest
from surge.engine.core.batch import SampledToken, SampledTokens

MATMUL_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::matmul",
    "aten::linear",
    "aten::_int_mm",
    "surge::int8_gemv",
    "surge::q4_gemv",
    "surge::w8a8_linear",
    "mkldnn::_linear_pointwise",
}
# The two ends of W8A8 around aten::_int_mm.
QUANT_OPS = {"surge::quantize_rows", "surge::dequantize_int32"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quantization", default="none")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--model", default="smollm2-135m", help="e.g. gemma3-270m")
    ap.add_argument("--top", type=int, default=0, help="also print the N ops with most self time")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--context", type=int, default=100, help="prompt tokens a request")
    args = ap.parse_args()
    llm = LLM(
        args.model,
        dtype=args.dtype,
        quantization=args.quantization,
        compile=args.compile,
        compile_warmup=False,  # only the one batch size profiled gets compiled
        max_num_seqs=max(args.requests, 1),
        kv_cache_dtype=args.kv_cache_dtype,
    )
    eng = llm.engine
    text = "Large language models are served to many users at once by batching requests. " * (
        1 + args.context // 12
    )
    params = SamplingParams(temperature=0.0, max_tokens=1000, ignore_eos=True)
    for i in range(args.requests):
        ids = llm.tokenizer.encode(f"{i}: {text}")[: args.context]
        eng.add_request(EngineCoreRequest(str(i), ids, params))
    while eng.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running
    ):
        eng.step()  # finish every prefill: what follows are pure decode steps
    for _ in range(3):
        eng.step()

    phases: dict[str, float] = defaultdict(float)
    ops: dict[str, float] = defaultdict(float)
    stack = eng.runner.fused.stack if eng.runner.fused is not None else None
    if stack is not None:
        stack.phase_seconds()  # reset
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            batch = eng.scheduler.schedule(time.monotonic())
            t1 = time.perf_counter()
            with torch.inference_mode():
                step = eng.runner.step_batch(batch)
                path = eng.runner.path_for(step)  # as ModelRunner.run picks it
                inputs = eng.runner.builder.build(batch, path.layout(step))
                sample_reqs = inputs.sample_reqs
                t2 = time.perf_counter()
                logits = path.run(inputs)[: len(sample_reqs)]
                t3 = time.perf_counter()
                rows = [r.sampling for r in sample_reqs if r.sampling is not None]
                out = eng.runner.sampler(logits, rows)
            t4 = time.perf_counter()
            pairs = zip(sample_reqs, out.token_ids, strict=True)
            sampled = SampledTokens({r.req_id: SampledToken(t, None, None) for r, t in pairs})
            eng.scheduler.update(batch, sampled)
            t5 = time.perf_counter()
            for name, dt in (("schedule", t1 - t0), ("prepare", t2 - t1), ("model", t3 - t2),
                             ("sampler", t4 - t3), ("update", t5 - t4)):  # fmt: skip
                phases[name] += dt
    for evt in prof.key_averages():
        if evt.key in MATMUL_OPS:
            ops["matmul"] += evt.self_cpu_time_total
        elif evt.key in QUANT_OPS:
            ops["quant"] += evt.self_cpu_time_total
        elif evt.key.startswith("aten::"):
            ops["other torch ops"] += evt.self_cpu_time_total
        elif "CompiledFxGraph" in evt.key:  # inductor's fused kernels, self time
            ops["compiled"] += evt.self_cpu_time_total
        elif evt.key == "fused decode stack":
            ops["stack"] += evt.self_cpu_time_total
    steps = args.steps
    total = sum(phases.values())
    what = f"{args.dtype}, quantization {args.quantization}" + (
        ", compiled" if args.compile else ""
    )
    print(f"{args.requests} requests decoding, {what}: {total / steps * 1e3:.1f} ms/step")
    for name, dt in phases.items():
        print(f"  {name:10s} {dt / steps * 1e3:7.2f} ms  {dt / total:6.1%}")
    model_ms = phases["model"] / steps * 1e3
    matmul_ms = ops["matmul"] / steps / 1e3
    other_ms = ops["other torch ops"] / steps / 1e3
    print("  inside the model (profiler self time, includes the sampler's ops):")
    print(f"    matmuls          {matmul_ms:7.2f} ms")
    print(f"    other torch ops  {other_ms:7.2f} ms")
    quant_ms = ops["quant"] / steps / 1e3
    compiled_ms = ops["compiled"] / steps / 1e3
    if quant_ms:
        print(f"    W8A8 quantize/dequantize {quant_ms:7.2f} ms")
    if compiled_ms:
        print(f"    compiled graph (fused kernels) {compiled_ms:7.2f} ms")
    stack_ms = ops["stack"] / steps / 1e3
    if stack_ms:
        print(f"    fused decode stack (all layers) {stack_ms:7.2f} ms, by phase:")
        assert stack is not None
        for name, sec in stack.phase_seconds():
            print(f"      {name:12s} {sec / steps * 1e3:7.2f} ms")
    rest = model_ms - matmul_ms - other_ms - quant_ms - compiled_ms - stack_ms
    rest += phases["sampler"] / steps * 1e3
    print(f"    attention kernel + Python, by difference: {max(rest, 0):7.2f} ms")
    if args.top:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
