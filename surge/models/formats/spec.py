"""The shape of a decoder-only transformer, read from an HF config.json or GGUF metadata."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from surge.models.formats.gguf_file import GGUFSource

SUPPORTED_ARCHITECTURES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "smollm3",
    "granite",
    "phi3",
    "gemma3",
)
ROPE_SCALING_KINDS = ("linear", "dynamic", "llama3", "yarn", "longrope")

_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "SmolLM3ForCausalLM": "smollm3",
    "GraniteForCausalLM": "granite",
    "Phi3ForCausalLM": "phi3",
    "Gemma3ForCausalLM": "gemma3",
}
_HF_MODEL_TYPES = {"gemma3_text": "gemma3"}
# Gemma 3: every 6th layer attends to the whole context, the others to a sliding window, with
# RoPE at a base of their own (llama.cpp fixes both for GGUFs, which do not store them).
GEMMA3_GLOBAL_EVERY = 6
# SmolLM3: every 4th layer has no RoPE (llama.cpp fixes the step for GGUFs, which do not store it).
SMOLLM3_NO_ROPE_EVERY = 4
GEMMA3_LOCAL_ROPE_THETA = 10000.0
SLIDING, FULL = "sliding_attention", "full_attention"
# Llama 3.1's original context; a GGUF keeps only the rope_freqs tensor derived from it.
_LLAMA3_ORIGINAL_CONTEXT = 8192


@dataclass(frozen=True, slots=True)
class RopeScaling:
    kind: str  # one of ROPE_SCALING_KINDS
    factor: float
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attn_factor: float | None = None  # yarn mscale override; longrope's attention factor
    # longrope (Phi-3): per-frequency divisors below and from the original context length
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ROPE_SCALING_KINDS:
            raise ValueError(
                f"unsupported rope scaling type {self.kind!r}; supported: {ROPE_SCALING_KINDS}"
            )
        if not self.factor > 0:
            raise ValueError(f"rope scaling factor must be > 0, got {self.factor}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    architecture: str  # one of SUPPORTED_ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections have biases (Qwen2)
    sliding_window: int | None = None  # the window of layers whose type is SLIDING
    # Gemma 3's departures from Llama; the defaults are Llama's.
    layer_types: tuple[str, ...] = ()  # per layer SLIDING or FULL; () : all FULL
    rope_local_theta: float | None = None  # RoPE base of SLIDING layers (no scaling there)
    hidden_act: str = "silu"  # of the gated MLP: "silu" or "gelu_tanh"
    qk_norm: bool = False  # RMSNorm on each head's q and k before RoPE
    sandwich_norm: bool = False  # RMSNorm on the attention's and the MLP's outputs too
    embed_scale: float = 1.0  # embeddings are multiplied by this (Gemma: sqrt(hidden))
    attn_scale: float | None = None  # None: head_dim ** -0.5
    no_rope_layers: tuple[int, ...] = ()  # layers whose attention has no RoPE (SmolLM3)
    residual_scale: float = 1.0  # each block's output is scaled by this before the residual
    logit_scale: float = 1.0  # logits are divided by this (Granite's logits_scaling)
    rotary_dim: int = 0  # RoPE on the first rotary_dim of each head (Phi-4-mini); 0: all

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"unsupported activation {self.hidden_act!r}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"{len(self.layer_types)} layer types for {self.num_layers} layers")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer` (None: it attends to the whole context)."""
        if self.layer_types and self.layer_types[layer] == SLIDING:
            return self.sliding_window
        return None

    @property
    def llama_block(self) -> bool:
        """Whether every layer is a plain Llama block (what the fused CPU decode stack runs)."""
        return (
            not self.qk_norm
            and not self.sandwich_norm
            and self.hidden_act == "silu"
            and self.embed_scale == 1.0
            and self.attn_scale is None
            and all(t == FULL for t in self.layer_types)
            and not self.no_rope_layers
            and self.residual_scale == 1.0
            and self.rotary_dim in (0, self.head_dim)
        )

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelSpec:
        """Spec from a transformers config.json (Llama, Mistral, Qwen2/3, SmolLM3 or Gemma 3)."""
        arch = _hf_architecture(cfg)
        if arch == "gemma3":
            return _gemma3_from_hf(cfg)
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        # transformers >= 5 nests theta and scaling under "rope_parameters".
        rope_params: dict[str, Any] = cfg.get("rope_parameters") or {}
        theta = cfg.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or rope_params
        sliding = cfg.get("sliding_window")
        if arch in ("qwen2", "qwen3", "smollm3") and not cfg.get("use_sliding_window", False):
            sliding = None  # their configs carry a window they do not use
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        partial = float(
            rope_params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        )
        extras: dict[str, Any] = {"rotary_dim": int(head_dim * partial) if partial != 1 else 0}
        if arch == "phi3" and sliding:  # Phi-3: every layer attends to the window
            extras["layer_types"] = (SLIDING,) * int(cfg["num_hidden_layers"])
        if arch == "smollm3":
            extras["no_rope_layers"] = _hf_no_rope_layers(cfg)
        if arch == "granite":
            extras |= _granite_from_hf(cfg)
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=_hf_rope_scaling(scaling, cfg),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            sliding_window=int(sliding) if sliding else None,
            qk_norm=arch == "qwen3",  # Qwen3: RMSNorm on each head's q and k before RoPE
            **extras,
        )

    @classmethod
    def from_gguf(cls, reader: GGUFSource) -> ModelSpec:
        """Spec from GGUF metadata ("{arch}.*" keys) and the tensors the file holds."""
        arch = str(_field(reader, "general.architecture"))
        if arch not in ("llama", "qwen2", "qwen3", "smollm3", "granite", "phi3", "gemma3"):
            raise ValueError(
                f"unsupported GGUF architecture {arch!r}; supported: llama (incl. Mistral), "
                "qwen2, qwen3, smollm3, granite, phi3, gemma3"
            )
        tensors = {t.name: t for t in reader.tensors}

        def key(name: str, default: Any = None) -> Any:
            return _field(reader, f"{arch}.{name}", default)

        hidden = int(key("embedding_length"))
        heads = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", hidden // heads))
        rot_dim = int(key("rope.dimension_count", head_dim))
        vocab = key("vocab_size")
        if vocab is None:
            vocab = len(_field(reader, "tokenizer.ggml.tokens", []))
        name = str(_field(reader, "general.name", "")).lower()
        # llama.cpp stores Mistral under the llama architecture; only the name tells them apart.
        spec_arch = "mistral" if arch == "llama" and "mistral" in name else arch
        rope_freqs = tensors.get("rope_freqs.weight")
        sliding = key("attention.sliding_window")
        gemma: dict[str, Any] = {
            "qk_norm": "blk.0.attn_q_norm.weight" in tensors,
            "rotary_dim": rot_dim if rot_dim != head_dim else 0,
        }
        if arch == "phi3" and sliding:  # every layer attends to the window
            gemma["layer_types"] = (SLIDING,) * int(key("block_count"))
        if arch == "smollm3":
            gemma["no_rope_layers"] = _every(int(key("block_count")), SMOLLM3_NO_ROPE_EVERY)
        if arch == "granite":
            gemma |= {
                "embed_scale": _f32(key("embedding_scale", 1.0)),
                "attn_scale": _f32(key("attention.scale", head_dim**-0.5)),
                "residual_scale": _f32(key("residual_scale", 1.0)),
                "logit_scale": _f32(key("logit_scale", 1.0)),
            }
        if arch == "gemma3":
            layers = int(key("block_count"))
            gemma = _gemma3_extras(
                hidden,
                _gemma3_pattern(layers, GEMMA3_GLOBAL_EVERY),
                GEMMA3_LOCAL_ROPE_THETA,
                # llama.cpp: Gemma 3 27B scales queries by hidden / heads, the others by head_dim.
                query_scalar=hidden // heads if layers == 62 else head_dim,
            )
        return cls(
            architecture=spec_arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=heads,
            num_kv_heads=int(key("attention.head_count_kv", heads)),
            head_dim=head_dim,
            rms_norm_eps=_f32(key("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=_f32(key("rope.freq_base", 10000.0)),
            rope_scaling=_gguf_rope_scaling(reader, arch, rope_freqs, head_dim),
            max_position_embeddings=int(key("context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensors,
            attention_bias="blk.0.attn_q.bias" in tensors,
            sliding_window=int(sliding) if sliding else None,
            **gemma,
        )


def _granite_from_hf(cfg: dict[str, Any]) -> dict[str, Any]:
    """Granite's four multipliers (each 1.0 in a plain Llama)."""
    for bias in ("attention_bias", "mlp_bias"):
        if cfg.get(bias):
            raise ValueError(f"Granite with {bias} is not supported")
    return {
        "embed_scale": float(cfg.get("embedding_multiplier", 1.0)),
        "attn_scale": float(cfg.get("attention_multiplier", 1.0)),
        "residual_scale": float(cfg.get("residual_multiplier", 1.0)),
        "logit_scale": float(cfg.get("logits_scaling", 1.0)),
    }


def _every(layers: int, step: int) -> tuple[int, ...]:
    """Layers step - 1, 2 * step - 1, ...: every `step`-th layer."""
    return tuple(i for i in range(layers) if (i + 1) % step == 0)


def _hf_no_rope_layers(cfg: dict[str, Any]) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: `no_rope_layers` holds 1 where a layer uses RoPE."""
    flags = cfg.get("no_rope_layers")
    if flags:
        return tuple(i for i, use in enumerate(flags) if not use)
    step = int(cfg.get("no_rope_layer_interval") or SMOLLM3_NO_ROPE_EVERY)
    return _every(int(cfg["num_hidden_layers"]), step)


def _gemma3_pattern(layers: int, every: int) -> tuple[str, ...]:
    return tuple(FULL if (i + 1) % every == 0 else SLIDING for i in range(layers))


def _gemma3_extras(
    hidden: int,
    layer_types: tuple[str, ...],
    local_theta: float,
    query_scalar: float,
) -> dict[str, Any]:
    return {
        "layer_types": layer_types,
        "rope_local_theta": local_theta,
        "hidden_act": "gelu_tanh",
        "qk_norm": True,
        "sandwich_norm": True,
        "embed_scale": math.sqrt(hidden),
        "attn_scale": float(query_scalar) ** -0.5,
    }


def _gemma3_from_hf(cfg: dict[str, Any]) -> ModelSpec:
    """Gemma 3's text model (Gemma3ForCausalLM); its norms hold w for a (1 + w) scale, which
    the safetensors loader folds in."""
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if cfg.get(cap) is not None:
            raise ValueError(f"Gemma with {cap} (Gemma 2) is not supported")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported Gemma activation {act!r}")
    layers = int(cfg["num_hidden_layers"])
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or 256)
    types = cfg.get("layer_types")
    pattern = (
        tuple(str(t) for t in types)
        if types
        else _gemma3_pattern(layers, int(cfg.get("sliding_window_pattern", GEMMA3_GLOBAL_EVERY)))
    )
    # transformers >= 5 keeps RoPE per layer type under "rope_parameters".
    rope = cfg.get("rope_parameters") or {}
    full, local = rope.get(FULL) or rope, rope.get(SLIDING) or {}
    theta = cfg.get("rope_theta", full.get("rope_theta", 1_000_000.0))
    local_theta = cfg.get("rope_local_base_freq", local.get("rope_theta", GEMMA3_LOCAL_ROPE_THETA))
    sliding = cfg.get("sliding_window")
    extras = _gemma3_extras(
        hidden, pattern, float(local_theta), float(cfg.get("query_pre_attn_scalar") or head_dim)
    )
    return ModelSpec(
        architecture="gemma3",
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=_hf_rope_scaling(cfg.get("rope_scaling") or full),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        sliding_window=int(sliding) if sliding else None,
        **extras,
    )


def _hf_architecture(cfg: dict[str, Any]) -> str:
    names = cfg.get("architectures") or []
    for name in names:
        if name in _HF_ARCHITECTURES:
            return _HF_ARCHITECTURES[name]
    model_type = cfg.get("model_type")
    if not names and model_type in _HF_MODEL_TYPES:
        return _HF_MODEL_TYPES[model_type]
    if not names and model_type in SUPPORTED_ARCHITECTURES:
        return str(model_type)
    raise ValueError(
        f"unsupported architecture {names or model_type!r}; "
        f"supported: {', '.join(_HF_ARCHITECTURES)}"
    )


def _hf_rope_scaling(raw: dict[str, Any], cfg: dict[str, Any] | None = None) -> RopeScaling | None:
    kind = raw.get("rope_type", raw.get("type"))
    if kind in (None, "default", "none"):
        return None
    cfg = cfg or {}
    orig = raw.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    if kind in ("longrope", "su"):  # Phi-3's: its factor is the ratio of the two lengths
        if orig is None:
            raise ValueError("longrope needs original_max_position_embeddings")
        factor = raw.get("factor") or int(cfg.get("max_position_embeddings", orig)) / int(orig)
        return RopeScaling(
            kind="longrope",
            factor=float(factor),
            original_max_position_embeddings=int(orig),
            attn_factor=_opt_float(raw.get("attention_factor")),
            short_factor=tuple(float(x) for x in raw["short_factor"]),
            long_factor=tuple(float(x) for x in raw["long_factor"]),
        )
    return RopeScaling(
        kind=str(kind),
        factor=float(raw["factor"]),
        original_max_position_embeddings=int(orig) if orig is not None else None,
        low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
        high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
        beta_fast=float(raw.get("beta_fast", 32.0)),
        beta_slow=float(raw.get("beta_slow", 1.0)),
        attn_factor=_opt_float(raw.get("attention_factor")),
    )


def _gguf_rope_scaling(
    reader: GGUFSource, arch: str, rope_freqs: Any, head_dim: int
) -> RopeScaling | None:
    def key(name: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.rope.scaling.{name}", default)

    kind = key("type")
    factor = key("factor")
    orig = key("original_context_length")
    long, short = (
        _tensor(reader, "rope_factors_long.weight"),
        _tensor(reader, "rope_factors_short.weight"),
    )
    if long is not None and short is not None and orig:  # Phi-3's LongRoPE
        context = int(_field(reader, f"{arch}.context_length", orig))
        return RopeScaling(
            kind="longrope",
            factor=context / int(orig),
            original_max_position_embeddings=int(orig),
            attn_factor=_opt_float(key("attn_factor")),
            short_factor=tuple(float(x) for x in short),
            long_factor=tuple(float(x) for x in long),
        )
    if kind in ("linear", "yarn") and factor:
        return RopeScaling(
            kind=str(kind),
            factor=_f32(factor),
            original_max_position_embeddings=int(orig) if orig else None,
            beta_fast=float(key("yarn_beta_fast", 32.0)),
            beta_slow=float(key("yarn_beta_slow", 1.0)),
            attn_factor=_opt_float(key("yarn_attn_factor", key("attn_factor"))),
        )
    if kind not in (None, "none", "linear", "yarn"):
        raise ValueError(f"unsupported GGUF rope scaling type {kind!r}")
    if rope_freqs is None:
        return None
    return _llama3_from_rope_freqs(reader, arch, rope_freqs, head_dim)


def _tensor(reader: GGUFSource, name: str) -> np.ndarray | None:
    """A small tensor's values as float64 (None when the file has none by that name)."""
    found = next((t for t in reader.tensors if t.name == name), None)
    if found is None:
        return None
    values = gguf.quants.dequantize(found.data, found.tensor_type)
    return np.asarray(values).reshape(-1).astype(np.float64)


def _llama3_from_rope_freqs(
    reader: GGUFSource, arch: str, rope_freqs: Any, head_dim: int
) -> RopeScaling:
    """Llama 3.1 GGUFs store only the per-frequency divisors; match them to llama3 scaling."""
    divisors = np.asarray(gguf.quants.dequantize(rope_freqs.data, rope_freqs.tensor_type))
    divisors = divisors.reshape(-1).astype(np.float64)
    theta = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    scaling = RopeScaling(
        kind="llama3",
        factor=float(divisors.max()),
        original_max_position_embeddings=_LLAMA3_ORIGINAL_CONTEXT,
    )
    expected = _llama3_divisors(scaling, theta, head_dim)
    if expected.shape != divisors.shape or not np.allclose(expected, divisors, rtol=1e-3):
        raise ValueError("GGUF rope_freqs tensor does not match Llama 3 rope scaling (defaults)")
    return scaling


def _llama3_divisors(scaling: RopeScaling, theta: float, head_dim: int) -> np.ndarray:
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    orig = float(scaling.original_max_position_embeddings or 8192)
    wavelen = 2 * math.pi / inv_freq
    smooth = (orig / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    mid = 1.0 / ((1 - smooth) / scaling.factor + smooth)
    out = np.where(wavelen < orig / scaling.high_freq_factor, 1.0, mid)
    return np.where(wavelen > orig / scaling.low_freq_factor, scaling.factor, out)


def _f32(value: Any) -> float:
    # GGUF stores float32: take its shortest decimal (1e-05, not 9.999999747378752e-06), the
    # value the original config.json held.
    return float(str(np.float32(value)))


def _opt_float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _field(reader: GGUFSource, name: str, default: Any = None) -> Any:
    field = reader.get_field(name)
    if field is None:
        return default
    return field.contents()
