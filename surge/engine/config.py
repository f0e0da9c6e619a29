"""Engine configuration: one frozen dataclass per part, composed, validated once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from surge.config.flags import each, flag, group

# "auto" (resolved at load: surge/engine/runner/loader.py) and
# surge.models.quant.QUANTIZATIONS, spelled out so that configs import without torch (a test
# keeps the two equal).
QUANTIZATIONS = ("auto", "none", "int8", "int8-weight-only", "w8a8", "q4", "q4-int8", "gguf")
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_CACHE_DTYPES = (*DTYPES, "int8")


def _zero_is_none(value: float | None) -> float | None:
    """0 on the command line: none (no aging, no preemption)."""
    return value or None


def parse_tenant_weight(text: str) -> tuple[str, float]:
    tenant, sep, weight = text.rpartition("=")
    try:
        if not sep or not tenant:
            raise ValueError
        return tenant, float(weight)
    except ValueError:
        raise SystemExit(f"--tenant-weight expects TENANT=WEIGHT, got {text!r}") from None


def parse_lora_module(text: str) -> tuple[str, str]:
    """vLLM's --lora-modules forms: name=path, or a JSON object with name and path."""
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
            return str(obj["name"]), str(obj["path"])
        except (ValueError, KeyError, TypeError):
            raise SystemExit(f"--lora-modules: bad JSON adapter {text!r}") from None
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"--lora-modules expects NAME=PATH, got {text!r}")
    return name, path


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model: str = field(default="smollm2-135m", metadata=flag(env="SURGE_MODEL"))  # alias|GGUF|HF
    dtype: str = field(
        default="auto",
        metadata=flag(
            "auto: bf16 where the device has native bf16 matmuls, else fp16 (CUDA) or fp32",
            choices=DTYPES,
        ),
    )
    device: str = field(default="auto", metadata=flag("auto | cpu | cuda | cuda:N"))
    max_model_len: int | None = field(default=None, metadata=flag("None: the model's own"))
    seed: int = field(default=0, metadata=flag("seeds random requests that carry no seed"))
    # compiled CPU attention kernels (built on first use; torch fallback)
    use_kernels: bool = field(
        default=True,
        metadata=flag("torch ops only (no compiled CPU attention)", name="no-kernels", negate=True),
    )
    # auto (a quantized GGUF's matrices in their types' forms on a CPU with the kernels, else
    # none) | none | int8 (kernel chosen per batch shape) | int8-weight-only | w8a8 | q4 |
    # q4-int8 | gguf (surge/engine/runner/loader.py resolve_quantization, surge/models/forms.py,
    # surge/models/quant.py, surge/models/q4.py)
    quantization: str = field(
        default="auto",
        metadata=flag(
            "auto: a quantized GGUF on a CPU with the kernels keeps Q4_0/Q4_1 blocks as q4 and "
            "runs other types int8 (gguf), else none; int8 weights (per-channel scales; int8 "
            "picks the kernel per batch shape); q4: 4-bit blocks (GGUF Q4_0/Q4_1 mapped exactly) "
            "for every batch; q4-int8: q4 plus an int8 copy for large batches (1.625 bytes a "
            "weight: faster past 8 rows on VNNI/AMX CPUs); gguf: each matrix by its GGML type",
            choices=QUANTIZATIONS,
        ),
    )
    compile: bool = field(
        default=False, metadata=flag("torch.compile the decode step, batch sizes padded to buckets")
    )
    # With compile: build every decode graph at start, so no live request waits for a compile.
    compile_warmup: bool = True
    # q4 on CPU: decode steps run every layer in one compiled call
    # (surge/models/q4_decode.py) instead of layer by layer, compiled or not.
    fused_decode: bool = field(
        default=True,
        metadata=flag(
            "q4: run decode steps layer by layer, not as one compiled call",
            name="no-fused-decode",
            negate=True,
        ),
    )
    # CUDA: pure-decode steps replay captured CUDA graphs (surge/engine/runner/cuda_graphs.py);
    # False is vLLM's --enforce-eager.
    cuda_graphs: bool = field(
        default=True,
        metadata=flag(
            "GPU: run decode steps eagerly, not replayed from captured CUDA graphs",
            name="enforce-eager",
            negate=True,
        ),
    )
    # Greedy output the same whatever else is in the batch: every step on one kernel and
    # reduction order for 1 and N rows (the fused 4-bit stack on its int8 copies at every size).
    batch_invariant: bool = field(
        default=False,
        metadata=flag(
            "greedy output identical whatever else is in the batch (q4 on CPU: every step on "
            "the int8 copies; small steps slower, see docs/precision.md)"
        ),
    )

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto|float32|bfloat16|float16, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be {'|'.join(QUANTIZATIONS)}, got {self.quantization!r}"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = field(default=16, metadata=flag())
    # Memory budget for the KV block pool; None: 2 GiB on a CPU, on a GPU what
    # gpu_memory_utilization leaves after the weights and a step's transients (kv_cache.py).
    kv_cache_memory_gib: float | None = field(
        default=None,
        metadata=flag(
            "memory for the KV cache (default: 2 on a CPU; on a GPU what "
            "--gpu-memory-utilization leaves after the weights)"
        ),
    )
    gpu_memory_utilization: float = field(
        default=0.9,
        metadata=flag(
            "GPU: the share of its memory this instance may hold (weights, KV cache, steps)"
        ),
    )
    # exact pool size (overrides the memory budget; used by tests)
    num_blocks: int | None = field(default=None, metadata=flag(name="num-kv-blocks"))
    enable_prefix_caching: bool = field(
        default=True, metadata=flag(name="no-prefix-caching", negate=True)
    )
    # auto (see device.choose_kv_dtype) | float32 | bfloat16 | float16 | int8 (kv_quant.py)
    kv_cache_dtype: str = field(
        default="auto",
        metadata=flag(
            "auto: the model's dtype, but bf16 where auto chose float32 on a CPU; int8: "
            "a scale per token and head, half of bf16's bytes",
            choices=KV_CACHE_DTYPES,
        ),
    )

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                "kv_cache_dtype must be auto|float32|bfloat16|float16|int8, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ValueError(f"kv_cache_memory_gib must be > 0, got {self.kv_cache_memory_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")


SCHEDULING_POLICIES = ("fcfs", "priority", "fair", "priority-fair")


# How the engine gets its start-up step costs (engine/core/calibrate.py startup).
CALIBRATION_MODES = ("cached", "measure", "off")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=256, metadata=flag("cap on running requests"))
    max_num_batched_tokens: int = field(
        default=512, metadata=flag("token budget of one step (prefill chunks + decodes)")
    )
    # one of SCHEDULING_POLICIES (engine/core/policies.py explains each)
    policy: str = field(
        default="fcfs",
        metadata=flag(
            "fcfs; priority (lower value sooner, with aging); fair (per-tenant token share, "
            "VTC); priority-fair (priority bands, fair share within a band)",
            name="scheduling-policy",
            choices=SCHEDULING_POLICIES,
        ),
    )
    priority_aging_s: float | None = field(
        default=5.0,
        metadata=flag(
            "seconds of waiting worth one priority level (0: no aging; low priority may starve)",
            to_field=_zero_is_none,
        ),
    )
    # priority: a waiting request may preempt running work this many levels less urgent when the
    # batch is full (None: never; SGLang's --priority-scheduling-preemption-threshold).
    preemption_threshold: int | None = field(
        default=1,
        metadata=flag(
            "a waiting request may preempt running work this many priority levels less urgent "
            "when the batch is full (0: never)",
            to_field=_zero_is_none,
        ),
    )
    # priority: requests that such a waiting request could preempt (Batch API lines behind
    # interactive requests) sit out the steps of its prefill, and while more urgent work is
    # present may lengthen a step by at most this (engine/core/background.py; None: no bound).
    background_step_ms: float | None = field(
        default=25.0,
        metadata=flag(
            "while more urgent work is present, requests it could preempt may lengthen an engine "
            "step by at most this many milliseconds, priced by the engine's measured step costs "
            "(0: no bound)",
            to_field=_zero_is_none,
        ),
    )
    # ...and for this long after it was last seen (more is likely to come).
    background_quiet_s: float = 10.0
    # fair: token service is weighted per tenant; a tenant's share is its weight over the sum.
    tenant_weights: tuple[tuple[str, float], ...] = field(
        default=(),
        metadata=flag(
            "fair-share weight of a tenant (repeatable; others weigh 1)",
            name="tenant-weight",
            repeat=True,
            metavar="TENANT=WEIGHT",
            to_field=each(parse_tenant_weight),
        ),
    )
    # Start-up step costs for admission's wait estimate (engine/core/calibrate.py): cached | measure
    # | off.
    calibration: str = field(
        default="cached",
        metadata=flag(
            "start-up step costs for the wait estimate: cached (reuse the last measurement for "
            "this model, configuration and machine, else measure, ~3 s on SmolLM2), measure "
            "(always), "
            "off (learn from the first steps only)",
            choices=CALIBRATION_MODES,
        ),
    )
    default_tenant_weight: float = 1.0
    prompt_token_cost: float = 1.0  # VTC's w_p, w_q: a decoded token costs more than a prompt one
    output_token_cost: float = 2.0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {self.policy!r}"
            )
        if self.calibration not in CALIBRATION_MODES:
            raise ValueError(
                f"calibration must be one of {', '.join(CALIBRATION_MODES)}, "
                f"got {self.calibration!r}"
            )
        if self.priority_aging_s is not None and self.priority_aging_s <= 0:
            raise ValueError(f"priority_aging_s must be > 0 or None, got {self.priority_aging_s}")
        if self.preemption_threshold is not None and self.preemption_threshold < 1:
            raise ValueError(
                f"preemption_threshold must be >= 1 or None, got {self.preemption_threshold}"
            )
        if self.background_step_ms is not None and not self.background_step_ms > 0:
            raise ValueError(
                f"background_step_ms must be > 0 or None, got {self.background_step_ms}"
            )
        if self.background_quiet_s < 0:
            raise ValueError(f"background_quiet_s must be >= 0, got {self.background_quiet_s}")
        for tenant, weight in self.tenant_weights:
            if not weight > 0:
                raise ValueError(f"tenant_weights: weight of {tenant!r} must be > 0, got {weight}")
        if not self.default_tenant_weight > 0:
            raise ValueError(f"default_tenant_weight must be > 0, got {self.default_tenant_weight}")
        if self.prompt_token_cost < 0 or self.output_token_cost < 0:
            raise ValueError("prompt_token_cost and output_token_cost must be >= 0")


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    """LoRA adapters served beside the base model (surge/engine/runner/lora_manager.py)."""

    # implied by `adapters`; alone: adapters come at run time
    enable_lora: bool = field(default=False, metadata=flag("implied by --lora-modules"))
    max_loras: int = field(
        default=4, metadata=flag("adapters resident at once, each in its own slot")
    )
    max_lora_rank: int = field(
        default=16, metadata=flag("slots are sized for this rank; larger adapters are refused")
    )
    # (name, PEFT folder) loaded at start
    adapters: tuple[tuple[str, str], ...] = field(
        default=(),
        metadata=flag(
            'adapters loaded at start: NAME=PATH or {"name": ..., "path": ...}',
            name="lora-modules",
            nargs="+",
            metavar="NAME=PATH",
            to_field=each(parse_lora_module),
        ),
    )

    @property
    def active(self) -> bool:
        return self.enable_lora or bool(self.adapters)

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if len(self.adapters) > self.max_loras:
            raise ValueError(
                f"{len(self.adapters)} LoRA adapters given, max_loras is {self.max_loras}"
            )
        names = [n for n, _ in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError("LoRA adapter names must be unique")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding with prompt-lookup drafts (surge/engine/core/ngram.py); vLLM's
    --speculative-config {"method": "ngram", ...}. Off while num_speculative_tokens is 0."""

    method: str = "ngram"
    num_speculative_tokens: int = 0  # draft tokens verified per step and request
    prompt_lookup_min: int = 2  # the shortest suffix looked up
    prompt_lookup_max: int = 4  # the longest
    # No drafts while more requests than this run: big batches are bound by compute, where
    # verifying tokens that are thrown away costs more than it saves (None: always draft).
    disable_by_batch_size: int | None = None

    @property
    def enabled(self) -> bool:
        return self.num_speculative_tokens > 0

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative method must be 'ngram', got {self.method!r}")
        if self.num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens must be >= 0")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError("disable_by_batch_size must be >= 1 or None")


def speculative_config(text: str | None) -> SpeculativeConfig:
    """--speculative-config's JSON object -> SpeculativeConfig (None: off)."""
    if not text:
        return SpeculativeConfig()
    try:
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise TypeError("not an object")
        return SpeculativeConfig(**fields)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"--speculative-config: {e}") from None


KV_EVENTS_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """What enters and leaves the prefix cache, published in vLLM's KV-events format
    (surge/kv_events/wire.py) for a router's index; off unless an endpoint is given."""

    endpoint: str | None = field(
        default=None,
        metadata=flag(
            "bind a ZMQ PUB socket here and publish the prefix cache's KV events, e.g. "
            "tcp://127.0.0.1:5557 (port *: any free one; default: off)"
        ),
    )
    replay_endpoint: str | None = field(
        default=None,
        metadata=flag("bind a ZMQ ROUTER here that resends missed batches (vLLM's replay)"),
    )
    topic: str = field(default="", metadata=flag("the first frame of every message"))
    buffer_steps: int = field(
        default=10_000, metadata=flag("batches kept for replay (one per engine step with events)")
    )

    def __post_init__(self) -> None:
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(KV_EVENTS_SCHEMES):
                raise ValueError(f"kv_events.{name} must be tcp://, ipc:// or inproc://: {value!r}")
        if self.replay_endpoint is not None and self.endpoint is None:
            raise ValueError("kv_events.replay_endpoint needs kv_events.endpoint")
        if self.buffer_steps < 1:
            raise ValueError(f"kv_events.buffer_steps must be >= 1, got {self.buffer_steps}")

    @property
    def enabled(self) -> bool:
        return self.endpoint is not None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Each part's flags are one argument group of `surge serve --help` (surge/config/flags.py)."""

    model: ModelConfig = field(default_factory=ModelConfig, metadata=group("model"))
    cache: CacheConfig = field(default_factory=CacheConfig, metadata=group("KV cache"))
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig, metadata=group("scheduler"))
    lora: LoRAConfig = field(
        default_factory=LoRAConfig,
        metadata=group("LoRA adapters (PEFT folders; a request names one as `model`)"),
    )
    speculative: SpeculativeConfig = field(
        default_factory=SpeculativeConfig,
        metadata=flag(
            'speculative decoding, vLLM\'s form: {"method": "ngram", "num_speculative_tokens": '
            '4, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "disable_by_batch_size": N}',
            name="speculative-config",
            default=None,
            metavar="JSON",
            to_field=speculative_config,
            group="speculative decoding",
        ),
    )
    kv_events: KVEventsConfig = field(
        default_factory=KVEventsConfig,
        metadata=group(
            "KV events (vLLM's format over ZMQ, for KV-aware routers)", prefix="kv-events-"
        ),
    )
