"""A step's tensors from the scheduler's frozen SchedulerOutput: token ids, positions, cache
slots, block tables and the rows to sample, in the layout a step path asks for (StepLayout).
Pure: it runs no model and keeps no state between steps.

Rows are laid out decodes first, then prefill chunks (decodes attend in one batched call);
sampled rows' logits first, then prompt-scoring rows', then padding."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from surge.engine.core.batch import ScheduledRequest, SchedulerOutput
from surge.models.attention import AttnMetadata, PrefillChunk


@dataclass(frozen=True, slots=True)
class StepLayout:
    """How a step path wants its tensors laid out."""

    # Pure-decode steps only: append dummy decodes up to this many rows, writing to the
    # scratch slot and sampled as rows past the real ones (logits_indices that long too).
    pad_to: int | None = None
    # The decode mask from the lengths; False: none (the CUDA graphs make their own).
    mask: bool = True
    # Each token of a prefill chunk described as a decode of its own (its request's table,
    # its position + 1 as the length), for a path that writes every row's K/V before any row
    # attends (the fused stack): causal attention over the cache, row by row.
    chunks_as_rows: bool = False
    # Rows scored for prompt logprobs: their logits follow the sampled rows'.
    score: bool = False
    # Each row's LoRA slot (StepInputs.row_slots).
    lora_slots: bool = False


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: Tensor  # [rows] long
    positions: Tensor  # [rows] long
    attn: AttnMetadata
    sample_reqs: list[ScheduledRequest]  # the request of each sampled row, in row order
    scored: list[ScheduledRequest]  # the request of each prompt-scoring row (layout.score)
    row_slots: list[int] | None  # each row's LoRA slot (layout.lora_slots), padding excluded
    requests: tuple[ScheduledRequest, ...]  # the step's requests, as scheduled
    num_decodes: int  # rows [0, num_decodes) are decodes, one per request; then prefill rows


class StepInputBuilder:
    """Builds StepInputs on `device` for a model whose caches are `kv_caches`."""

    def __init__(
        self,
        *,
        block_size: int,
        device: torch.device,
        kv_caches: Sequence[tuple[Tensor, Tensor]],
        scratch_slot: int,
        window: int | None = None,
        decode_op: Callable[..., Tensor] | None = None,
        write_kv_op: Callable[..., None] | None = None,
    ) -> None:
        self.block_size = block_size
        self.device = device
        self.kv_caches = kv_caches
        self.scratch_slot = scratch_slot  # padding rows write their K/V here
        self.window = window  # the longest sliding window (None: none)
        self.decode_op = decode_op  # the compiled paged decode: it reads seq_lens, no mask
        self.write_kv_op = write_kv_op

    def build(self, batch: SchedulerOutput, layout: StepLayout) -> StepInputs:
        bs = self.block_size
        decodes = [r for r in batch.requests if r.is_decode]
        prefills = [r for r in batch.requests if not r.is_decode]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_indices: list[int] = []
        sample_reqs: list[ScheduledRequest] = []
        score_rows: list[int] = []
        scored: list[ScheduledRequest] = []
        row_slots: list[int] | None = [] if layout.lora_slots else None
        score = layout.score

        for r in decodes:
            pos = r.start_pos
            input_ids.append(r.token_ids[0])
            positions.append(pos)
            slots.append(r.block_table[pos // bs] * bs + pos % bs)
            if row_slots is not None:
                row_slots.append(r.lora_slot)
            if score and r.prompt_targets:  # a one-token chunk mid-prompt
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
            if row_slots is not None:
                row_slots.extend([r.lora_slot] * n)
            if score and r.prompt_targets:
                first = start + r.prompt_rows_start
                score_rows.extend(range(first, first + len(r.prompt_targets)))
                scored.extend([r] * len(r.prompt_targets))
            pos_range = range(r.start_pos, r.start_pos + n)
            positions.extend(pos_range)
            table = r.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in pos_range)
            num_blocks = (r.start_pos + n + bs - 1) // bs
            if layout.chunks_as_rows:
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

        logits_indices += score_rows  # after the sampled rows
        if layout.pad_to is not None:
            assert not prefills and layout.pad_to >= len(decodes)
            self._pad(layout.pad_to, input_ids, positions, slots, tables_list, seq_lens_list)
            logits_indices.extend(range(len(decodes), layout.pad_to))
            # A fixed shape per bucket, even if a decode did not sample: the graph's guards are
            # skipped once it is compiled.
            logits_indices += [0] * (layout.pad_to - len(logits_indices))
        dev = self.device
        tables, seq_lens, bias, window_bias = self._decode_tensors(
            tables_list, seq_lens_list, layout.mask
        )
        attn = AttnMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            decode_block_tables=tables,
            decode_seq_lens=seq_lens,
            decode_bias=bias,
            prefills=tuple(chunks),
            logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=dev),
            kv_caches=self.kv_caches,
            decode_op=self.decode_op,
            write_kv_op=self.write_kv_op,
            decode_bias_window=window_bias,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos_t = torch.tensor(positions, dtype=torch.long, device=dev)
        return StepInputs(
            ids, pos_t, attn, sample_reqs, scored, row_slots, batch.requests, len(decodes)
        )

    def _pad(
        self,
        rows: int,
        input_ids: list[int],
        positions: list[int],
        slots: list[int],
        tables_list: list[list[int]],
        seq_lens_list: list[int],
    ) -> None:
        """Dummy decodes up to `rows`: token 0 at position 0, in the scratch block."""
        for _ in range(rows - len(input_ids)):
            input_ids.append(0)
            positions.append(0)
            slots.append(self.scratch_slot)
            tables_list.append([self.scratch_slot // self.block_size])
            seq_lens_list.append(1)

    def _decode_tensors(
        self, tables_list: list[list[int]], seq_lens_list: list[int], mask: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """AttnMetadata's decode fields: block tables, lengths, the mask, the window's mask."""
        bs, dev = self.block_size, self.device
        if not tables_list:
            return (
                torch.zeros((0, 1), dtype=torch.long, device=dev),
                torch.zeros(0, dtype=torch.long, device=dev),
                torch.zeros((0, 1, bs), device=dev),
                None,
            )
        # >= 2 columns: a size-1 dimension would be specialized by torch.compile.
        max_blocks = max(2, max(len(t) for t in tables_list))
        tables = [t + [0] * (max_blocks - len(t)) for t in tables_list]
        decode_tables = torch.tensor(tables, dtype=torch.long, device=dev)
        seq_lens = torch.tensor(seq_lens_list, dtype=torch.long, device=dev)
        if self.decode_op is None and mask:  # the compiled kernel reads seq_lens instead
            span = torch.arange(max_blocks * bs, device=dev)
            past_end = span.unsqueeze(0) >= seq_lens.unsqueeze(1)  # [D, L]
            decode_bias = torch.zeros(past_end.shape, device=dev)
            decode_bias = decode_bias.masked_fill_(past_end, -torch.inf).unsqueeze(1)
        else:
            decode_bias = torch.zeros((0, 1, 0), device=dev)
        window_bias = None
        if self.window is not None and max(seq_lens_list) > self.window:
            span = torch.arange(max_blocks * bs, device=dev).unsqueeze(0)  # [1, L]
            ends = seq_lens.unsqueeze(1)  # [D, 1]
            outside = (span >= ends) | (span < ends - self.window)
            window_bias = torch.zeros(outside.shape, device=dev).masked_fill_(outside, -torch.inf)
            window_bias = window_bias.unsqueeze(1)
        return decode_tables, seq_lens, decode_bias, window_bias
