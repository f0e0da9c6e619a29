"""vLLM's LoRA admin routes: POST /v1/load_lora_adapter and /v1/unload_lora_adapter.

Off unless the server runs with --allow-runtime-lora-updating (as vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING): loading reads a folder of the server's file system that the
caller names, so it is for operators, behind the API key.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from surge.engine.client.client import LoRAUpdateError
from surge.server.errors import BadRequestError, NotFoundError
from surge.server.openapi import LOOKUP
from surge.server.state import ServerState, get_state

router = APIRouter()


class LoadLoRARequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1)


class UnloadLoRARequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None  # vLLM's; names are enough here


def _check_allowed(state: ServerState) -> None:
    if not state.config.allow_runtime_lora_updating:
        raise BadRequestError(
            "loading LoRA adapters at run time is off; start the server with "
            "--enable-lora --allow-runtime-lora-updating",
            code="lora_updating_disabled",
        )
    if state.client.info.max_loras == 0:
        raise BadRequestError("LoRA is not enabled on this server (--enable-lora)")


@router.post("/v1/load_lora_adapter", responses=LOOKUP)
async def load_lora_adapter(body: LoadLoRARequest, request: Request) -> Response:
    state = get_state(request)
    _check_allowed(state)
    name = body.lora_name
    if state.is_base_model(name):
        raise BadRequestError(f"{name!r} is the base model's name", param="lora_name")
    if name in state.client.lora_adapters:
        raise BadRequestError(
            f"the LoRA adapter {name!r} is already loaded", param="lora_name", code="lora_exists"
        )
    try:
        await state.client.load_lora(name, body.lora_path)
    except LoRAUpdateError as e:
        raise BadRequestError(str(e), param="lora_path", code="invalid_lora") from None
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


@router.post("/v1/unload_lora_adapter", responses=LOOKUP)
async def unload_lora_adapter(body: UnloadLoRARequest, request: Request) -> Response:
    state = get_state(request)
    _check_allowed(state)
    name = body.lora_name
    if name not in state.client.lora_adapters:
        raise NotFoundError(
            f"The lora adapter '{name}' cannot be found.", param="lora_name", code="lora_not_found"
        )
    try:
        await state.client.unload_lora(name)
    except LoRAUpdateError as e:  # unloaded by another call meanwhile
        raise NotFoundError(str(e), param="lora_name", code="lora_not_found") from None
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
