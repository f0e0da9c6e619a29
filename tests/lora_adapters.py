"""Real PEFT LoRA adapters for the tiny Llama, written by `peft` itself (random, not zero, B)."""

from __future__ import annotations

from pathlib import Path

import torch


def write_peft_adapter(
    model_dir: Path,
    out_dir: Path,
    *,
    r: int = 8,
    alpha: int = 16,
    targets: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ),
    seed: int = 0,
    use_rslora: bool = False,
    alpha_pattern: dict[str, int] | None = None,
    scale: float = 1.0,
) -> Path:
    """Save a PEFT LoRA adapter of the model at `model_dir` into `out_dir` and return it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=list(targets),
        use_rslora=use_rslora,
        alpha_pattern=alpha_pattern or {},
        init_lora_weights=False,  # random A and B: the adapter changes the output
    )
    torch.manual_seed(seed)
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(scale)
    model.save_pretrained(str(out_dir))
    return out_dir
