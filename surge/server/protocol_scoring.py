"""POST /score and /rerank (vLLM's and Jina/Cohere's shapes) for the embedding model: each pair
of texts scored by the cosine similarity of their vectors, as vLLM scores with an embedding
model."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from surge.server.errors import BadRequestError
from surge.server.protocol_embeddings import MAX_INPUTS


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    text_1: StrictStr | list[StrictStr]
    text_2: StrictStr | list[StrictStr]
    truncate_prompt_tokens: StrictInt | None = None

    def pairs(self) -> list[tuple[str, str]]:
        """One text against each of the others, or pair by pair (lists of one length)."""
        first = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        second = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if not first or not second:
            raise BadRequestError("text_1 and text_2 must not be empty", param="text_1")
        if len(first) == 1:
            first = first * len(second)
        if len(first) != len(second):
            raise BadRequestError(
                f"text_1 has {len(first)} texts and text_2 {len(second)}: give one text_1, or "
                "as many as text_2 (scored pair by pair)",
                param="text_1",
            )
        return list(zip(first, second, strict=True))


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    query: StrictStr
    documents: list[StrictStr | dict[str, Any]]
    top_n: StrictInt | None = None  # None or 0: every document
    return_documents: StrictBool = True
    truncate_prompt_tokens: StrictInt | None = None

    def texts(self) -> list[str]:
        """The documents' texts (plain strings, or Cohere's {"text": ...} objects)."""
        out = []
        for i, doc in enumerate(self.documents):
            text = doc if isinstance(doc, str) else doc.get("text")
            if not isinstance(text, str):
                raise BadRequestError(
                    f"documents.{i} must be a string or an object with a string 'text'",
                    param=f"documents.{i}",
                )
            out.append(text)
        if not out:
            raise BadRequestError("documents must not be empty", param="documents")
        if len(out) >= MAX_INPUTS:
            raise BadRequestError(
                f"documents has {len(out)} items; at most {MAX_INPUTS - 1}", param="documents"
            )
        if self.top_n is not None and self.top_n < 0:
            raise BadRequestError("top_n must be >= 0", param="top_n")
        return out


def unique_texts(texts: list[str]) -> tuple[list[str], list[int]]:
    """The distinct texts (each embedded once) and where each of `texts` is among them."""
    index: dict[str, int] = {}
    where = [index.setdefault(t, len(index)) for t in texts]
    return list(index), where


def cosine(vectors: list[list[float]], a: list[int], b: list[int]) -> list[float]:
    """Cosine similarity of vectors[a[k]] and vectors[b[k]] for each k."""
    v = np.asarray(vectors, dtype=np.float64)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return [float(x) for x in np.einsum("ij,ij->i", v[a], v[b])]


def score_response(scores: list[float], model: str, num_tokens: int) -> dict[str, Any]:
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def rerank_response(
    body: RerankRequest, texts: list[str], scores: list[float], model: str, num_tokens: int
) -> dict[str, Any]:
    """Documents by relevance, highest first (ties in their order), the top_n of them."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    if body.top_n:
        order = order[: body.top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            result["document"] = {"text": texts[i]}
        results.append(result)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "usage": {"total_tokens": num_tokens},
        "results": results,
    }
