"""The API process's side of the engine: spawn the core, send it requests, turn its outputs into
text. Imports no torch and nothing of the core, the runner or the sampler
(tests/test_structure.py)."""
