"""Precision, quantization and compilation: speed and accuracy of each, in one run (issue #6).

Speed, per configuration (dtype, quantization, compile), on SmolLM2-135M through the engine:
prefill tok/s (512-token prompts, 512-token steps), and decode tok/s at 1 and 64 concurrent
requests (~100-token prompts, pure decode steps after the prefills; tok/s = requests / median
step time, robust to a shared machine's stalls; the mean is printed too). The first decode step
of a compiled configuration includes its compile time, reported separately.

Accuracy (--accuracy): perplexity of tests/data/pride_and_prejudice_ch1.txt, and greedy token
agreement with float32 over the prompts of tests/data/prompts.txt (64 x 64 tokens by default,
all submitted at once, so decodes run 64 rows a step).

Kernels (--kernels): each int8 linear path against bf16 at SmolLM2's shapes and 1-512 rows;
what `surge.models.quant.GEMV_MAX_ROWS` is set from.

    python benchmarks/bench_precision.py [--configs float32,bfloat16,int8,int8+compile,...]
        [--requests 1,64] [--steps 32] [--accuracy] [--prompts 64 --tokens 64] [--kernels]
        [--model smollm2-135m|gemma3-270m|PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from surge import LLM, SamplingParams
from surge.engine.client.outputs import EngineCoreRequest
from surge.engine.llm import RequestOutput
from surge.models.evaluate import perplexity, score, token_logprobs
from surge.models.quant import Int8Linear, quantize_int8, weight_bytes

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
DECODE_ROWS = 8  # rows per chunk that take the decode kernels (GEMV_MAX_ROWS)
DEFAULT_CONFIGS = "float32,bfloat16,bfloat16+compile,int8,int8+compile"


@dataclass(frozen=True)
class Config:
    name: str
    dtype: str
    quantization: str
    compile: bool
    kv_cache_dtype: str = "auto"
    cuda_graphs: bool = True

    @classmethod
    def parse(cls, text: str) -> Config:
        """float32 | bfloat16 | int8 | int8-weight-only | w8a8 | q4, then optionally +compile,
        +kvbf16, +kvf32 or +kvint8 (a bfloat16, float32 or int8 KV cache whatever `auto` would
        choose), +eager (a GPU's decode steps without CUDA graphs)."""
        base, *flags = text.split("+")
        kv_flags = {"kvbf16": "bfloat16", "kvf32": "float32", "kvint8": "int8"}
        unknown = set(flags) - {"compile", "eager", *kv_flags}
        if unknown:
            raise SystemExit(f"unknown flags {unknown} in {text!r}")
        kv = next((kv_flags[f] for f in flags if f in kv_flags), "auto")
        floats = ("float32", "bfloat16", "float16")
        dtype, quant = (base, "none") if base in floats else ("auto", base)
        return cls(text, dtype, quant, "compile" in flags, kv, "eager" not in flags)

    def llm(self, max_num_seqs: int) -> LLM:
        return LLM(
            MODEL[0],
            dtype=self.dtype,
            quantization=self.quantization,
            compile=self.compile,
            kv_cache_dtype=self.kv_cache_dtype,
            cuda_graphs=self.cuda_graphs,
            max_num_seqs=max_num_seqs,
        )


MODEL = ["smollm2-135m"]  # --model


def prompt_ids(llm: LLM, n: int, length: int) -> list[list[int]]:
    text = (
        "Large language models are served to many users at once: requests join a running batch "
        "at every step, and the KV cache lives in fixed-size blocks. "
    ) * (length // 20 + 2)
    return [llm.tokenizer.encode(f"Request {i}. {text}")[:length] for i in range(n)]


def bench_prefill(llm: LLM, num_prompts: int = 4, length: int = 512) -> float:
    # One more prompt than measured, for the warm-up: a measured prompt must not be served from
    # the prefix cache.
    *prompts, warm = prompt_ids(llm, num_prompts + 1, length)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate([warm], params, use_tqdm=False)
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return num_prompts * length / (time.perf_counter() - t)


def bench_decode(llm: LLM, num_requests: int, steps: int) -> dict[str, float]:
    """Pure decode steps of `num_requests` requests; the first one's time (compile included)
    is reported apart."""
    eng = llm.engine
    # Long enough that no request ends while measured (the batch would shrink), aborted after.
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1000, ignore_eos=True)
    tag = f"d{num_requests}-{time.monotonic_ns()}"
    req_ids = [f"{tag}-{i}" for i in range(num_requests)]
    for req_id, ids in zip(req_ids, prompt_ids(llm, num_requests, 100), strict=True):
        eng.add_request(EngineCoreRequest(req_id, ids, params))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running) or (
        eng.scheduler.num_waiting
    ):
        eng.step()
    t = time.perf_counter()
    eng.step()
    first_s = time.perf_counter() - t
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t)
    for req_id in req_ids:  # the next measurement starts empty
        eng.abort(req_id)
    return {
        "tok_s_median": num_requests / statistics.median(times),
        "tok_s_mean": num_requests * len(times) / sum(times),
        "first_step_s": first_s,
    }


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict[str, float]:
    prefix = []
    same = 0
    total = 0
    for a, b in zip(ref, got, strict=True):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefix.append(n)
        same += sum(x == y for x, y in zip(a, b, strict=False))
        total += max(len(a), len(b))
    length = max(len(a) for a in ref)
    return {
        "identical": sum(p == length for p in prefix) / len(ref),
        "mean_prefix": statistics.mean(prefix),
        "token_agreement": same / total,
    }


def run_accuracy(
    configs: list[Config], num_prompts: int, num_tokens: int
) -> dict[str, dict[str, float]]:
    text_ids: list[int] | None = None
    prompts = (DATA / "prompts.txt").read_text().splitlines()[:num_prompts]
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    results: dict[str, dict[str, float]] = {}
    ref_outs: list[RequestOutput] | None = None
    ref_ppl = ref_ppl8 = 0.0
    for cfg in [Config("float32", "float32", "none", False), *configs]:
        if cfg.name in results:
            continue
        llm = cfg.llm(max_num_seqs=max(num_prompts, 1))
        if text_ids is None:
            text_ids = llm.tokenizer.encode((DATA / "pride_and_prejudice_ch1.txt").read_text())
        model = llm.engine.model
        kv = llm.engine.runner.kv_caches[0][0].dtype  # the engine's, `auto` resolved
        ppl = perplexity(token_logprobs(model, text_ids, kv))
        # Chunks of 8 rows: the kernels of a decode step (GEMV, q4), not the prefill's GEMMs.
        ppl8 = perplexity(token_logprobs(model, text_ids, kv, chunk_size=DECODE_ROWS))
        outs = llm.generate(prompts, params, use_tqdm=False)
        tokens = [o.outputs[0].token_ids for o in outs]
        if ref_outs is None:
            ref_outs, ref_ppl = outs, ppl
        ref_tokens = [o.outputs[0].token_ids for o in ref_outs]
        # Teacher-forced: fed float32's prompt + output, is this precision's next greedy token
        # float32's? (Free-running outputs part ways for good after one near tie.)
        forced = forced8 = total = 0
        for o in ref_outs:
            text = o.prompt_token_ids + o.outputs[0].token_ids
            for rows in (512, DECODE_ROWS):
                greedy = score(model, text, kv, chunk_size=rows)[1]
                cont = greedy[len(o.prompt_token_ids) - 1 :].tolist()
                same = sum(a == b for a, b in zip(cont, o.outputs[0].token_ids, strict=True))
                if rows == 512:
                    forced += same
                    total += len(cont)
                else:
                    forced8 += same
        if ref_ppl8 == 0.0:
            ref_ppl8 = ppl8
        row = {
            "perplexity": ppl,
            "ppl_vs_fp32": ppl / ref_ppl - 1,
            "perplexity_decode": ppl8,
            "ppl_decode_vs_fp32": ppl8 / ref_ppl8 - 1,
            "teacher_forced": forced / total,
            "teacher_forced_decode": forced8 / total,
            **agreement(ref_tokens, tokens),
        }
        results[cfg.name] = row
        print(
            f"{cfg.name:22s} ppl {ppl:8.4f} ({row['ppl_vs_fp32']:+6.2%}), in {DECODE_ROWS}-row "
            f"chunks {ppl8:8.4f} ({row['ppl_decode_vs_fp32']:+6.2%})  teacher-forced "
            f"{row['teacher_forced']:6.1%} ({DECODE_ROWS}-row: {row['teacher_forced_decode']:6.1%})"
            f"  free-running: identical {row['identical']:6.1%}, "
            f"mean identical prefix {row['mean_prefix']:5.1f}/{num_tokens}, "
            f"same position {row['token_agreement']:6.1%}",
            flush=True,
        )
        del llm
        gc.collect()
    return results


def run_speed(
    configs: list[Config], requests: list[int], steps: int
) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    header = f"{'config':22s} {'weights':>9} {'load s':>7} {'prefill':>9}"
    for n in requests:
        header += f" {f'decode@{n}':>10} {'(mean)':>8}"
    print(header + "  compile s (first step)")
    for cfg in configs:
        t = time.perf_counter()
        llm = cfg.llm(max_num_seqs=max(requests))
        load_s = time.perf_counter() - t
        row: dict[str, float] = {
            "weight_mib": weight_bytes(llm.engine.model) / (1 << 20),
            "load_s": load_s,
            "prefill_tok_s": bench_prefill(llm),
        }
        firsts = []
        for n in requests:
            d = bench_decode(llm, n, steps)
            row[f"decode{n}_tok_s"] = d["tok_s_median"]
            row[f"decode{n}_tok_s_mean"] = d["tok_s_mean"]
            row[f"decode{n}_first_step_s"] = d["first_step_s"]
            firsts.append(f"{d['first_step_s']:.1f}")
        results[cfg.name] = row
        line = (
            f"{cfg.name:22s} {row['weight_mib']:7.1f}Mi {load_s:7.1f} {row['prefill_tok_s']:9.1f}"
        )
        for n in requests:
            line += f" {row[f'decode{n}_tok_s']:10.1f} {row[f'decode{n}_tok_s_mean']:8.1f}"
        print(line + "  " + " / ".join(firsts), flush=True)
        del llm
        gc.collect()
    return results


def run_kernels(rows: list[int]) -> None:
    from surge.models.kernels import load_int8_linear

    if load_int8_linear() is None:
        print("no compiled int8 kernels here")
        return
    shapes = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
    shapes["lm_head"] = (576, 49152)
    print(f"{'shape':8s} {'rows':>5} {'bf16 us':>9} {'gemv us':>9} {'w8a8 us':>9}")
    for name, (k, n) in shapes.items():
        # Enough copies that the weights stream from memory, as in a step, not from cache.
        copies = max(2, (64 << 20) // (k * n))
        floats = [torch.randn(n, k) * 0.02 for _ in range(copies)]
        bf16 = [w.bfloat16() for w in floats]
        layers = [Int8Linear(*quantize_int8(w), kernels=True) for w in floats]
        for m in rows:
            x = torch.randn(m, k).bfloat16()
            cells = _kernel_times(x, bf16, layers)
            print(f"{name:8s} {m:5d} " + " ".join(f"{c:9.1f}" for c in cells), flush=True)


def _kernel_times(
    x: torch.Tensor, bf16: list[torch.Tensor], layers: list[Int8Linear]
) -> list[float]:
    copies = len(bf16)
    return [
        _min_time_us(lambda i: torch.nn.functional.linear(x, bf16[i]), copies),
        _min_time_us(lambda i: layers[i].gemv(x), copies),
        _min_time_us(lambda i: layers[i].w8a8(x), copies),
    ]


def _min_time_us(call: Callable[[int], object], copies: int, secs: float = 0.3) -> float:
    """Least time of one call, cycling through weight copies: robust to a shared machine."""
    best = float("inf")
    i = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - t0 < secs or i < 3:
            t = time.perf_counter()
            call(i % copies)
            best = min(best, time.perf_counter() - t)
            i += 1
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--requests", default="1,64")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--accuracy", action="store_true", help="perplexity and token agreement")
    ap.add_argument("--accuracy-only", action="store_true")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kernels", action="store_true", help="int8 kernels per shape and rows")
    ap.add_argument("--out", default="results/bench_precision.json")
    ap.add_argument("--model", default="smollm2-135m", help="e.g. gemma3-270m")
    args = ap.parse_args()
    MODEL[0] = args.model
    if args.kernels:
        run_kernels([1, 2, 4, 8, 12, 16, 32, 64, 512])
        return
    configs = [Config.parse(c) for c in args.configs.split(",")]
    out: dict[str, object] = {"threads": torch.get_num_threads()}
    if not args.accuracy_only:
        requests = [int(n) for n in args.requests.split(",")]
        out["speed"] = run_speed(configs, requests, args.steps)
    if args.accuracy or args.accuracy_only:
        out["accuracy"] = run_accuracy(configs, args.prompts, args.tokens)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
