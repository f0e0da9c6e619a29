"""The structured-output and tool fields of a request (OpenAI's `response_format`, `tools`,
`tool_choice`; vLLM's `structured_outputs` and `guided_*`), and the one constraint they make."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from surge.server.errors import BadRequestError
from surge.server.tools import ToolPlan
from surge.structured_output import StructuredOutput


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")  # as every request model: unknown fields ignored


class JsonSchemaFormat(_Lenient):
    name: StrictStr = "response"
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class FunctionSpec(_Lenient):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolSpec(_Lenient):
    type: Literal["function"]
    function: FunctionSpec


class FunctionName(_Lenient):
    name: StrictStr


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: FunctionName


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsParams(_Lenient):
    """vLLM's `structured_outputs`: exactly one of these."""

    json_: dict[str, Any] | StrictStr | None = Field(default=None, alias="json")
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None


def structured_output_of(
    response_format: ResponseFormat | None,
    structured_outputs: StructuredOutputsParams | None,
    guided: tuple[dict[str, Any] | str | None, str | None, list[str] | None, str | None],
) -> StructuredOutput | None:
    """The one constraint the fields ask for, its grammar validated; 400 naming the field for
    a bad one, or for several."""
    asked: list[tuple[str, Callable[[], StructuredOutput]]] = []
    fmt = response_format
    if fmt is not None and fmt.type == "json_object":
        asked.append(("response_format", lambda: StructuredOutput("json_object")))
    elif fmt is not None and fmt.type == "json_schema":
        schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
        if schema is None:
            raise BadRequestError(
                "response_format: type json_schema needs json_schema.schema",
                param="response_format",
            )
        asked.append(("response_format", lambda: StructuredOutput.json_schema(schema)))
    so = structured_outputs
    if so is not None:
        asked += _vllm_forms(
            "structured_outputs.", so.json_, so.regex, so.choice, so.grammar, bool(so.json_object)
        )
    asked += _vllm_forms("guided_", *guided, False)
    if not asked:
        return None
    name = asked[-1][0]
    if len(asked) > 1:
        names = ", ".join(n for n, _ in asked)
        raise BadRequestError(
            f"{name}: give one structured output constraint, not several ({names})", param=name
        )
    try:
        structured = asked[0][1]()
        structured.grammar()
    except ValueError as e:
        raise BadRequestError(f"{name}: {e}", param=name) from None
    return structured


def _vllm_forms(
    prefix: str,
    json_: dict[str, Any] | str | None,
    regex: str | None,
    choice: list[str] | None,
    grammar: str | None,
    json_object: bool,
) -> list[tuple[str, Callable[[], StructuredOutput]]]:
    """vLLM's forms, `structured_outputs.{json,regex,...}` or `guided_{json,regex,...}`: (the
    field's name, how to build its constraint) for each one given."""
    out: list[tuple[str, Callable[[], StructuredOutput]]] = []
    if json_ is not None:
        out.append((f"{prefix}json", lambda: StructuredOutput.json_schema(json_)))
    if regex is not None:
        out.append((f"{prefix}regex", lambda: StructuredOutput("regex", regex)))
    if choice is not None:
        out.append((f"{prefix}choice", lambda: StructuredOutput.choice(choice)))
    if grammar is not None:
        out.append((f"{prefix}grammar", lambda: StructuredOutput("grammar", grammar)))
    if json_object:
        out.append((f"{prefix}json_object", lambda: StructuredOutput("json_object")))
    return out


def tool_plan_of(
    tools: list[ToolSpec] | None,
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None,
    auto_tools: bool = False,
) -> ToolPlan | None:
    """How tool_choice holds the output, or None when it does not ("none", or "auto" read back
    by the server's tool-call parser); 400 for what cannot be served: "auto" with tools when
    the server has no parser (`auto_tools` false)."""
    specs = {t.function.name: t.function.parameters for t in tools or ()}
    choice = tool_choice
    if choice is None:
        choice = "auto" if specs else "none"
    if choice == "none" or (choice == "auto" and auto_tools):
        return None
    if choice == "auto":
        raise BadRequestError(
            "tool_choice: 'auto' (the default with tools) needs a parser of this model's "
            "own tool-call syntax, which this server was not started with "
            "(--enable-auto-tool-choice); send tool_choice 'required' or a named function, "
            "and the output is held to the call's JSON",
            param="tool_choice",
        )
    if not specs:
        raise BadRequestError(f"tool_choice: {choice!r} needs tools", param="tool_choice")
    if choice == "required":
        return ToolPlan.required(specs)
    assert isinstance(choice, NamedToolChoice)
    name = choice.function.name
    if name not in specs:
        raise BadRequestError(
            f"tool_choice: function {name!r} is not among the tools", param="tool_choice"
        )
    return ToolPlan.named_function(name, specs[name])


def with_tool_plan(
    plan: ToolPlan | None, other: StructuredOutput | None
) -> StructuredOutput | None:
    """A forced tool call's constraint (validated), or the other one; never both."""
    if plan is None:
        return other
    if other is not None:
        raise BadRequestError(
            "tool_choice: a forced tool call cannot be combined with response_format or "
            "guided decoding",
            param="tool_choice",
        )
    try:
        plan.structured.grammar()
    except ValueError as e:
        raise BadRequestError(f"tools: a function's parameters: {e}", param="tools") from None
    return plan.structured
