"""POST /v1/embeddings: the OpenAI request shape (with vLLM's `truncate_prompt_tokens`) and the
response body. The official `openai` client asks for base64 unless told otherwise."""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, field_validator

from surge.server.protocol_messages import _reworded

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    model: StrictStr | None = None  # None: the served embedding model
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: StrictStr | None = None
    # vLLM extra: keep the first k tokens of a longer input (-1: as many as the model takes)
    # instead of refusing it. Unset, an input over the model's length is a 400.
    truncate_prompt_tokens: StrictInt | None = None

    _check_input = field_validator("input", mode="wrap")(
        _reworded(
            "input must be a string, a list of strings, a list of token ids, "
            "or a list of lists of token ids"
        )
    )

    def inputs(self) -> list[str | list[int]]:
        """One entry per embedding to return, in order."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and all(isinstance(v, int) for v in value):
            return [list(value)]  # type: ignore[arg-type]
        return list(value)  # type: ignore[arg-type]


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def embedding_response(
    vectors: list[list[float]], model: str, encoding_format: str, num_tokens: int
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }
