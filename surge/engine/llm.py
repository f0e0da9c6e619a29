"""Offline batch generation on an in-process EngineCore: `LLM(model).generate(prompts, params)`."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from surge.engine.client.output_processor import OutputProcessor
from surge.engine.client.outputs import TokenLogprob
from surge.engine.config import (
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from surge.engine.core.engine_core import EngineCore
from surge.models.formats.generation_config import read_model_defaults
from surge.models.formats.model_files import ModelFiles
from surge.models.formats.resolve import resolve_model
from surge.sampling_params import SamplingParams


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass(slots=True)
class RequestOutput:
    req_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    finished: bool = False
    # params.prompt_logprobs: None for the first prompt token, then each one's (vLLM's shape)
    prompt_logprobs: list[TokenLogprob | None] | None = None


Prompt = str | list[int]


class LLM:
    """Offline generation. Keyword arguments override fields of the engine's configs;
    `lora_modules={"name": "/path/to/peft-folder"}` loads LoRA adapters at start."""

    def __init__(
        self,
        model: str = "smollm2-135m",
        *,
        config: EngineConfig | None = None,
        files: ModelFiles | None = None,
        **overrides: object,
    ) -> None:
        if config is None:
            config = _config_from_kwargs(model, overrides)
        self.engine = EngineCore(config, files)
        self.tokenizer = self.engine.tokenizer
        path = files.path if files is not None else resolve_model(config.model.model)
        self._sampling_defaults = read_model_defaults(path)
        self._processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with what the model's files recommend (generation_config.json, a
        GGUF's general.sampling.*; vLLM's): what generate() takes when given none."""
        fields: dict[str, Any] = dict(self._sampling_defaults)
        return SamplingParams(**fields)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_name: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); results in prompt order.
        `lora_name`: a loaded adapter for every prompt, or one per prompt (None: the base)."""
        prompt_list = _as_prompt_list(prompts)
        if params is None:
            params = self.get_default_sampling_params()
        param_list = (
            [params] * len(prompt_list) if isinstance(params, SamplingParams) else list(params)
        )
        if len(param_list) != len(prompt_list):
            raise ValueError("params must be one SamplingParams or one per prompt")
        loras = (
            [lora_name] * len(prompt_list)
            if lora_name is None or isinstance(lora_name, str)
            else list(lora_name)
        )
        if len(loras) != len(prompt_list):
            raise ValueError("lora_name must be one name or one per prompt")
        results: dict[str, RequestOutput] = {}
        order: list[str] = []
        for prompt, p, lora in zip(prompt_list, param_list, loras, strict=True):
            if isinstance(prompt, str):
                ids, text = self.tokenizer.encode(prompt), prompt
            else:
                ids, text = list(prompt), None
            req_id = str(next(self._ids))
            creqs = self._processor.add(req_id, ids, p, lora_name=lora)
            results[req_id] = RequestOutput(
                req_id, text, ids, [CompletionOutput(k) for k in range(p.n)]
            )
            order.append(req_id)
            for creq in creqs:
                self.engine.add_request(creq)
        bar = tqdm(total=len(order), desc="generate", disable=not use_tqdm)
        while self.engine.has_work():
            deltas, to_abort = self._processor.process(self.engine.step())
            for seq_id in to_abort:
                self.engine.abort(seq_id)
            for rd in deltas:
                res = results[rd.req_id]
                res.num_cached_tokens = rd.num_cached_tokens
                for d in rd.deltas:
                    if d.prompt_logprobs is not None and res.prompt_logprobs is None:
                        res.prompt_logprobs = [None, *d.prompt_logprobs]
                    out = res.outputs[d.index]
                    out.text += d.text
                    out.token_ids.extend(d.token_ids)
                    if d.logprobs is not None:
                        out.logprobs = (out.logprobs or []) + d.logprobs
                    out.finish_reason = d.finish_reason
                    out.stop_reason = d.stop_reason
                if rd.finished:
                    res.finished = True
                    bar.update(1)
        bar.close()
        return [results[r] for r in order]

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_name: str | Sequence[str | None] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """vLLM's `LLM.chat`: one conversation (a list of messages) or a list of them, each
        rendered with the model's chat template (and `tools`, `chat_template_kwargs`), then
        generated as `generate` does; `prompt` is the rendered text."""
        first = messages[0] if messages else None
        conversations = [messages] if isinstance(first, Mapping) else list(messages)
        kwargs = {**(chat_template_kwargs or {}), **({"tools": list(tools)} if tools else {})}
        texts = [
            self.tokenizer.apply_chat_template(c, add_generation_prompt, **kwargs)  # type: ignore[arg-type]
            for c in conversations
        ]
        # The template writes any BOS itself: no special tokens added again.
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        outs = self.generate(ids, params, use_tqdm=use_tqdm, lora_name=lora_name)
        for out, text in zip(outs, texts, strict=True):
            out.prompt = text
        return outs

    def add_lora(self, name: str, path: str) -> None:
        """Load a PEFT LoRA adapter under `name` (the engine needs enable_lora=True)."""
        self.engine.add_lora(name, path)

    def remove_lora(self, name: str) -> None:
        self.engine.remove_lora(name)


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt (text or a list of token ids) or a sequence of them."""
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [[int(t) for t in items]]  # type: ignore[arg-type]
    return [p if isinstance(p, str) else list(p) for p in items]  # type: ignore[arg-type]


def _config_from_kwargs(model: str, overrides: dict[str, object]) -> EngineConfig:
    """Route each keyword to the config that has a field of that name."""
    model_kw: dict[str, Any] = {"model": model}
    cache_kw: dict[str, Any] = {}
    sched_kw: dict[str, Any] = {}
    lora_kw: dict[str, Any] = {}
    spec_kw: dict[str, Any] = {}
    for name, value in overrides.items():
        if name == "lora_modules":
            assert isinstance(value, dict)
            lora_kw["adapters"] = tuple((str(k), str(v)) for k, v in value.items())
            continue
        for cls, kw in (
            (ModelConfig, model_kw),
            (CacheConfig, cache_kw),
            (SchedulerConfig, sched_kw),
            (LoRAConfig, lora_kw),
            (SpeculativeConfig, spec_kw),
        ):
            if name in cls.__dataclass_fields__:
                kw[name] = value
                break
        else:
            raise TypeError(f"unknown engine option {name!r}")
    return EngineConfig(
        ModelConfig(**model_kw),
        CacheConfig(**cache_kw),
        SchedulerConfig(**sched_kw),
        LoRAConfig(**lora_kw),
        SpeculativeConfig(**spec_kw),
    )
