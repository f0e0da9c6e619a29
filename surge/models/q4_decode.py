"""A decode step's decoder layers as one compiled call, for 4-bit models on CPU.

`kernels/q4_decode.cpp` runs every layer of a step of up to MAX_ROWS decodes inside one
OpenMP region (no dispatcher call, fork/join or tensor allocation per op); the embedding, the
final norm and the LM head stay the model's own. The layer-by-layer path (eager or compiled)
serves everything else: prefill chunks, larger batches, other quantizations and devices.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from surge.models.attention import AttnMetadata
from surge.models.kernels import load_q4_decode
from surge.models.llama import DecoderLayer, LlamaForCausalLM
from surge.models.q4 import Q4Linear

log = logging.getLogger(__name__)

# Decode steps of up to this many requests take the stack. Engine steps against the compiled
# layer-by-layer path (4-bit up to 8 rows, int8 W8A8 past that), 256 tokens per request:
# 1.23x at 1 request, 1.12x at 4, 1.08x at 8 and 12, 1.03x at 16, 0.85x at 24 (the 4-bit
# kernel is compute-bound there, where W8A8 is faster).
MAX_ROWS = 16


class FusedQ4Decode:
    """Calls the compiled stack on prepared decode-step tensors; build() it for a model."""

    def __init__(self, model: LlamaForCausalLM, stack: Any) -> None:
        self.model = model
        self.stack = stack
        self.dtype = model.norm.weight.dtype

    @classmethod
    def build(
        cls, model: LlamaForCausalLM, kv_caches: Sequence[tuple[Tensor, Tensor]]
    ) -> FusedQ4Decode | None:
        """The fused path for this model and cache, or None where it does not apply (not all
        layers 4-bit with kernels, no AVX-512 VNNI, an unsupported head size or cache)."""
        weights: list[Tensor] = []
        for layer in model.layers:
            assert isinstance(layer, DecoderLayer)
            attn, mlp = layer.self_attn, layer.mlp
            qkv, o, gate_up, down = attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
            if not (
                isinstance(qkv, Q4Linear)
                and isinstance(o, Q4Linear)
                and isinstance(gate_up, Q4Linear)
                and isinstance(down, Q4Linear)
                and all(p.kernels for p in (qkv, o, gate_up, down))
            ):
                return None
            bias = qkv.int8.bias
            weights += [layer.input_layernorm.weight, qkv.qs, qkv.dm]
            weights.append(bias if bias is not None else torch.empty(0))
            weights += [o.qs, o.dm, layer.post_attention_layernorm.weight]
            weights += [gate_up.qs, gate_up.dm, down.qs, down.dm]
        if not kv_caches or kv_caches[0][0].device.type != "cpu":
            return None
        module = load_q4_decode()
        if module is None or not module.supported:
            return None
        spec = model.spec
        try:
            stack = module.Q4DecodeStack(
                [w.detach() for w in weights],
                [k for k, _ in kv_caches],
                [v for _, v in kv_caches],
                model.rotary.cos,
                model.rotary.sin,
                spec.num_heads,
                spec.num_kv_heads,
                spec.rms_norm_eps,
            )
        except RuntimeError as e:  # a shape or dtype the stack does not take: layer by layer
            log.info("fused 4-bit decode not used: %s", e)
            return None
        return cls(model, stack)

    def __call__(self, ids: Tensor, positions: Tensor, attn: AttnMetadata) -> Tensor:
        """A pure-decode step of at most MAX_ROWS rows -> logits [num_sampled, vocab] float32."""
        x = self.model.embed_tokens(ids)  # [rows, hidden]
        h = self.stack.forward(
            x, positions, attn.slot_mapping, attn.decode_block_tables, attn.decode_seq_lens
        )  # [rows, hidden] float32, after the last layer
        h = self.model.norm(h[attn.logits_indices].to(self.dtype))
        return self.model.compute_logits(h)
