"""Weights as tensors: GGUF blocks dequantized or kept, safetensors shards (torch)."""
