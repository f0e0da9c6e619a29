"""A BERT encoder (the network of sentence-transformers' MiniLM, BGE and E5 models), one pass.

Post-LayerNorm blocks, learned absolute positions, exact-erf GELU, padding masked out of
attention. The weights are Hugging Face's `BertModel` names, read from a safetensors file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class BertSpec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> BertSpec:
        if config.get("model_type", "bert") != "bert":
            raise ValueError(f"not a BERT model: model_type {config.get('model_type')!r}")
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported activation {config['hidden_act']!r} (only gelu)")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        return cls(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            intermediate_size=config["intermediate_size"],
            max_positions=config["max_position_embeddings"],
            type_vocab_size=config.get("type_vocab_size", 2),
            layer_norm_eps=config.get("layer_norm_eps", 1e-12),
        )


class BertLayer(nn.Module):
    def __init__(self, spec: BertSpec) -> None:
        super().__init__()
        h, eps = spec.hidden_size, spec.layer_norm_eps
        self.num_heads = spec.num_heads
        self.qkv = nn.Linear(h, 3 * h)  # query, key and value fused: one GEMM instead of three
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=eps)
        self.up = nn.Linear(h, spec.intermediate_size)
        self.down = nn.Linear(spec.intermediate_size, h)
        self.out_norm = nn.LayerNorm(h, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.attn_norm(x + self.attn_out(a.transpose(1, 2).reshape(b, n, h)))
        return self.out_norm(x + self.down(F.gelu(self.up(x))))


class BertEncoder(nn.Module):
    def __init__(self, spec: BertSpec) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.word = nn.Embedding(spec.vocab_size, h)
        self.position = nn.Embedding(spec.max_positions, h)
        self.token_type = nn.Embedding(spec.type_vocab_size, h)
        self.embed_norm = nn.LayerNorm(h, eps=spec.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(spec) for _ in range(spec.num_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: [batch, seq] (mask 1 for tokens, 0 for padding) ->
        hidden states [batch, seq, hidden]. Segment ids are all 0 (one text per input)."""
        n = input_ids.shape[1]
        positions = torch.arange(n, device=input_ids.device)
        x = self.word(input_ids) + self.position(positions) + self.token_type.weight[0]
        x = self.embed_norm(x)
        # [batch, 1, 1, seq]: every query may attend to every real token, none to padding.
        mask = attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def load_hf_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face `BertModel` weights (with or without a `bert.` prefix) in."""
        t = {k.removeprefix("bert."): v for k, v in tensors.items()}
        own: dict[str, torch.Tensor] = {
            "word.weight": t["embeddings.word_embeddings.weight"],
            "position.weight": t["embeddings.position_embeddings.weight"],
            "token_type.weight": t["embeddings.token_type_embeddings.weight"],
            "embed_norm.weight": t["embeddings.LayerNorm.weight"],
            "embed_norm.bias": t["embeddings.LayerNorm.bias"],
        }
        for i in range(self.spec.num_layers):
            p = f"encoder.layer.{i}."
            s = f"{p}attention.self."
            for part in ("weight", "bias"):
                own[f"layers.{i}.qkv.{part}"] = torch.cat(
                    [t[f"{s}{name}.{part}"] for name in ("query", "key", "value")]
                )
                own[f"layers.{i}.attn_out.{part}"] = t[f"{p}attention.output.dense.{part}"]
                own[f"layers.{i}.attn_norm.{part}"] = t[f"{p}attention.output.LayerNorm.{part}"]
                own[f"layers.{i}.up.{part}"] = t[f"{p}intermediate.dense.{part}"]
                own[f"layers.{i}.down.{part}"] = t[f"{p}output.dense.{part}"]
                own[f"layers.{i}.out_norm.{part}"] = t[f"{p}output.LayerNorm.{part}"]
        self.load_state_dict(own, strict=True)
