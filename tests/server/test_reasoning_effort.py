"""OpenAI's reasoning_effort (and the Responses API's reasoning.effort) reach the chat template as
its `reasoning_effort` variable, as vLLM passes it (gpt-oss's template reads it)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from surge.models.formats.model_files import open_model
from surge.server.openai_responses import ResponsesRequest
from surge.server.protocol import ChatCompletionRequest
from surge.server.routes.chat import render_text

TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    "|effort={{ reasoning_effort | default('none') }}"
)


def test_the_template_reads_the_reasoning_effort(tiny_model_dir: Path) -> None:
    tok = open_model(tiny_model_dir).tokenizer
    tok.chat_template = TEMPLATE
    state = SimpleNamespace(tokenizer=tok, tool_parser=None, template_renders_tools=False)
    messages = [{"role": "user", "content": "hi"}]

    def rendered(**fields: object) -> str:
        body = ChatCompletionRequest.model_validate({"messages": messages, **fields})
        return render_text(state, body)  # type: ignore[arg-type]

    assert rendered() == "hi|effort=none"
    assert rendered(reasoning_effort="high") == "hi|effort=high"
    kwargs = {"chat_template_kwargs": {"reasoning_effort": "low"}}
    assert rendered(reasoning_effort="high", **kwargs) == "hi|effort=low"  # the kwargs win
    responses = ResponsesRequest(input="hi", reasoning={"effort": "medium"})
    chat = ChatCompletionRequest.model_validate(responses.chat_fields(responses.input_items()))
    assert render_text(state, chat) == "hi|effort=medium"  # type: ignore[arg-type]
