"""A decode step's decoder layers as one compiled call, for 4-bit and GGUF-block models on CPU.

`kernels/q4_decode.cpp` runs every layer of a decode step inside one OpenMP region (no
dispatcher call, fork/join or tensor allocation per op); the embedding, the final norm and the
LM head stay the model's own. Up to Q4_MAX_ROWS requests its projections read the 4-bit
weights; larger steps (up to `max_rows`) take the layers' int8 copies through the packed W8A8
GEMM, when the model holds them packed (CPU kernels with AVX-512 VNNI). Without them (AVX2)
every step up to Q4_ONLY_MAX_ROWS reads the 4-bit weights, 8 rows a pass. Prefill chunks
join as rows of their own, one per token: the stack writes every row's K/V before any row
attends, so a row that attends up to its own position is causal attention. The layer-by-layer
path (eager or compiled) serves everything else: larger steps and chunks, other quantizations
and devices.

A projection may also be a GGUF matrix on the file's own blocks (GGUFLinear: Q4_K, Q5_K, Q6_K,
Q8_0, Q4_0, Q4_1; GGUFSegments: a fused q/k/v or gate/up of several types), run by the same
kernels as GGUFLinear inside the stack's region (kernels/gguf_segments.h), so a Q4_K_M file's
layers, 4-bit and 6-bit mixed, take the stack too. Such a model has no int8 copies: every step
up to Q4_ONLY_MAX_ROWS runs on the blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from surge.models.attention import AttnMetadata
from surge.models.gguf_linear import GGUFLinear, GGUFSegments
from surge.models.kernels import load_q4_decode
from surge.models.llama import DecoderLayer, LlamaForCausalLM
from surge.models.lora import LoRAModel
from surge.models.q4 import Q4Linear

log = logging.getLogger(__name__)
GgufParts = list[tuple[int, Tensor]]  # a GGUF projection's (GGML type, blocks) segments

# Up to this many rows the stack's projections read the 4-bit weights, past it the int8 copies.
# Engine steps, one against the other (SmolLM2, ~100-token requests, 6 alternating rounds):
# the 4-bit weights 1.30x at 2 requests and 1.34x at 3; the int8 copies 1.05x at 4, 1.34x at
# 8 and 1.75x at 16 (the 4-bit kernel is compute-bound past a few rows, the packed GEMM is not
# bound by memory until then).
Q4_MAX_ROWS = 3
# Without int8 copies (no AVX-512 VNNI): the largest step the stack takes on the 4-bit weights.
Q4_ONLY_MAX_ROWS = 1024
# Prefill chunks join a step as rows of their own (StepInputBuilder.build, chunks_as_rows), any
# chunk that fits the step: the stack beat the layer-by-layer path at every chunk measured, 16
# to 511 tokens, on the 4-bit weights alone (AVX2: 0.50-0.83x the step time) and with the int8
# copies (AVX-512 VNNI: 63 decodes + 64 to 511 tokens 0.73-0.82x, 1 + 128 0.65x), and matched
# or beat it on the last chunks of a 4096-token prompt (BENCHMARKS.md, tenth and fourteenth
# passes).


class FusedQ4Decode:
    """Calls the compiled stack on prepared decode-step tensors; build() it for a model.

    Batch invariance: the stack's 4-bit path (a few rows) and its int8 path (more) round
    differently, so a request's tokens depend on how many rows share its steps. `invariant`
    is a second stack over the same weights and caches that takes every step on the int8
    copies (exact integer sums, activations quantized per row: a row's numbers are the same
    at 1 and N rows); None where the model has no int8 copies (AVX2: every step reads the
    4-bit weights, 8 rows a pass, already one kernel for all sizes)."""

    def __init__(self, model: LlamaForCausalLM, stack: Any, invariant: Any = None) -> None:
        self.model = model
        self.stack = stack
        self.invariant = invariant
        self.dtype = model.norm.weight.dtype
        self.max_rows: int = stack.max_rows  # the largest step it takes
        self.max_chunk = self.max_rows  # the longest prefill chunk it takes along with others
        self.has_lora = False
        self._no_slots = torch.empty(0, dtype=torch.long)

    def set_lora(self, lora: LoRAModel) -> None:
        """Run LoRA adapters' rows too: the stack reads the wrappers' float32 slots in place."""
        tensors: list[Tensor] = []
        for i in range(len(self.model.layers)):
            for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
                wrapped = lora.layers[(i, name)]
                tensors += [wrapped.lora_a, wrapped.lora_bt]
        self.stack.set_lora(tensors, lora.max_rank)
        if self.invariant is not None:
            self.invariant.set_lora(tensors, lora.max_rank)
        self.has_lora = True

    @classmethod
    def build(
        cls,
        model: LlamaForCausalLM,
        kv_caches: Sequence[tuple[Tensor, Tensor]],
        q4_max_rows: int | None = None,
        batch_invariant: bool = False,
    ) -> FusedQ4Decode | None:
        """The fused path for this model and cache, or None where it does not apply (not all
        projections 4-bit or GGUF blocks with kernels, neither AVX-512 VNNI nor AVX2, an
        unsupported head size or cache). q4_max_rows: the most rows on the 4-bit weights
        (default Q4_MAX_ROWS with int8 copies, else Q4_ONLY_MAX_ROWS). batch_invariant: also
        the `invariant` stack (every step on the int8 copies) where there are int8 copies."""
        weights: list[Tensor] = []
        int8: list[Tensor] = []  # the int8 copies, packed, when every projection has one
        gguf: list[GgufParts] = []  # per projection its GGUF segments ([] for a 4-bit one)
        for layer in model.layers:
            assert isinstance(layer, DecoderLayer)
            attn, mlp = layer.self_attn, layer.mlp
            projs = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            parts = [_gguf_parts(p, bias_ok=i == 0) for i, p in enumerate(projs)]
            if not all(
                (isinstance(p, Q4Linear) and p.kernels) or g
                for p, g in zip(projs, parts, strict=True)
            ):
                return None
            qkv, o, gate_up, down = projs
            bias = qkv.bias
            weights += [layer.input_layernorm.weight, *_q4_arrays(qkv)]
            weights.append(bias if bias is not None else torch.empty(0))
            weights += [*_q4_arrays(o), layer.post_attention_layernorm.weight]
            weights += [*_q4_arrays(gate_up), *_q4_arrays(down)]
            gguf += parts
            for p in projs:
                if isinstance(p, Q4Linear) and p.int8 is not None and p.int8.packed:
                    int8 += [p.int8.weight, p.int8.scale, p.int8.wsum]  # q4-int8's copies
        if len(int8) != 12 * len(model.layers):
            int8 = []
        if not any(gguf):
            gguf = []  # all 4-bit
        if q4_max_rows is None:
            q4_max_rows = Q4_MAX_ROWS if int8 else Q4_ONLY_MAX_ROWS
        if not kv_caches or kv_caches[0][0].device.type != "cpu":
            return None
        module = load_q4_decode()
        if module is None or not module.supported:
            return None
        spec = model.spec

        def make(max_q4_rows: int) -> Any:
            return module.Q4DecodeStack(
                [w.detach() for w in weights],
                int8,
                [k for k, _ in kv_caches],
                [v for _, v in kv_caches],
                model.rotary.cos,
                model.rotary.sin,
                spec.num_heads,
                spec.num_kv_heads,
                spec.rms_norm_eps,
                max_q4_rows,
                gguf,
            )

        try:
            stack = make(q4_max_rows)
            invariant = make(0) if batch_invariant and int8 else None
        except RuntimeError as e:  # a shape or dtype the stack does not take: layer by layer
            log.info("fused 4-bit decode not used: %s", e)
            return None
        return cls(model, stack, invariant)

    def __call__(
        self,
        ids: Tensor,
        positions: Tensor,
        attn: AttnMetadata,
        row_slots: Tensor | None = None,
        invariant: bool = False,
        num_decodes: int = -1,
    ) -> Tensor:
        """A step of at most `max_rows` rows, each a decode (a prefill chunk's tokens described
        as decodes) -> logits [num_sampled, vocab] float32. row_slots: each row's LoRA slot
        (-1: none), after set_lora. invariant: on the batch-invariant stack, where built.
        num_decodes: the rows before it are decodes, the rest prefill chunks' rows, which the
        stack attends in tiles where it can (-1: every row attended alone)."""
        stack = self.invariant if invariant and self.invariant is not None else self.stack
        x = self.model.embed_tokens(ids)  # [rows, hidden]
        with torch.profiler.record_function("fused decode stack"):
            h = stack.forward(
                x,
                positions,
                attn.slot_mapping,
                attn.decode_block_tables,
                attn.decode_seq_lens,
                self._no_slots if row_slots is None else row_slots,
                num_decodes,
            )  # [rows, hidden] float32, after the last layer
        h = self.model.norm(h[attn.logits_indices].to(self.dtype))
        return self.model.compute_logits(h)


def _gguf_parts(proj: Any, bias_ok: bool) -> GgufParts:
    """A GGUF projection's segments for the stack ([] where it is none, or has a bias the
    stack does not add: only q/k/v's is)."""
    if isinstance(proj, GGUFLinear):
        parts = [proj]
    elif isinstance(proj, GGUFSegments):
        parts = proj.segments()
    else:
        return []
    if not proj.kernels or (proj.bias is not None and not bias_ok):
        return []
    return [(p.qtype, p.blocks) for p in parts]


def _q4_arrays(proj: Any) -> tuple[Tensor, Tensor]:
    """A 4-bit projection's (qs, dm); empty tensors for a GGUF one (its segments instead)."""
    if isinstance(proj, Q4Linear):
        return proj.qs, proj.dm
    return torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.float16)
