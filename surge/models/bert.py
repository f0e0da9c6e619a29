"""A BERT encoder (the network of sentence-transformers' MiniLM, BGE and E5 models), one pass.

Post-LayerNorm blocks, learned absolute positions, exact-erf GELU. A batch runs packed (no
padding in the dense layers, which do nearly all the work); attention masks the padding. The
weights are Hugging Face's `BertModel` names, read from a safetensors file.
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


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """Inputs of unequal length packed end to end, with no padding: the dense layers (almost
    all of the work) see only real tokens; attention alone pads, each sequence to the longest."""

    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens], from 0 in each sequence
    seq_ids: torch.Tensor  # [tokens]: which sequence each token belongs to
    pad_index: torch.Tensor  # [tokens]: its row in the padded [batch * longest] layout
    mask: torch.Tensor  # [batch, 1, 1, longest] bool: True where a real token is
    lengths: torch.Tensor  # [batch]
    longest: int

    @classmethod
    def build(cls, batch: list[list[int]], device: torch.device) -> PackedBatch:
        lengths = torch.tensor([len(ids) for ids in batch], dtype=torch.long)
        longest = int(lengths.max())
        seq_ids = torch.repeat_interleave(torch.arange(len(batch)), lengths)
        starts = torch.cumsum(lengths, 0) - lengths
        positions = torch.arange(int(lengths.sum())) - starts[seq_ids]
        mask = torch.arange(longest)[None, :] < lengths[:, None]
        flat = torch.tensor([t for ids in batch for t in ids], dtype=torch.long)

        def to(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return cls(
            input_ids=to(flat),
            positions=to(positions),
            seq_ids=to(seq_ids),
            pad_index=to(seq_ids * longest + positions),
            mask=to(mask[:, None, None, :]),
            lengths=to(lengths),
            longest=longest,
        )

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[0])


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

    def forward(self, x: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
        """x: [tokens, hidden], packed."""
        b, n, h = packed.batch_size, packed.longest, x.shape[-1]
        qkv = self.qkv(x)
        padded = qkv.new_zeros(b * n, 3 * h).index_copy_(0, packed.pad_index, qkv)
        q, k, v = padded.view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=packed.mask)
        a = a.transpose(1, 2).reshape(b * n, h).index_select(0, packed.pad_index)
        x = self.attn_norm(x + self.attn_out(a))
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

    def forward(self, packed: PackedBatch) -> torch.Tensor:
        """Hidden states [tokens, hidden] of a packed batch. Segment ids are all 0 (one text
        per input)."""
        x = self.word(packed.input_ids) + self.position(packed.positions)
        x = self.embed_norm(x + self.token_type.weight[0])
        for layer in self.layers:
            x = layer(x, packed)
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
