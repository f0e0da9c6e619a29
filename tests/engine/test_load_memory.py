"""Loading holds the final weights and one tensor in flight, never a float32 model: measured as
the process's RSS high-water mark on a real-shape Q4_0 file; `surge info` says the file's
tensor bytes, the weights once loaded by form, the load's peak and KV bytes a token."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from surge.cli.main import main as cli_main
from surge.engine.runner.load_memory import load_peak_bytes
from surge.engine.runner.loader import load_memory_refusal
from surge.models.formats.model_files import open_model
from surge.models.forms import estimate_weight_bytes
from tests.models.test_shape_gguf import shapes

GIB = 1 << 30

# Run in a fresh process: the RSS high-water mark (VmHWM) is reset after torch, the kernels and
# the file's header are in, so it measures the load alone.
_MEASURE = """
import json, sys, torch
from surge.models.build import build_model
from surge.models.formats.model_files import open_model
from surge.models.forms import resident_by_form
from surge.models.kernels import load_int8_linear, load_q4_linear
from surge.models.quant import weight_bytes

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

load_int8_linear(), load_q4_linear()
files = open_model(sys.argv[1])
spec = files.spec
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the RSS now
base = status("VmRSS:")
model = build_model(spec, files.sources(), torch.device("cpu"), torch.float32, 4096, sys.argv[2])
print(json.dumps({"peak": status("VmHWM:") - base, "rss": status("VmRSS:") - base,
                  "weights": weight_bytes(model), "forms": resident_by_form(model),
                  "file": files.tensor_bytes}))
"""


@pytest.fixture(scope="module")
def llama_1b_layer_q4_0(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf_path: Path) -> Path:
    """Llama-3.2-1B's layer shapes (hidden 2048, FFN 8192, GQA, tied), one layer, a 16,384-token
    vocabulary: 94M parameters, 377 MB in float32, every matrix Q4_0 (53 MB)."""
    shape = replace(shapes.SHAPES["llama-3.2-1b"], layers=1, vocab=16384)
    path = tmp_path_factory.mktemp("shapes") / "llama-1b-1L.Q4_0.gguf"
    return shapes.write_shape_gguf(shape, path, smollm2_gguf_path, progress=False, kind="Q4_0")


def test_the_load_never_holds_a_float32_model(llama_1b_layer_q4_0: Path) -> None:
    spec = open_model(llama_1b_layer_q4_0).spec
    float32 = estimate_weight_bytes(spec, torch.float32, "none")
    cmd = [sys.executable, "-c", _MEASURE, str(llama_1b_layer_q4_0), "q4"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # The old build held the float32 model (377 MB) and then its quantized copy; this one the
    # 4-bit layers, a 4-bit embedding (the file's Q4_0, tied) and a chunk of rows in flight.
    assert got["peak"] < 0.4 * float32, got
    assert got["weights"] <= 1.12 * got["file"], got  # q4's float16 d and m: 20 bytes a block
    assert set(got["forms"]) <= {"q4", "float"}, got
    # The file's pages read while converting are dropped from the RSS: it holds the weights.
    assert got["rss"] < got["weights"] + 64 * (1 << 20), got


def test_info_says_the_files_bytes_the_weights_by_form_and_the_peak(
    smollm2_gguf_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["info", "--model", str(smollm2_gguf_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    lines = {line[:13].strip(): line[14:] for line in out.splitlines() if line[:1].strip()}
    tensor_bytes = open_model(smollm2_gguf_path).tensor_bytes
    assert lines["file"] == f"{tensor_bytes / (1 << 20):.1f} MiB of tensors (layers Q4_1)"
    assert "MiB once loaded (" in lines["weights"] and "the file's" in lines["weights"]
    if "quantization  q4" in out:  # the 4-bit kernel here: Q4_1 layers, Q8_0 embedding int8
        assert "q4 " in lines["weights"] and "int8 " in lines["weights"]
    assert "q4-int8" in lines["as others"]
    assert "GiB (the weights and the largest tensor in flight)" in lines["load peak"]
    assert "KiB/token" in lines["KV cache"]
    assert "configured 256" in lines["max_num_seqs"]


def test_an_8b_fits_where_its_float32_copy_did_not() -> None:
    """Llama-3.1-8B's shapes: the old build's float32 model alone was ~30 GiB, refused on a
    24 GiB machine; streamed, q4 needs its 4-bit layers, int8 embedding and head, and the
    head's int8 rows in flight (~6 GiB); below that it is refused in one line."""
    smollm2 = open_model(Path(shapes._smollm2())).spec
    big = replace(
        smollm2, vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, tie_word_embeddings=False,
    )  # fmt: skip
    final, peak = load_peak_bytes(big, torch.float32, "q4")
    assert 4 * GIB < final < peak < 7 * GIB
    assert load_memory_refusal(big, torch.float32, "q4", available=int(23.5 * GIB)) is None
    why = load_memory_refusal(big, torch.float32, "q4", available=5 * GIB)
    assert why is not None and "\n" not in why
    assert "5.0 GiB is available" in why and "largest tensor in flight" in why
