"""Building blocks of Llama-family networks: RMSNorm, rotary embeddings with scaling, gated MLP."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from surge.models.formats.spec import RopeScaling


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # [num_tokens, hidden]
        # Variance in float32 as HF does, so low-precision runs stay close to the reference.
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class GatedMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (GeGLU with act "gelu_tanh": Gemma), with gate and up
    fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str = "silu") -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.act = act
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj(x)  # [num_tokens, 2 * intermediate]
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        act = F.silu(gate) if self.act == "silu" else F.gelu(gate, approximate="tanh")
        return self.down_proj(act * up)


def rope_inv_freq(
    head_dim: int, theta: float, scaling: RopeScaling | None, max_position: int
) -> tuple[Tensor, float]:
    """Inverse frequencies [head_dim // 2] and the attention scale factor for cos/sin (yarn)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq, 1.0
    kind, factor = scaling.kind, scaling.factor
    original = scaling.original_max_position_embeddings or max_position
    if kind == "linear":
        return (inv_freq / factor).float(), 1.0
    if kind == "dynamic":
        # NTK-aware scaling fixed at the longest supported length (as vLLM): cached K stays valid.
        seq_len = original * factor
        base = theta * ((factor * seq_len / original) - (factor - 1)) ** (head_dim / (head_dim - 2))
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        return inv.float(), 1.0
    if kind == "llama3":
        low_wavelen = original / scaling.low_freq_factor
        high_wavelen = original / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        smooth = (original / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return torch.where(mid, blended, scaled).float(), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, theta, scaling, original)
    if kind == "longrope":
        return _longrope_inv_freq(head_dim, theta, scaling.short_factor, scaling, original)
    raise ValueError(f"unsupported rope scaling type {kind!r}")


def _longrope_inv_freq(
    head_dim: int, theta: float, factors: Sequence[float], scaling: RopeScaling, original: int
) -> tuple[Tensor, float]:
    """Phi-3's LongRoPE: each frequency divided by its own factor, and one attention factor."""
    if len(factors) != head_dim // 2:
        raise ValueError(f"longrope has {len(factors)} factors for {head_dim // 2} frequencies")
    shape = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv = 1.0 / (torch.tensor(factors, dtype=torch.float32) * theta**shape)
    mscale = scaling.attn_factor
    if mscale is None:
        factor = scaling.factor
        mscale = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0
    return inv, mscale


def _yarn_inv_freq(
    inv_freq: Tensor, head_dim: int, theta: float, scaling: RopeScaling, original: int
) -> tuple[Tensor, float]:
    def correction_dim(num_rotations: float) -> float:
        return (head_dim * math.log(original / (num_rotations * 2 * math.pi))) / (
            2 * math.log(theta)
        )

    low = max(math.floor(correction_dim(scaling.beta_fast)), 0)
    high = min(math.ceil(correction_dim(scaling.beta_slow)), head_dim - 1)
    if low == high:
        high += 1  # avoid a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    interpolated = inv_freq / scaling.factor
    inv = interpolated * (1 - extrapolation) + inv_freq * extrapolation
    mscale = (
        scaling.attn_factor
        if scaling.attn_factor is not None
        else (0.1 * math.log(scaling.factor) + 1.0 if scaling.factor > 1 else 1.0)
    )
    return inv.float(), mscale


class RotaryEmbedding(nn.Module):
    """Neox-style (rotate-half) rotary embedding with a precomputed cos/sin table, over the
    first `rotary_dim` of each head (the rest passes through: partial rotary).

    LongRoPE's two sets of factors go by position: the short ones below the original context
    length, the long ones from it on. transformers switches a whole sequence to the long ones
    once it outgrows the original length (re-rotating its cached keys); a row per position keeps
    each token's keys as they were cached, whatever the batch, and equals transformers up to
    the original length."""

    cos: Tensor  # [max_position, rotary_dim]
    sin: Tensor

    def __init__(
        self, rotary_dim: int, theta: float, scaling: RopeScaling | None, max_position: int
    ) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        # On the CPU even inside a meta-device build (whose tables build_rotary makes again):
        # arithmetic on meta tensors imports torch._dynamo, a second of every engine start.
        with torch.device("cpu"):
            self._build(theta, scaling, max_position)

    def _build(self, theta: float, scaling: RopeScaling | None, max_position: int) -> None:
        rotary_dim = self.rotary_dim
        inv_freq, mscale = rope_inv_freq(rotary_dim, theta, scaling, max_position)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # [max_position, rotary_dim // 2]
        if scaling is not None and scaling.kind == "longrope":
            original = scaling.original_max_position_embeddings or max_position
            long_inv, _ = _longrope_inv_freq(
                rotary_dim, theta, scaling.long_factor, scaling, original
            )
            far = (t >= original).unsqueeze(1)
            freqs = torch.where(far, torch.outer(t, long_inv), freqs)
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_position, rotary_dim]
        self.register_buffer("cos", emb.cos() * mscale, persistent=False)
        self.register_buffer("sin", emb.sin() * mscale, persistent=False)

    def forward(self, positions: Tensor, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        # q: [num_tokens, heads, head_dim], k: [num_tokens, kv_heads, head_dim]
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)  # [num_tokens, 1, rotary_dim]
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        r = self.rotary_dim
        if r < q.shape[-1]:
            q_rot, k_rot = q[..., :r], k[..., :r]
            q_rot = q_rot * cos + _rotate_half(q_rot) * sin
            k_rot = k_rot * cos + _rotate_half(k_rot) * sin
            return torch.cat((q_rot, q[..., r:]), -1), torch.cat((k_rot, k[..., r:]), -1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
