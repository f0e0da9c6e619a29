"""What an engine start pays for: nothing it does not use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from surge import LLM, SamplingParams
llm = LLM(sys.argv[1], dtype="float32")
out = llm.generate(["Hello"], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
assert len(out[0].outputs[0].token_ids) == 3
print("torch._dynamo" in sys.modules)
"""


def test_an_engine_start_and_its_steps_do_not_import_torch_dynamo(tiny_model_dir: Path) -> None:
    """torch._dynamo costs about a second to import (more on a slow machine); only --compile
    uses it. Arithmetic on the meta device (where the model is built) imported it before."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_model_dir)],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "False"
