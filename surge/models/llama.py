"""Llama-family causal LM written for paged attention.

One class serves Llama 2/3, SmolLM2, Mistral, Qwen2 (attention biases), Qwen3 (norms on q/k),
SmolLM3 (layers without RoPE), Granite (scaled embeddings, residuals and logits), Phi-3 (partial
RoPE, LongRoPE, a window on every layer) and Gemma 3 (norms on q/k and on each block's outputs,
GeGLU, scaled embeddings, sliding-window layers with a RoPE of their own) by `ModelSpec` flags.
Tokens of all requests in a step are flattened into one [num_tokens] batch: no padding.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from surge.models.attention import AttnMetadata, paged_attention
from surge.models.formats.spec import ModelSpec
from surge.models.layers import GatedMLP, RMSNorm, RotaryEmbedding
from surge.models.q4 import Q4Linear
from surge.models.quant import Int8Embedding, Int8Linear


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        # q, k and v fused into one matmul: one large GEMM beats three small ones on CPU.
        self.qkv_proj = nn.Linear(
            spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.attention_bias
        )
        self.o_proj = nn.Linear(self.q_size, spec.hidden_size, bias=False)
        self.scale = spec.attn_scale if spec.attn_scale is not None else spec.head_dim**-0.5
        self.window = spec.window(layer)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.rope = layer not in spec.no_rope_layers  # SmolLM3: some layers have none

    def forward(
        self, x: Tensor, positions: Tensor, rotary: RotaryEmbedding, attn: AttnMetadata
    ) -> Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # [num_tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(n, self.num_heads, self.head_dim)
        k = k.reshape(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q, k = rotary(positions, q, k)
        # [num_tokens, q_size]
        o = paged_attention(self.layer, q, k, v, attn, self.scale, window=self.window)
        return self.o_proj(o)


class DecoderLayer(nn.Module):
    """Pre-norm block. post_attention_layernorm is Llama's name for the norm before the MLP;
    Gemma's norms on the attention's and the MLP's outputs are post_attn_norm and post_mlp_norm."""

    def __init__(self, spec: ModelSpec, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, layer)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, spec.hidden_act)
        sandwich = spec.sandwich_norm
        self.post_attn_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps) if sandwich else None
        self.post_mlp_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps) if sandwich else None
        self.local_rope = spec.window(layer) is not None and spec.rope_local_theta is not None
        self.residual_scale = spec.residual_scale  # Granite; 1.0 elsewhere

    def forward(
        self, x: Tensor, positions: Tensor, rotary: RotaryEmbedding, attn: AttnMetadata
    ) -> Tensor:
        h = self.self_attn(self.input_layernorm(x), positions, rotary, attn)
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
        if self.residual_scale != 1.0:
            h = h * self.residual_scale
        x = x + h
        h = self.mlp(self.post_attention_layernorm(x))
        if self.post_mlp_norm is not None:
            h = self.post_mlp_norm(h)
        if self.residual_scale != 1.0:
            h = h * self.residual_scale
        return x + h


class LlamaForCausalLM(nn.Module):
    def __init__(self, spec: ModelSpec, max_position: int) -> None:
        super().__init__()
        self.spec = spec
        # nn.Embedding's random init (normal_) on the meta device imports torch._dynamo, a
        # second of every engine start that nothing else needs: given its weight, it skips it.
        weight = torch.empty(spec.vocab_size, spec.hidden_size)
        self.embed_tokens: nn.Module = nn.Embedding(
            spec.vocab_size, spec.hidden_size, _weight=weight
        )
        if not weight.is_meta:
            nn.init.normal_(self.embed_tokens.weight)  # the init it skipped
        self.layers = nn.ModuleList(DecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head: nn.Module | None = (
            None
            if spec.tie_word_embeddings
            else nn.Linear(spec.hidden_size, spec.vocab_size, False)
        )
        self.rotary = RotaryEmbedding(
            spec.rotary_dim or spec.head_dim, spec.rope_theta, spec.rope_scaling, max_position
        )
        self.local_rotary: RotaryEmbedding | None = None  # sliding layers' own RoPE (Gemma 3)

    def build_rotary(self, max_position: int, device: torch.device) -> None:
        """The cos/sin tables, float32 whatever the model's dtype (built after any cast)."""
        spec = self.spec
        rotary_dim = spec.rotary_dim or spec.head_dim
        self.rotary = RotaryEmbedding(
            rotary_dim, spec.rope_theta, spec.rope_scaling, max_position
        ).to(device)
        if spec.rope_local_theta is not None:
            self.local_rotary = RotaryEmbedding(
                rotary_dim, spec.rope_local_theta, None, max_position
            ).to(device)

    def forward(self, input_ids: Tensor, positions: Tensor, attn: AttnMetadata) -> Tensor:
        """input_ids, positions: [num_tokens] -> logits [num_sampled, vocab] at logits_indices."""
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        if self.spec.embed_scale != 1.0:
            # Gemma rounds the scale to the model's dtype before multiplying.
            x = x * torch.tensor(self.spec.embed_scale, dtype=x.dtype)
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            local = layer.local_rope and self.local_rotary is not None
            x = layer(x, positions, self.local_rotary if local else self.rotary, attn)
        # The final norm is per row, so only rows that sample need it.
        x = self.norm(x[attn.logits_indices])  # [num_sampled, hidden]
        return self.compute_logits(x)

    def compute_logits(self, x: Tensor) -> Tensor:  # [num_sampled, hidden] -> [.., vocab]
        logits = self._logits(x)
        if self.spec.logit_scale != 1.0:  # Granite divides its logits
            logits = logits / self.spec.logit_scale
        return logits

    def _logits(self, x: Tensor) -> Tensor:
        # float32 logits: the sampler works in fp32, and argmax over bf16 is ~2x slower on CPU.
        if isinstance(self.lm_head, (Int8Linear, Q4Linear)):  # float32 out: no bf16 pass
            return self.lm_head(x, torch.float32)
        if self.lm_head is not None:
            return self.lm_head(x).float()
        embed = self.embed_tokens
        if isinstance(embed, Int8Embedding):  # tied and quantized: the embedding's int8 rows
            return embed.head(x, torch.float32)
        assert isinstance(embed, nn.Embedding)
        return (x @ embed.weight.t()).float()
