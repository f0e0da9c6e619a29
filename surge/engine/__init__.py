"""The engine in four parts: `client` (the API process's side, no torch), `core` (the step loop,
scheduler and KV blocks), `runner` (tensors, the model, the KV cache's memory) and `sample`.
`config` and `llm` (the offline LLM) compose them."""
