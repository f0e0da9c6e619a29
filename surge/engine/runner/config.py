"""What the ModelRunner is told: which step paths it may build, and the sizes they need."""

from __future__ import annotations

from dataclasses import dataclass

from surge.engine.config import EngineConfig, LoRAConfig


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    block_size: int
    use_kernels: bool = True  # the compiled CPU kernels (paged decode, fused 4-bit stack)
    compile: bool = False  # pure-decode steps through torch.compile
    fused_decode: bool = True  # 4-bit models on a CPU: small steps on the fused stack
    cuda_graphs: bool = True  # a GPU's pure-decode steps replay CUDA graphs
    max_num_seqs: int = 256  # the most rows a decode step has (the graphs' largest bucket)
    max_model_len: int = 8192  # the longest context (the graphs' widest block table)
    batch_invariant: bool = False  # every step on the fused stack's batch-invariant twin
    lora: LoRAConfig | None = None  # adapter slots to build (None: LoRA not served)

    @classmethod
    def from_engine(cls, config: EngineConfig, max_model_len: int) -> RunnerConfig:
        """The runner's part of an engine's config; `max_model_len` as the loader capped it."""
        model = config.model
        return cls(
            block_size=config.cache.block_size,
            use_kernels=model.use_kernels,
            compile=model.compile,
            fused_decode=model.fused_decode,
            cuda_graphs=model.cuda_graphs,
            max_num_seqs=config.scheduler.max_num_seqs,
            max_model_len=max_model_len,
            batch_invariant=model.batch_invariant,
            lora=config.lora if config.lora.active else None,
        )
