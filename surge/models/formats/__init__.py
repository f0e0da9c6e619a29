"""Model files without torch: GGUF metadata and vocabularies, Hugging Face folders, the tokenizer
and chat templates, the architecture's spec, model aliases. The API process reads these."""
