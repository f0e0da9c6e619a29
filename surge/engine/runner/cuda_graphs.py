"""Pure-decode steps replayed from captured CUDA graphs.

A small model's eager decode step on a GPU is bound by the CPU that launches its kernels, not by
the GPU: on an H200, SmolLM2-135M in bf16 decoded 32 tok/s at one request (~30 ms a step of
~1,600 torch calls), where reading its weights takes well under a millisecond. A graph replays
the step's kernels in one launch.

A graph is fixed in its shapes and addresses, so a step's inputs are copied into static buffers,
and a graph is captured per (rows, table width): rows padded up to one of ROW_BUCKETS (padding
rows write to the scratch slot and are not sampled), the block table's width up to a power of
two (the torch decode path gathers every column, so one width for the longest context would make
every step attend to it; columns past a row's own table are masked by its length). Each graph is
captured on first use, and all share one memory pool.

With `capture=False` the same static-buffer step runs eagerly: what a CPU test can check of it.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from surge.models.attention import AttnMetadata

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

log = logging.getLogger(__name__)

# Up to 512 rows: fine steps where a padded row is a large share of the batch, coarse above.
ROW_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)
ROW_BUCKETS += (160, 192, 224, 256, 320, 384, 448, 512)


class DecodeGraphs:
    def __init__(
        self,
        model: Callable[[Tensor, Tensor, AttnMetadata], Tensor],
        kv_caches: Sequence[tuple[Tensor, Tensor]],
        block_size: int,
        max_rows: int,
        max_blocks: int,
        scratch_slot: int,
        device: torch.device,
        capture: bool = True,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        top = ROW_BUCKETS[bisect.bisect_left(ROW_BUCKETS, min(max_rows, ROW_BUCKETS[-1]))]
        self.buckets = (*(b for b in ROW_BUCKETS if b < top), top)
        self.max_rows = self.buckets[-1]
        self.max_width = _pow2(max(2, max_blocks))
        self.capture = capture
        rows = self.max_rows
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slots = torch.full((rows,), scratch_slot, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.long, device=device)
        self.logits_indices = torch.zeros(rows, dtype=torch.long, device=device)
        # One flat buffer: each (rows, width) view of its head is contiguous, as the decode
        # path's view(-1) needs. Every value ever written is a block id, so stale columns are
        # valid reads, masked by the row's length.
        self.tables = torch.zeros(rows * self.max_width, dtype=torch.long, device=device)
        self.span = torch.arange(self.max_width * block_size, device=device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self._pool: _POOL_HANDLE | None = None  # the graphs' memory pool, once one exists
        self.steps: Counter[tuple[int, int]] = Counter()  # steps run per (rows, width)

    def rows_for(self, n: int, blocks: int = 1) -> int | None:
        """The padded row count a step of `n` decodes with tables up to `blocks` long replays
        at; None: too many rows (or blocks) for a graph."""
        if n > self.max_rows or blocks > self.max_width:
            return None
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def __call__(self, ids: Tensor, positions: Tensor, attn: AttnMetadata) -> Tensor:
        """Logits of a pure-decode step already padded to a bucket (StepInputBuilder.build)."""
        rows = ids.shape[0]
        assert rows in self.buckets and not attn.prefills
        width_in = attn.decode_block_tables.shape[1]
        width = _pow2(max(2, width_in))
        self.ids[:rows].copy_(ids)
        self.positions[:rows].copy_(positions)
        self.slots[:rows].copy_(attn.slot_mapping)
        self.seq_lens[:rows].copy_(attn.decode_seq_lens)
        self.logits_indices[:rows].copy_(attn.logits_indices)
        self._tables(rows, width)[:, :width_in].copy_(attn.decode_block_tables)
        self.steps[rows, width] += 1
        if not self.capture:
            return self._step(rows, width)
        key = (rows, width)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self._capture(rows, width)
        graph, out = entry
        graph.replay()
        return out

    def _tables(self, rows: int, width: int) -> Tensor:
        return self.tables[: rows * width].view(rows, width)

    def _step(self, rows: int, width: int) -> Tensor:
        """The model on the static buffers' first `rows` rows, tables `width` blocks wide."""
        seq_lens = self.seq_lens[:rows]
        past_end = self.span[: width * self.block_size].unsqueeze(0) >= seq_lens.unsqueeze(1)
        bias = torch.zeros(past_end.shape, device=past_end.device)
        attn = AttnMetadata(
            slot_mapping=self.slots[:rows],
            decode_block_tables=self._tables(rows, width),
            decode_seq_lens=seq_lens,
            decode_bias=bias.masked_fill_(past_end, -torch.inf).unsqueeze(1),
            prefills=(),
            logits_indices=self.logits_indices[:rows],
            kv_caches=self.kv_caches,
        )
        return self.model(self.ids[:rows], self.positions[:rows], attn)

    def _capture(self, rows: int, width: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        t0 = time.perf_counter()
        # One eager run first, on a side stream, as torch.cuda.graphs asks: it sets up cuBLAS
        # workspaces and lazy state, which must not happen inside the capture. It writes this
        # step's K/V, as the replay will again: the same values to the same slots.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._step(rows, width)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._step(rows, width)
        self._pool = graph.pool()
        self.graphs[(rows, width)] = (graph, out)
        took = time.perf_counter() - t0
        log.info(
            "captured a CUDA graph for decode steps of %d rows, %d-block tables, in %.2f s "
            "(%d graphs)",
            rows,
            width,
            took,
            len(self.graphs),
        )
        return graph, out


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()
