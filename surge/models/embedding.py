"""A sentence-embedding model from a sentence-transformers folder: tokenizer, encoder, pooling.

The folder is what `SentenceTransformer.save()` writes (and what the packaged all-MiniLM-L6-v2
ships): config.json + model.safetensors + tokenizer.json, with `1_Pooling/config.json`, a
`Normalize` module in modules.json and `max_seq_length` in sentence_bert_config.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from surge.models.bert import BertEncoder, BertSpec, PackedBatch
from surge.models.device import DTYPE_NAMES


@dataclass(frozen=True, slots=True)
class PoolingSpec:
    mode: str  # "mean" | "cls" | "max"
    normalize: bool  # L2-normalize the pooled vector (cosine similarity = dot product)
    max_seq_length: int  # longest input in tokens, [CLS] and [SEP] included


def read_pooling(folder: Path, max_positions: int) -> PoolingSpec:
    mode = "mean"
    pooling_file = folder / "1_Pooling" / "config.json"
    if pooling_file.is_file():
        cfg = json.loads(pooling_file.read_text())
        keys = (
            ("cls", "pooling_mode_cls_token"),
            ("mean", "pooling_mode_mean_tokens"),
            ("max", "pooling_mode_max_tokens"),
        )
        modes = [m for m, key in keys if cfg.get(key)]
        if len(modes) != 1:
            raise ValueError(f"{pooling_file}: exactly one of cls/mean/max pooling is supported")
        mode = modes[0]
    normalize = False
    modules_file = folder / "modules.json"
    if modules_file.is_file():
        types = [m.get("type", "") for m in json.loads(modules_file.read_text())]
        normalize = any(t.endswith(".Normalize") for t in types)
    max_len = max_positions
    st_file = folder / "sentence_bert_config.json"
    if st_file.is_file():
        max_len = min(max_len, int(json.loads(st_file.read_text()).get("max_seq_length", max_len)))
    return PoolingSpec(mode, normalize, max_len)


class EmbeddingModel:
    """texts -> token ids -> one vector per input, in float32 on the CPU."""

    def __init__(
        self,
        encoder: BertEncoder,
        tokenizer: Tokenizer,
        pooling: PoolingSpec,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.device = device
        self.dtype = dtype
        self.dim = encoder.spec.hidden_size
        self.vocab_size = encoder.spec.vocab_size
        self.max_len = pooling.max_seq_length

    @classmethod
    def load(
        cls, folder: Path, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> EmbeddingModel:
        """`dtype` None: float32 (the encoder is small; its cost is the per-batch overhead, and
        float32 keeps vectors equal to the reference implementation's)."""
        folder = Path(folder)
        device = device or torch.device("cpu")
        dtype = dtype or torch.float32
        spec = BertSpec.from_hf_config(json.loads((folder / "config.json").read_text()))
        encoder = BertEncoder(spec)
        encoder.load_hf_state(load_file(str(folder / "model.safetensors")))
        encoder = encoder.to(device=device, dtype=dtype).eval()
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tokenizer.no_truncation()  # lengths are checked, not silently cut (see tokenize)
        tokenizer.no_padding()
        return cls(encoder, tokenizer, read_pooling(folder, spec.max_positions), device, dtype)

    def describe(self) -> str:
        s = self.encoder.spec
        return (
            f"BERT {s.num_layers} layers x {s.hidden_size}, {self.pooling.mode} pooling"
            f"{', normalized' if self.pooling.normalize else ''}, dim {self.dim}, "
            f"max {self.max_len} tokens, {DTYPE_NAMES[self.dtype]} on {self.device.type}"
        )

    def tokenize(self, text: str) -> list[int]:
        """Token ids with [CLS] and [SEP], untruncated (the caller checks `max_len`)."""
        ids: list[int] = self.tokenizer.encode(text).ids
        return ids

    @torch.inference_mode()
    def embed(self, batch: list[list[int]]) -> list[list[float]]:
        """One vector per token-id list. The batch runs packed: a short input beside a long one
        costs its own tokens, not the long one's (measured: BENCHMARKS.md, embeddings)."""
        packed = PackedBatch.build(batch, self.device)
        hidden = self.encoder(packed).float()
        vectors = self._pool(hidden, packed)
        if self.pooling.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        out: list[list[float]] = vectors.cpu().tolist()
        return out

    def _pool(self, hidden: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
        b, h = packed.batch_size, hidden.shape[-1]
        if self.pooling.mode == "cls":
            starts = torch.cumsum(packed.lengths, 0) - packed.lengths
            return hidden.index_select(0, starts)
        if self.pooling.mode == "max":
            init = hidden.new_full((b, h), float("-inf"))
            index = packed.seq_ids[:, None].expand(-1, h)
            return init.scatter_reduce(0, index, hidden, reduce="amax")
        sums = hidden.new_zeros(b, h).index_add_(0, packed.seq_ids, hidden)
        return sums / packed.lengths[:, None].to(hidden.dtype)
