"""Surge: serve large language models to many users at once."""

from surge.engine.llm import LLM, CompletionOutput, RequestOutput
from surge.sampling_params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams"]
