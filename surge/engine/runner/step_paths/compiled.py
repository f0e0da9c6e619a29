"""Pure-decode steps through torch.compile (--compile), base layers only (no LoRA rows, no
prompt scoring).

Up to 8 requests (int8's GEMV regime, where per-op overhead is most of a step) the count is
padded to one of COMPILE_BUCKETS and each has a graph specialized to it; 9 to MAX_COMPILED_SEQS
share one graph whose batch dimension is dynamic. Five compiles in all, none at a new batch
size later; larger batches run eagerly. (4-bit models on CPU run decode steps through the fused
stack instead, up to its max_rows, compiled or not: that path is asked first.)"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import torch
from torch import Tensor

from surge.engine.core.batch import SchedulerOutput
from surge.engine.runner.step_inputs import StepInputBuilder, StepInputs, StepLayout
from surge.engine.runner.step_paths.base import StepBatch
from surge.models.attention import AttnMetadata
from surge.models.llama import LlamaForCausalLM
from surge.models.quant import GEMV_MAX_ROWS

log = logging.getLogger(__name__)

COMPILE_BUCKETS = (1, 2, 4, 8)
MAX_COMPILED_SEQS = 512
DYNAMIC = 0  # the "bucket" of the dynamic graph
DYNAMIC_MIN = COMPILE_BUCKETS[-1] + 1  # its smallest batch
# The dynamic graph must not straddle int8's switch from GEMV to W8A8 (a branch on its size).
assert COMPILE_BUCKETS[-1] >= GEMV_MAX_ROWS


class CompiledPath:
    name = "compiled"

    def __init__(self, model: LlamaForCausalLM, device: torch.device) -> None:
        self.model = model
        self.device = device
        # One graph per bucket, per model in the process (dynamo's cache is per code object,
        # shared by every LlamaForCausalLM): room for all of them.
        limit = (len(COMPILE_BUCKETS) + 1) * 4
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
        # None once a compile failed: every step runs eagerly from then on.
        self.compiled: Callable[..., Tensor] | None = torch.compile(
            model.forward, dynamic=False, fullgraph=True
        )
        self.buckets: set[int] = set()  # the buckets compiled so far (DYNAMIC: the dynamic one)

    def accepts(self, step: StepBatch) -> bool:
        requests = step.batch.requests
        if self.compiled is None or step.scoring or step.lora or len(requests) > MAX_COMPILED_SEQS:
            return False
        return all(r.is_decode for r in requests)

    def layout(self, step: StepBatch) -> StepLayout:
        return StepLayout(pad_to=bucket_for(len(step.batch.requests)))

    def run(self, inputs: StepInputs) -> Tensor:
        return self._run(inputs.input_ids.shape[0], inputs.input_ids, inputs.positions, inputs.attn)

    def warm_up(self, builder: StepInputBuilder, skip_up_to: int = 0) -> float:
        """Compile every graph now, on padding rows alone (they read and write only the scratch
        block), so that no request stalls for a compile; row counts up to `skip_up_to` are left
        out (another path takes them). Returns the seconds spent."""
        t0 = time.perf_counter()
        empty = SchedulerOutput((), 0)
        for rows in (*COMPILE_BUCKETS, DYNAMIC_MIN):
            if self.compiled is None:
                break
            if rows <= skip_up_to:
                continue
            inputs = builder.build(empty, StepLayout(pad_to=rows))
            self._run(rows, inputs.input_ids, inputs.positions, inputs.attn)
        return time.perf_counter() - t0

    def _run(self, bucket: int, ids: Tensor, positions: Tensor, attn: AttnMetadata) -> Tensor:
        if self.compiled is None:  # a compile failed after this step was laid out
            return self.model(ids, positions, attn)
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
        if key in self.buckets:
            # Every step of a bucket passes the same structure (the same model, caches and
            # ops; only tensor contents and the table width change), so the guards that pick
            # a bucket's graph are the only ones needed: all of them cost ~1 ms a step.
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return self.compiled(ids, positions, attn)
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
                logits = self.compiled(ids, positions, attn)
        except Exception as e:  # a backend that cannot compile here: stay correct, run eagerly
            log.warning("torch.compile failed, running eagerly from now on: %s", e)
            self.compiled = None
            return self.model(ids, positions, attn)
        self.buckets.add(key)
        what = f"{key}" if key != DYNAMIC else f"{DYNAMIC_MIN}-{MAX_COMPILED_SEQS}"
        log.info("compiled decode step for %s requests in %.1f s", what, time.perf_counter() - t0)
        return logits


def bucket_for(n: int) -> int:
    """The row count a pure-decode step of `n` requests runs compiled at: padded up to a
    bucket, or as it is in the dynamic graph's range."""
    if n > COMPILE_BUCKETS[-1]:
        return n
    return COMPILE_BUCKETS[bisect.bisect_left(COMPILE_BUCKETS, n)]
