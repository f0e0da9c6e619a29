"""Turns a SchedulerOutput into tensors, runs the model (eagerly or through torch.compile),
samples."""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import torch
from torch import Tensor

from surge.engine.batch import SampledToken, SampledTokens, ScheduledRequest, SchedulerOutput
from surge.engine.cuda_graphs import DecodeGraphs
from surge.engine.prompt_logprobs import score_prompts
from surge.engine.request import TokenLogprob
from surge.engine.sampler import Sampler, SamplingRow
from surge.models.attention import AttnMetadata, PrefillChunk
from surge.models.kernels import load_int8_linear, load_paged_decode
from surge.models.llama import LlamaForCausalLM
from surge.models.lora import LoRABatch
from surge.models.q4_decode import FusedQ4Decode
from surge.models.quant import GEMV_MAX_ROWS

log = logging.getLogger(__name__)

# Pure-decode steps run compiled. Up to 8 requests (int8's GEMV regime, where per-op overhead
# is most of a step) the count is padded to one of these and each has a graph specialized to it;
# 9 to MAX_COMPILED_SEQS share one graph whose batch dimension is dynamic. Five compiles in all,
# none at a new batch size later; larger batches run eagerly. (4-bit models on CPU run decode
# steps through the fused stack instead, up to its max_rows, compiled or not.)
COMPILE_BUCKETS = (1, 2, 4, 8)
MAX_COMPILED_SEQS = 512
DYNAMIC = 0  # the "bucket" of the dynamic graph
DYNAMIC_MIN = COMPILE_BUCKETS[-1] + 1  # its smallest batch
# The dynamic graph must not straddle int8's switch from GEMV to W8A8 (a branch on its size).
assert COMPILE_BUCKETS[-1] >= GEMV_MAX_ROWS


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
        fused_decode: bool = True,
        cuda_graphs: bool = True,
        max_num_seqs: int = 256,
        max_model_len: int = 8192,
        batch_invariant: bool = False,
    ) -> None:
        self.model = model
        # Every step on the batch-invariant fused stack (else only steps with a request that
        # asks for it, SamplingParams.batch_invariant).
        self.batch_invariant = batch_invariant
        self.decode_op: Callable[..., Tensor] | None = None
        self.write_kv_op: Callable[..., None] | None = None
        if use_kernels and device.type == "cpu":
            int8_kv = bool(kv_caches) and kv_caches[0][0].dtype == torch.int8
            if load_paged_decode() is not None and (
                not int8_kv or model.spec.head_dim in (64, 128, 256)  # the op's int8 head sizes
            ):
                self.decode_op = torch.ops.surge.paged_decode
                self.write_kv_op = torch.ops.surge.write_kv
            load_int8_linear()  # registers its ops' shapes for torch.compile
        self.kv_caches = kv_caches
        # 4-bit models on CPU: small decode steps as one compiled call (None: not applicable).
        self.fused: FusedQ4Decode | None = None
        if fused_decode and use_kernels and device.type == "cpu" and model.spec.llama_block:
            # With its batch-invariant twin (a few MB of step buffers), for requests that ask.
            self.fused = FusedQ4Decode.build(model, kv_caches, batch_invariant=True)
            if self.fused is not None:
                log.info("decode steps of up to %d requests: fused stack", self.fused.max_rows)
        # allocate_kv_cache adds one block past the pool: padded rows write their K/V there.
        self.scratch_slot = (kv_caches[0][0].shape[1] - 1) * block_size if kv_caches else 0
        self.sampler = sampler
        self.device = device
        self.block_size = block_size
        self._compiled: Callable[..., Tensor] | None = None
        self._compiled_buckets: set[int] = set()
        self.lora_batch: LoRABatch | None = None  # set when LoRA adapters are served
        if compile:
            # One graph per bucket, per model in the process (dynamo's cache is per code object,
            # shared by every LlamaForCausalLM): room for all of them.
            limit = (len(COMPILE_BUCKETS) + 1) * 4
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
            self._compiled = torch.compile(model.forward, dynamic=False, fullgraph=True)
        # A GPU's decode steps replay CUDA graphs (eager ones: --compile keeps its own graphs).
        self.graphs: DecodeGraphs | None = None
        spec = model.spec
        # The longest sliding window (None: every layer sees the whole context).
        windows = [w for i in range(spec.num_layers) if (w := spec.window(i)) is not None]
        self.window = max(windows, default=None)
        # The graphs replay the whole-context decode only (sliding windows: eager steps).
        if cuda_graphs and device.type == "cuda" and not compile and self.window is None:
            self.graphs = DecodeGraphs(
                model,
                kv_caches,
                block_size,
                max_num_seqs,
                -(-max_model_len // block_size),
                self.scratch_slot,
                device,
            )

    @torch.inference_mode()
    def run(self, batch: SchedulerOutput) -> SampledTokens:
        if batch.is_empty:
            return SampledTokens({})
        lora = self.lora_batch is not None and any(r.lora_slot >= 0 for r in batch.requests)
        fused = self._fused_step(batch)
        scored: list[ScheduledRequest] = []
        prompt_logprobs: dict[str, list[TokenLogprob]] = {}
        scoring = any(r.prompt_targets for r in batch.requests)
        if scoring or (lora and not (fused and self.fused is not None and self.fused.has_lora)):
            # Adapters in the step: eagerly through the LoRA wrappers (CUDA graphs and
            # compiled steps hold the base layers only). Prompt logprobs: eagerly, with a row
            # of logits for every prompt position scored.
            input_ids, positions, attn, sample_reqs = self.prepare(batch, scored=scored)
            if lora:
                assert self.lora_batch is not None
                self.lora_batch.set_rows(self._row_slots(batch), self.device)
            try:
                logits = self.model(input_ids, positions, attn)
            finally:
                if lora:
                    assert self.lora_batch is not None
                    self.lora_batch.clear()
            prompt_logprobs = score_prompts(logits[len(sample_reqs) :], scored)
            logits = logits[: len(sample_reqs)]
        elif fused:
            assert self.fused is not None
            input_ids, positions, attn, sample_reqs = self.prepare(batch, chunks_as_rows=True)
            slots = torch.tensor(self._row_slots(batch)) if lora else None
            invariant = self.batch_invariant or any(r.batch_invariant for r in batch.requests)
            logits = self.fused(input_ids, positions, attn, slots, invariant)
        elif (graph_rows := self._graph_rows(batch)) is not None:
            assert self.graphs is not None
            input_ids, positions, attn, sample_reqs = self.prepare(batch, graph_rows, bias=False)
            logits = self.graphs(input_ids, positions, attn)[: len(sample_reqs)]
        else:
            bucket = self.bucket_for(batch)
            input_ids, positions, attn, sample_reqs = self.prepare(batch, pad_to=bucket)
            logits = self.forward(bucket, input_ids, positions, attn)[: len(sample_reqs)]
        # A request with a draft has a row per position: `sampling`, then its draft rows.
        rows: list[SamplingRow] = []
        j = 0  # the position within the current request's rows
        for i, r in enumerate(sample_reqs):
            j = j + 1 if i > 0 and sample_reqs[i - 1] is r else 0
            assert r.sampling is not None
            rows.append(r.sampling if j == 0 else r.draft_sampling[j - 1])
        out = self.sampler(logits, rows)
        tokens: dict[str, SampledToken] = {}
        drafts: dict[str, list[SampledToken]] = {}
        for i, sreq in enumerate(sample_reqs):
            top = out.top_logprobs[i]
            tok = SampledToken(
                out.token_ids[i], out.logprobs[i], tuple(top) if top is not None else None
            )
            if sreq.req_id in tokens:
                drafts.setdefault(sreq.req_id, []).append(tok)
            else:
                tokens[sreq.req_id] = tok
        return SampledTokens(tokens, drafts, prompt_logprobs)

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Compile every decode graph now, on padding rows alone (they read and write only the
        scratch block), so that no request stalls for a compile; returns the seconds spent."""
        if self._compiled is None:
            return 0.0
        t0 = time.perf_counter()
        empty = SchedulerOutput((), 0)
        for rows in (*COMPILE_BUCKETS, DYNAMIC_MIN):
            if self.fused is not None and rows <= self.fused.max_rows:
                continue  # these steps take the fused stack: no graph needed
            ids, positions, attn, _ = self.prepare(empty, pad_to=rows)
            self._run_compiled(rows, ids, positions, attn)
        return time.perf_counter() - t0

    def forward(
        self, bucket: int | None, ids: Tensor, positions: Tensor, attn: AttnMetadata
    ) -> Tensor:  # [rows of logits_indices, vocab]; padded rows last
        """The model on prepared step tensors: compiled at `bucket`, or eagerly if None."""
        if bucket is None:
            return self.model(ids, positions, attn)
        return self._run_compiled(bucket, ids, positions, attn)

    @staticmethod
    def _row_slots(batch: SchedulerOutput) -> list[int]:
        """Each input row's LoRA slot, in `prepare`'s row order: decodes, then prefill chunks
        (token by token: also the fused stack's rows)."""
        decodes = [r.lora_slot for r in batch.requests if r.is_decode]
        chunks = [r.lora_slot for r in batch.requests if not r.is_decode for _ in r.token_ids]
        return decodes + chunks

    def _fused_step(self, batch: SchedulerOutput) -> bool:
        """Whether the fused 4-bit stack takes this step: decodes, and prefill chunks up to its
        max_chunk tokens as rows of their own."""
        if self.fused is None:
            return False
        rows = 0
        for r in batch.requests:
            n = len(r.token_ids)
            if not r.is_decode and n > self.fused.max_chunk:
                return False
            rows += n
        return rows <= self.fused.max_rows

    def _graph_rows(self, batch: SchedulerOutput) -> int | None:
        """The padded row count of a pure-decode step that replays a CUDA graph, else None."""
        if self.graphs is None or not all(r.is_decode for r in batch.requests):
            return None
        blocks = max(len(r.block_table) for r in batch.requests)
        return self.graphs.rows_for(len(batch.requests), blocks)

    def bucket_for(self, batch: SchedulerOutput) -> int | None:
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
            rows = [ids, positions, attn.slot_mapping, attn.logits_indices]
            rows += [attn.decode_block_tables, attn.decode_seq_lens]
            if attn.decode_bias.numel():
                rows.append(attn.decode_bias)
            for t in rows:
                torch._dynamo.mark_dynamic(t, 0, min=DYNAMIC_MIN, max=MAX_COMPILED_SEQS)
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
            # they save a fork/join each (~150 a step), ~1 ms at one request. The C++ wrapper
            # calls the graph's ~150 kernels from C++, not Python: ~10% a step at one request
            # (interleaved A/B), neutral at 64 (so the dynamic graph, the slowest to build,
            # does without: the wrapper adds ~45 s of C++ build to each graph). Both are CPU
            # options: a GPU's graphs keep inductor's defaults.
            options: dict[str, object] = {"freezing": True}
            if key != DYNAMIC and self.device.type == "cpu":
                options.update({"cpp.threads": 1, "cpp_wrapper": True})
            with torch._inductor.config.patch(options):
                logits = self._compiled(ids, positions, attn)
        except Exception as e:  # a backend that cannot compile here: stay correct, run eagerly
            log.warning("torch.compile failed, running eagerly from now on: %s", e)
            self._compiled = None
            return self.model(ids, positions, attn)
        self._compiled_buckets.add(key)
        what = f"{key}" if key != DYNAMIC else f"{DYNAMIC_MIN}-{MAX_COMPILED_SEQS}"
        log.info("compiled decode step for %s requests in %.1f s", what, time.perf_counter() - t0)
        return logits

    def prepare(
        self,
        batch: SchedulerOutput,
        pad_to: int | None = None,
        bias: bool = True,
        chunks_as_rows: bool = False,
        scored: list[ScheduledRequest] | None = None,
    ) -> tuple[Tensor, Tensor, AttnMetadata, list[ScheduledRequest]]:
        """Step tensors; `pad_to` (pure-decode steps only) appends dummy decodes up to that many
        rows, writing to the scratch slot and sampled as rows past the real ones, and makes
        logits_indices that long. `bias=False`: no decode mask (the CUDA graphs make their own
        from the lengths). `chunks_as_rows`: each token of a prefill chunk is described as a
        decode of its own (its request's table, its position + 1 as the length), for a caller
        that writes every row's K/V before any row attends (the fused stack): causal attention
        over the cache, row by row. `scored`: a list to fill with the request of each row scored
        for prompt logprobs, whose logits follow the sampled rows'."""
        bs = self.block_size
        # Decodes first, then prefill chunks: decodes attend in one batched call.
        decodes = [r for r in batch.requests if r.is_decode]
        prefills = [r for r in batch.requests if not r.is_decode]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_indices: list[int] = []
        sample_reqs: list[ScheduledRequest] = []
        score_rows: list[int] = []

        for r in decodes:
            pos = r.start_pos
            input_ids.append(r.token_ids[0])
            positions.append(pos)
            slots.append(r.block_table[pos // bs] * bs + pos % bs)
            if scored is not None and r.prompt_targets:  # a one-token chunk mid-prompt
                score_rows.append(len(input_ids) - 1)
                scored.append(r)
            if r.sampling is not None:
                logits_indices.append(len(input_ids) - 1)
                sample_reqs.append(r)

        chunks: list[PrefillChunk] = []
        tables_list = [list(r.block_table) for r in decodes]
        seq_lens_list = [r.start_pos + 1 for r in decodes]
        for r in prefills:
            start = len(input_ids)
            n = len(r.token_ids)
            input_ids.extend(r.token_ids)
            if scored is not None and r.prompt_targets:
                first = start + r.prompt_rows_start
                score_rows.extend(range(first, first + len(r.prompt_targets)))
                scored.extend([r] * len(r.prompt_targets))
            pos_range = range(r.start_pos, r.start_pos + n)
            positions.extend(pos_range)
            table = r.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in pos_range)
            num_blocks = (r.start_pos + n + bs - 1) // bs
            if chunks_as_rows:
                rows_table = list(table[:num_blocks])
                tables_list += [rows_table] * n
                seq_lens_list.extend(p + 1 for p in pos_range)
            else:
                chunks.append(
                    PrefillChunk(
                        query_start=start,
                        query_len=n,
                        start_pos=r.start_pos,
                        block_table=torch.tensor(table[:num_blocks], device=self.device),
                    )
                )
            if r.sampling is not None:
                # With a draft: every draft position too, in order (the chunk is the last
                # token and the draft).
                for back in range(len(r.draft), -1, -1):
                    logits_indices.append(len(input_ids) - 1 - back)
                    sample_reqs.append(r)

        dev = self.device
        logits_indices += score_rows  # after the sampled rows
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
            if self.decode_op is None and bias:  # the compiled kernel reads seq_lens instead
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
        window_bias = None
        if self.window is not None and tables_list and max(seq_lens_list) > self.window:
            span = torch.arange(decode_tables.shape[1] * bs, device=dev).unsqueeze(0)  # [1, L]
            ends = seq_lens.unsqueeze(1)  # [D, 1]
            outside = (span >= ends) | (span < ends - self.window)
            window_bias = torch.zeros(outside.shape, device=dev).masked_fill_(outside, -torch.inf)
            window_bias = window_bias.unsqueeze(1)

        attn = AttnMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            decode_block_tables=decode_tables,
            decode_seq_lens=seq_lens,
            decode_bias=decode_bias,
            prefills=tuple(chunks),
            logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=dev),
            kv_caches=self.kv_caches,
            decode_op=self.decode_op,
            write_kv_op=self.write_kv_op,
            decode_bias_window=window_bias,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos_t = torch.tensor(positions, dtype=torch.long, device=dev)
        return ids, pos_t, attn, sample_reqs
