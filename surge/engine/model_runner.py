"""Turns a SchedulerOutput into tensors, runs the model, samples."""

from __future__ import annotations

import torch
from torch import Tensor

from surge.engine.batch import SampledToken, SampledTokens, ScheduledRequest, SchedulerOutput
from surge.engine.sampler import Sampler, SamplingRow
from surge.models.attention import AttnMetadata, PrefillChunk
from surge.models.kernels import load_paged_decode
from surge.models.llama import LlamaForCausalLM


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[tuple[Tensor, Tensor]],
        sampler: Sampler,
        device: torch.device,
        block_size: int,
        use_kernels: bool = True,
    ) -> None:
        self.model = model
        self.decode_op = None
        if use_kernels and device.type == "cpu":
            module = load_paged_decode()
            self.decode_op = module.paged_decode if module is not None else None
        self.kv_caches = kv_caches
        self.sampler = sampler
        self.device = device
        self.block_size = block_size

    @torch.inference_mode()
    def run(self, batch: SchedulerOutput) -> SampledTokens:
        if batch.is_empty:
            return SampledTokens({})
        input_ids, positions, attn, sample_reqs = self.prepare(batch)
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

    def prepare(
        self, batch: SchedulerOutput
    ) -> tuple[Tensor, Tensor, AttnMetadata, list[ScheduledRequest]]:
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
        if decodes:
            max_blocks = max(len(r.block_table) for r in decodes)
            tables = [
                list(r.block_table) + [0] * (max_blocks - len(r.block_table)) for r in decodes
            ]
            decode_tables = torch.tensor(tables, dtype=torch.long, device=dev)
            seq_lens = torch.tensor([r.start_pos + 1 for r in decodes], device=dev)
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
            num_decodes=len(decodes),
            decode_block_tables=decode_tables,
            decode_seq_lens=seq_lens,
            decode_bias=decode_bias,
            prefills=tuple(chunks),
            logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=dev),
            kv_caches=self.kv_caches,
            decode_op=self.decode_op,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos_t = torch.tensor(positions, dtype=torch.long, device=dev)
        return ids, pos_t, attn, sample_reqs
