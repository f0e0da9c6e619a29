"""The engine's LoRA adapters: names to slots, loading and unloading while serving.

Every loaded adapter stays resident in its own slot (--max-loras of them), so any mix of
adapters can share a step and the scheduler needs no adapter-aware rules. Unloading takes the
name away at once (new requests get 404); the slot is freed when the last request using it
ends, so nothing in flight changes adapter mid-answer.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from surge.engine.config import LoRAConfig
from surge.models.formats.spec import ModelSpec
from surge.models.lora import LoRABatch, LoRAError, LoRAModel, read_peft_adapter

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedAdapter:
    name: str
    path: str
    slot: int
    load_id: int  # unique per load: part of the prefix-cache key, so a reload never reuses KV

    @property
    def cache_salt(self) -> bytes:
        return b"lora:%d" % self.load_id


class LoRAManager:
    def __init__(
        self,
        model: nn.Module,
        spec: ModelSpec,
        config: LoRAConfig,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.config = config
        self.spec = spec
        self.lora = LoRAModel(model, spec, config.max_loras, config.max_lora_rank, dtype, device)
        self.adapters: dict[str, LoadedAdapter] = {}
        self._retired: list[LoadedAdapter] = []  # unloaded, slot held until their requests end
        self._load_ids = itertools.count(1)
        log.info(
            "LoRA: %d slots of rank <= %d, %.1f MiB each",
            config.max_loras,
            config.max_lora_rank,
            self.lora.slot_bytes() / (1 << 20),
        )

    @property
    def batch(self) -> LoRABatch:
        return self.lora.batch

    def _free_slot(self) -> int | None:
        used = {a.slot for a in self.adapters.values()} | {a.slot for a in self._retired}
        return next((s for s in range(self.config.max_loras) if s not in used), None)

    def add(self, name: str, path: str) -> LoadedAdapter:
        """Read and place an adapter; ValueError (LoRAError) says why it cannot be."""
        if name in self.adapters:
            raise LoRAError(f"a LoRA adapter named {name!r} is already loaded")
        slot = self._free_slot()
        if slot is None:
            raise LoRAError(
                f"all {self.config.max_loras} LoRA slots are in use (--max-loras); "
                "unload an adapter first"
            )
        weights = read_peft_adapter(path, self.spec, self.config.max_lora_rank)
        self.lora.load(slot, weights)
        adapter = LoadedAdapter(name, str(path), slot, next(self._load_ids))
        self.adapters[name] = adapter
        log.info(
            "LoRA adapter %r loaded from %s (rank %d, slot %d)", name, path, weights.rank, slot
        )
        return adapter

    def remove(self, name: str, live_slots: Iterable[int]) -> None:
        """Unload by name; the slot is cleared now if no live request uses it, else later."""
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            raise LoRAError(f"no LoRA adapter named {name!r} is loaded")
        self._retired.append(adapter)
        self.reap(live_slots)
        log.info("LoRA adapter %r unloaded", name)

    @property
    def retiring(self) -> bool:
        """Whether unloaded adapters still hold slots (reap frees them)."""
        return bool(self._retired)

    def reap(self, live_slots: Iterable[int]) -> None:
        """Free the slots of unloaded adapters that no live request uses any more."""
        if not self._retired:
            return
        live = set(live_slots)
        for adapter in [a for a in self._retired if a.slot not in live]:
            self.lora.unload(adapter.slot)
            self._retired.remove(adapter)

    def get(self, name: str) -> LoadedAdapter:
        adapter = self.adapters.get(name)
        if adapter is None:
            raise LoRAError(f"no LoRA adapter named {name!r} is loaded")
        return adapter

    def listing(self) -> tuple[tuple[str, str], ...]:
        return tuple((a.name, a.path) for a in self.adapters.values())

    def names_by_slot(self) -> dict[int, str]:
        named = {a.slot: a.name for a in self._retired}
        return named | {a.slot: a.name for a in self.adapters.values()}
