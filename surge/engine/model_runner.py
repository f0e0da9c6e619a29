"""Turns a SchedulerOutput into tensors, runs the model, samples.

`load_model` is where precision, quantization and the KV cache are decided from the configs and
the device (and reported); `ModelRunner` runs steps, eagerly or through torch.compile.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from surge.engine.batch import SampledToken, SampledTokens, ScheduledRequest, SchedulerOutput
from surge.engine.config import CacheConfig, ModelConfig
from surge.engine.kv_cache import (
    AVERAGE_CONTEXT_TOKENS,
    MAX_RECOMMENDED_SEQS,
    KVCachePlan,
    allocate_kv_cache,
    plan_kv_cache,
    recommend_max_num_seqs,
)
from surge.engine.sampler import Sampler, SamplingRow
from surge.models import build_model
from surge.models.attention import AttnMetadata, PrefillChunk
from surge.models.device import DTYPE_NAMES, Precision, choose_kv_dtype, choose_precision, describe
from surge.models.kernels import load_int8_linear, load_paged_decode
from surge.models.llama import LlamaForCausalLM
from surge.models.quant import GEMV_MAX_ROWS, estimate_weight_bytes, weight_bytes
from surge.models.weights import ModelFiles

log = logging.getLogger(__name__)

# Pure-decode steps run compiled. Up to 8 requests (int8's GEMV regime, where per-op overhead
# is most of a step) the count is padded to one of these and each has a graph specialized to it;
# 9 to MAX_COMPILED_SEQS share one graph whose batch dimension is dynamic. Five compiles in all,
# none at a new batch size later; larger batches run eagerly.
COMPILE_BUCKETS = (1, 2, 4, 8)
MAX_COMPILED_SEQS = 512
DYNAMIC = 0  # the "bucket" of the dynamic graph
# The dynamic graph must not straddle int8's switch from GEMV to W8A8 (a branch on its size).
assert COMPILE_BUCKETS[-1] >= GEMV_MAX_ROWS


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """The model on its device with its KV cache, and what was decided to get there."""

    model: LlamaForCausalLM
    precision: Precision
    kv_dtype: torch.dtype
    plan: KVCachePlan
    kv_caches: list[tuple[Tensor, Tensor]]
    max_model_len: int  # the configured context, capped so one request always fits the pool
    weight_bytes: int


def load_model(model_cfg: ModelConfig, cache_cfg: CacheConfig, files: ModelFiles) -> LoadedModel:
    """Choose dtype and KV dtype for the device, build and quantize the model, size and allocate
    the KV cache, and log what was chosen and why."""
    spec = files.spec
    precision = choose_precision(model_cfg.device, model_cfg.dtype)
    device, dtype = precision.device, precision.dtype
    kv_dtype, kv_reason = choose_kv_dtype(cache_cfg.kv_cache_dtype, dtype)
    plan = plan_kv_cache(
        spec, kv_dtype, cache_cfg.block_size, cache_cfg.kv_cache_memory_gib, cache_cfg.num_blocks
    )
    max_len = model_cfg.max_model_len or spec.max_position_embeddings
    t0 = time.perf_counter()
    model = build_model(
        spec,
        files.weights(),
        device,
        dtype,
        max(max_len, spec.max_position_embeddings),
        quantization=model_cfg.quantization,
        use_kernels=model_cfg.use_kernels,
    )
    nbytes = weight_bytes(model)
    if precision.caps is not None:
        log.info("device %s", describe(precision.caps))
    log.info(
        "model %s: %s (%s); quantization %s; weights %.1f MiB, loaded in %.1f s",
        files.path.name,
        DTYPE_NAMES.get(dtype, str(dtype)),
        precision.reason,
        model_cfg.quantization,
        nbytes / (1 << 20),
        time.perf_counter() - t0,
    )
    max_model_len = min(max_len, plan.num_tokens)
    log.info(
        "KV cache %s (%s): %d blocks x %d tokens = %d tokens (%.2f GiB); context %d",
        DTYPE_NAMES.get(kv_dtype, str(kv_dtype)),
        kv_reason,
        plan.num_blocks,
        plan.block_size,
        plan.num_tokens,
        plan.total_bytes / (1 << 30),
        max_model_len,
    )
    return LoadedModel(
        model=model,
        precision=precision,
        kv_dtype=kv_dtype,
        plan=plan,
        kv_caches=allocate_kv_cache(spec, plan, kv_dtype, device),
        max_model_len=max_model_len,
        weight_bytes=nbytes,
    )


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[tuple[Tensor, Tensor]],
        sampler: Sampler,
        device: torch.device,
        block_size: int,
        use_kernels: bool = True,
        compile: bool = False,
    ) -> None:
        self.model = model
        self.decode_op: Callable[..., Tensor] | None = None
        self.write_kv_op: Callable[..., None] | None = None
        if use_kernels and device.type == "cpu":
            if load_paged_decode() is not None:
                self.decode_op = torch.ops.surge.paged_decode
                self.write_kv_op = torch.ops.surge.write_kv
            load_int8_linear()  # registers its ops' shapes for torch.compile
        self.kv_caches = kv_caches
        # allocate_kv_cache adds one block past the pool: padded rows write their K/V there.
        self.scratch_slot = (kv_caches[0][0].shape[1] - 1) * block_size if kv_caches else 0
        self.sampler = sampler
        self.device = device
        self.block_size = block_size
        self._compiled: Callable[..., Tensor] | None = None
        self._compiled_buckets: set[int] = set()
        if compile:
            # One graph per bucket, per model in the process (dynamo's cache is per code object,
            # shared by every LlamaForCausalLM): room for all of them.
            limit = (len(COMPILE_BUCKETS) + 1) * 4
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
            self._compiled = torch.compile(model.forward, dynamic=False, fullgraph=True)

    @torch.inference_mode()
    def run(self, batch: SchedulerOutput) -> SampledTokens:
        if batch.is_empty:
            return SampledTokens({})
        bucket = self._bucket(batch)
        input_ids, positions, attn, sample_reqs = self.prepare(batch, pad_to=bucket)
        if bucket is not None:
            logits = self._run_compiled(bucket, input_ids, positions, attn)[: len(sample_reqs)]
        else:
            logits = self.model(input_ids, positions, attn)  # [num_sampled, vocab]
        rows: list[SamplingRow] = [r.sampling for r in sample_reqs if r.sampling is not None]
        out = self.sampler(logits, rows)
        tokens: dict[str, SampledToken] = {}
        for i, sreq in enumerate(sample_reqs):
            top = out.top_logprobs[i]
            tokens[sreq.req_id] = SampledToken(
                out.token_ids[i], out.logprobs[i], tuple(top) if top is not None else None
            )
        return SampledTokens(tokens)

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile every decode graph now, on padding rows alone (they read and write only the
        scratch block), so that no request stalls for a compile; returns the seconds spent."""
        if self._compiled is None:
            return 0.0
        t0 = time.perf_counter()
        empty = SchedulerOutput((), 0)
        # One row past the last bucket is the dynamic graph's first size.
        for rows in (*COMPILE_BUCKETS, COMPILE_BUCKETS[-1] + 1):
            ids, positions, attn, _ = self.prepare(empty, pad_to=rows)
            self._run_compiled(rows, ids, positions, attn)
        return time.perf_counter() - t0

    def _bucket(self, batch: SchedulerOutput) -> int | None:
        """The row count a pure-decode step runs compiled at (padded up to a bucket, or as it is
        in the dynamic graph's range); None: run eagerly."""
        n = len(batch.requests)
        if self._compiled is None or not all(r.is_decode for r in batch.requests):
            return None
        if n > COMPILE_BUCKETS[-1]:
            return n if n <= MAX_COMPILED_SEQS else None
        return COMPILE_BUCKETS[bisect.bisect_left(COMPILE_BUCKETS, n)]

    def _run_compiled(
        self, bucket: int, ids: Tensor, positions: Tensor, attn: AttnMetadata
    ) -> Tensor:
        assert self._compiled is not None
        # Block tables grow with the context: a dynamic dimension, not a recompile per length.
        torch._dynamo.mark_dynamic(attn.decode_block_tables, 1)
        if attn.decode_bias.numel():
            torch._dynamo.mark_dynamic(attn.decode_bias, 2)
        key = bucket if bucket in COMPILE_BUCKETS else DYNAMIC
        if key == DYNAMIC:
            # Every per-request tensor: the batch dimension, in the range that never takes the
            # GEMV (so the graph holds no branch on it).
            lo, hi = COMPILE_BUCKETS[-1] + 1, MAX_COMPILED_SEQS
            rows = [ids, positions, attn.slot_mapping, attn.logits_indices]
            rows += [attn.decode_block_tables, attn.decode_seq_lens]
            if attn.decode_bias.numel():
                rows.append(attn.decode_bias)
            for t in rows:
                torch._dynamo.mark_dynamic(t, 0, min=lo, max=hi)
        if key in self._compiled_buckets:
            # Every step of a bucket passes the same structure (the same model, caches and
            # ops; only tensor contents and the table width change), so the guards that pick
            # a bucket's graph are the only ones needed: all of them cost ~1 ms a step.
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return self._compiled(ids, positions, attn)
        t0 = time.perf_counter()
        try:
            # Freezing (read while tracing): weights become constants of the graph rather than
            # ~300 inputs to gather and check at every call, ~1 ms a step at one request. A few
            # rows make the fused kernels too small to split across threads: single-threaded
            # they save a fork/join each (~150 a step), ~1 ms at one request.
            options: dict[str, object] = {"freezing": True}
            if key != DYNAMIC:
                options["cpp.threads"] = 1
            with torch._inductor.config.patch(options):
                logits = self._compiled(ids, positions, attn)
        except Exception as e:  # a backend that cannot compile here: stay correct, run eagerly
            log.warning("torch.compile failed, running eagerly from now on: %s", e)
            self._compiled = None
            return self.model(ids, positions, attn)
        self._compiled_buckets.add(key)
        what = f"{key}" if key != DYNAMIC else f"{COMPILE_BUCKETS[-1] + 1}-{MAX_COMPILED_SEQS}"
        log.info("compiled decode step for %s requests in %.1f s", what, time.perf_counter() - t0)
        return logits

    def prepare(
        self, batch: SchedulerOutput, pad_to: int | None = None
    ) -> tuple[Tensor, Tensor, AttnMetadata, list[ScheduledRequest]]:
        """Step tensors; `pad_to` (pure-decode steps only) appends dummy decodes up to that many
        rows, writing to the scratch slot and sampled as rows past the real ones, and makes
        logits_indices that long."""
        bs = self.block_size
        # Decodes first, then prefill chunks: decodes attend in one batched call.
        decodes = [r for r in batch.requests if r.is_decode]
        prefills = [r for r in batch.requests if not r.is_decode]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_indices: list[int] = []
        sample_reqs: list[ScheduledRequest] = []

        for r in decodes:
            pos = r.start_pos
            input_ids.append(r.token_ids[0])
            positions.append(pos)
            slots.append(r.block_table[pos // bs] * bs + pos % bs)
            if r.sampling is not None:
                logits_indices.append(len(input_ids) - 1)
                sample_reqs.append(r)

        chunks: list[PrefillChunk] = []
        for r in prefills:
            start = len(input_ids)
            n = len(r.token_ids)
            input_ids.extend(r.token_ids)
            pos_range = range(r.start_pos, r.start_pos + n)
            positions.extend(pos_range)
            table = r.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in pos_range)
            num_blocks = (r.start_pos + n + bs - 1) // bs
            chunks.append(
                PrefillChunk(
                    query_start=start,
                    query_len=n,
                    start_pos=r.start_pos,
                    block_table=torch.tensor(table[:num_blocks], device=self.device),
                )
            )
            if r.sampling is not None:
                logits_indices.append(len(input_ids) - 1)
                sample_reqs.append(r)

        dev = self.device
        tables_list = [list(r.block_table) for r in decodes]
        seq_lens_list = [r.start_pos + 1 for r in decodes]
        if pad_to is not None:
            assert not prefills and pad_to >= len(decodes)
            for _ in range(pad_to - len(decodes)):
                logits_indices.append(len(input_ids))
                input_ids.append(0)
                positions.append(0)
                slots.append(self.scratch_slot)
                tables_list.append([self.scratch_slot // bs])
                seq_lens_list.append(1)
            # A fixed shape per bucket, even if a decode did not sample: the graph's guards are
            # skipped once it is compiled.
            logits_indices += [0] * (pad_to - len(logits_indices))
        if tables_list:
            # >= 2 columns: a size-1 dimension would be specialized by torch.compile.
            max_blocks = max(2, max(len(t) for t in tables_list))
            tables = [t + [0] * (max_blocks - len(t)) for t in tables_list]
            decode_tables = torch.tensor(tables, dtype=torch.long, device=dev)
            seq_lens = torch.tensor(seq_lens_list, dtype=torch.long, device=dev)
            if self.decode_op is None:  # the compiled kernel reads seq_lens instead
                span = torch.arange(max_blocks * bs, device=dev)
                past_end = span.unsqueeze(0) >= seq_lens.unsqueeze(1)  # [D, L]
                decode_bias = torch.zeros(past_end.shape, device=dev)
                decode_bias = decode_bias.masked_fill_(past_end, -torch.inf).unsqueeze(1)
            else:
                decode_bias = torch.zeros((0, 1, 0), device=dev)
        else:
            decode_tables = torch.zeros((0, 1), dtype=torch.long, device=dev)
            seq_lens = torch.zeros(0, dtype=torch.long, device=dev)
            decode_bias = torch.zeros((0, 1, bs), device=dev)

        attn = AttnMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decodes=len(tables_list),
            decode_block_tables=decode_tables,
            decode_seq_lens=seq_lens,
            decode_bias=decode_bias,
            prefills=tuple(chunks),
            logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=dev),
            kv_caches=self.kv_caches,
            decode_op=self.decode_op,
            write_kv_op=self.write_kv_op,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos_t = torch.tensor(positions, dtype=torch.long, device=dev)
        return ids, pos_t, attn, sample_reqs


def capability_report(model_cfg: ModelConfig, cache_cfg: CacheConfig, files: ModelFiles) -> str:
    """What `load_model` would choose here, and what it buys, without reading the weights:
    `surge info`."""
    spec = files.spec
    precision = choose_precision(model_cfg.device, model_cfg.dtype)
    dtype = precision.dtype
    kv_dtype, kv_reason = choose_kv_dtype(cache_cfg.kv_cache_dtype, dtype)
    plan = plan_kv_cache(
        spec, kv_dtype, cache_cfg.block_size, cache_cfg.kv_cache_memory_gib, cache_cfg.num_blocks
    )
    max_len = min(model_cfg.max_model_len or spec.max_position_embeddings, plan.num_tokens)
    mib = 1 << 20

    def weights(dt: torch.dtype, quantization: str = "none") -> str:
        return f"{estimate_weight_bytes(spec, dt, quantization) / mib:.1f} MiB"

    caps = precision.caps
    per_token = plan.bytes_per_block // plan.block_size
    lines = [
        f"device        {describe(caps) if caps else precision.device}",
        f"dtype         {DTYPE_NAMES[dtype]} ({precision.reason})",
        f"quantization  {model_cfg.quantization}",
        f"model         {files.path.name}: {spec.architecture}, {spec.num_layers} layers, "
        f"hidden {spec.hidden_size}, vocab {spec.vocab_size}",
        f"weights       {weights(dtype, model_cfg.quantization)} "
        f"(float32 {weights(torch.float32)}, bfloat16 {weights(torch.bfloat16)}, "
        f"int8 {weights(dtype, 'int8')})",
        f"KV cache      {DTYPE_NAMES[kv_dtype]} ({kv_reason}), {per_token / 1024:.1f} KiB/token",
        f"KV capacity   {plan.total_bytes / (1 << 30):.2f} GiB -> {plan.num_tokens:,} tokens "
        f"({plan.num_blocks:,} blocks of {plan.block_size}); context {max_len:,}",
        f"max_num_seqs  recommended {recommend_max_num_seqs(plan.num_tokens, max_len)} "
        f"(KV tokens / {AVERAGE_CONTEXT_TOKENS}-token average context, at most "
        f"{MAX_RECOMMENDED_SEQS})",
        "",
        f"{'KV memory':>10} {'tokens':>10} {'seqs@512':>9} {'seqs@2048':>10} {'max_num_seqs':>13}",
    ]
    budgets = sorted({0.5, 1.0, 2.0, 4.0, 8.0, cache_cfg.kv_cache_memory_gib})
    for gib in budgets:
        tokens = int(gib * (1 << 30)) // plan.bytes_per_block * plan.block_size
        rec = recommend_max_num_seqs(tokens, max_len)
        lines.append(
            f"{gib:>6.1f} GiB {tokens:>10,} {tokens // 512:>9,} {tokens // 2048:>10,} {rec:>13}"
        )
    return "\n".join(lines)
