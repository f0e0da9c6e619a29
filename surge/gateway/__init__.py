"""`surge gateway`: one OpenAI-compatible address in front of many Surge (or vLLM) servers."""
