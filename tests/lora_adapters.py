"""LoRA adapters for tests: real PEFT ones for the tiny Llama, written by `peft` itself
(random, not zero, B), and random ones in PEFT's format for any model spec."""

from __future__ import annotations

from pathlib import Path

import torch

from surge.models.formats.spec import ModelSpec


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


def write_random_adapter(
    folder: Path, spec: ModelSpec, rank: int, seed: int, b_scale: float
) -> Path:
    """A PEFT-format LoRA adapter on every projection of every layer, random A and B (B scaled
    by `b_scale`: 0 makes one that changes nothing), lora_alpha = rank (a scaling of 1), for
    models without a transformers copy (the real SmolLM2 GGUF). The format is the one checked
    against PEFT itself in tests/engine/test_lora.py."""
    import json

    from safetensors.torch import save_file

    from surge.models.lora import TARGETS, module_shape, peft_module_name

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for module in TARGETS:
            in_f, out_f = module_shape(spec, module)
            key = f"base_model.model.{peft_module_name(layer, module)}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) / in_f**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * b_scale
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(TARGETS)}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder
