"""Messages between the API process and the engine-core process (pickled over a pipe)."""

from __future__ import annotations

from dataclasses import dataclass

from surge.engine.client.outputs import EngineCoreOutput, EngineCoreRequest
from surge.engine.stats import EngineStats


@dataclass(frozen=True, slots=True)
class AddRequests:
    requests: list[EngineCoreRequest]


@dataclass(frozen=True, slots=True)
class Abort:
    req_ids: list[str]


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclass(frozen=True, slots=True)
class LoadLoRA:
    """Load a PEFT adapter under a name; answered by a LoRAResult with the same call_id."""

    call_id: int
    name: str
    path: str


@dataclass(frozen=True, slots=True)
class UnloadLoRA:
    call_id: int
    name: str


@dataclass(frozen=True, slots=True)
class LoRAResult:
    """The outcome of a LoadLoRA / UnloadLoRA: error None on success; the adapters now loaded."""

    call_id: int
    error: str | None
    adapters: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Ready:
    """Sent once the model is loaded: what the API process needs to validate requests."""

    model_path: str
    max_model_len: int
    vocab_size: int
    dtype: str
    device: str
    num_blocks: int
    block_size: int
    lora_adapters: tuple[tuple[str, str], ...] = ()  # (name, path) loaded at start
    max_loras: int = 0  # 0: LoRA is not enabled
    # (tokens, rows, seconds) of steps measured at start (engine/core/calibrate.py); ():
    # skipped.
    step_samples: tuple[tuple[int, int, float], ...] = ()
    # The KV events' bound ZMQ addresses (engine/core/kv_publisher.py); None: events are off.
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""


@dataclass(frozen=True, slots=True)
class Outputs:
    outputs: list[EngineCoreOutput]
    stats: EngineStats


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """The engine refused a request (e.g. too long); the API process ends it with this error."""

    req_id: str
    message: str


@dataclass(frozen=True, slots=True)
class Fatal:
    """The engine loop died; the message says why. The process exits after sending it."""

    message: str


ToEngine = AddRequests | Abort | Shutdown | LoadLoRA | UnloadLoRA
FromEngine = Ready | Outputs | RequestFailed | Fatal | LoRAResult
