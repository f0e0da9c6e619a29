"""Engine configuration: one frozen dataclass per part, composed, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field

# "auto" (resolved at load: surge/engine/loader.py) and surge.models.quant.QUANTIZATIONS, spelled
# out so that configs import without torch (a test keeps the two equal).
QUANTIZATIONS = ("auto", "none", "int8", "int8-weight-only", "w8a8", "q4")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model: str = "smollm2-135m"  # alias, GGUF file or HF folder
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    max_model_len: int | None = None  # None: the model's own context length
    seed: int = 0  # seeds random requests that carry no seed of their own
    use_kernels: bool = True  # compiled CPU attention kernels (built on first use; torch fallback)
    # auto (a GGUF's own 4-bit blocks where this CPU has their kernel, else none) | none |
    # int8 (kernel chosen per batch shape) | int8-weight-only | w8a8 | q4
    # (surge/engine/loader.py resolve_quantization, surge/models/quant.py, surge/models/q4.py)
    quantization: str = "auto"
    compile: bool = False  # torch.compile the decode step, batch sizes padded to buckets
    # With compile: build every decode graph at start, so no live request waits for a compile.
    compile_warmup: bool = True
    # q4 on CPU: decode steps run every layer in one compiled call
    # (surge/models/q4_decode.py) instead of layer by layer, compiled or not.
    fused_decode: bool = True
    # CUDA: pure-decode steps replay captured CUDA graphs (surge/engine/cuda_graphs.py);
    # False is vLLM's --enforce-eager.
    cuda_graphs: bool = True
    # Greedy output the same whatever else is in the batch: every step on one kernel and
    # reduction order for 1 and N rows (the fused 4-bit stack on its int8 copies at every size).
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto|float32|bfloat16|float16, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be {'|'.join(QUANTIZATIONS)}, got {self.quantization!r}"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = 16
    # Memory budget for the KV block pool; None: 2 GiB on a CPU, on a GPU what
    # gpu_memory_utilization leaves after the weights and a step's transients (kv_cache.py).
    kv_cache_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.9  # the share of the GPU's memory this instance may hold
    num_blocks: int | None = None  # exact pool size (overrides the memory budget; used by tests)
    enable_prefix_caching: bool = True
    # auto (see device.choose_kv_dtype) | float32 | bfloat16 | float16 | int8 (kv_quant.py)
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in ("auto", "float32", "bfloat16", "float16", "int8"):
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


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256  # cap on running requests
    max_num_batched_tokens: int = 512  # token budget of one step (prefill chunks + decodes)
    policy: str = "fcfs"  # one of SCHEDULING_POLICIES (engine/policies.py explains each)
    # priority: waiting this long is worth one priority level (None: no aging, lows may starve).
    priority_aging_s: float | None = 5.0
    # priority: a waiting request may preempt running work this many levels less urgent when the
    # batch is full (None: never; SGLang's --priority-scheduling-preemption-threshold).
    preemption_threshold: int | None = 1
    # fair: token service is weighted per tenant; a tenant's share is its weight over the sum.
    tenant_weights: tuple[tuple[str, float], ...] = ()
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
        if self.priority_aging_s is not None and self.priority_aging_s <= 0:
            raise ValueError(f"priority_aging_s must be > 0 or None, got {self.priority_aging_s}")
        if self.preemption_threshold is not None and self.preemption_threshold < 1:
            raise ValueError(
                f"preemption_threshold must be >= 1 or None, got {self.preemption_threshold}"
            )
        for tenant, weight in self.tenant_weights:
            if not weight > 0:
                raise ValueError(f"tenant_weights: weight of {tenant!r} must be > 0, got {weight}")
        if not self.default_tenant_weight > 0:
            raise ValueError(f"default_tenant_weight must be > 0, got {self.default_tenant_weight}")
        if self.prompt_token_cost < 0 or self.output_token_cost < 0:
            raise ValueError("prompt_token_cost and output_token_cost must be >= 0")


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    """LoRA adapters served beside the base model (surge/engine/lora_manager.py)."""

    enable_lora: bool = False  # implied by `adapters`; alone: adapters come at run time
    max_loras: int = 4  # adapters resident at once, each in its own slot
    max_lora_rank: int = 16  # slots are sized for this rank; larger adapters are refused
    adapters: tuple[tuple[str, str], ...] = ()  # (name, PEFT folder) loaded at start

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
    """Speculative decoding with prompt-lookup drafts (surge/engine/ngram.py); vLLM's
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


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
