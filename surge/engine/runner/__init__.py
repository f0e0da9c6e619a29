"""The model runner: a scheduled step as tensors, through the model (eager, compiled, CUDA graphs
or the fused CPU stack), with the KV cache's memory, the loaded weights and LoRA adapters."""
