"""Surge: serve large language models to many users at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from surge.sampling_params import SamplingParams
from surge.structured_output import StructuredOutput

if TYPE_CHECKING:
    from surge.engine.llm import LLM, CompletionOutput, RequestOutput

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "StructuredOutput"]


def __getattr__(name: str) -> Any:
    # Lazy: `surge bench` and `surge gateway` import this package but need no torch.
    if name in ("LLM", "CompletionOutput", "RequestOutput"):
        from surge.engine import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'surge' has no attribute {name!r}")
