"""Shared fixtures: the real default model, a tiny random Llama written as an HF folder."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.process_marker import mark_process_tests
from tests.servers import ServerProcess

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


@pytest.fixture(scope="session", autouse=True)
def _process_logs_in_pytest_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Servers' and gateways' logs go under this session's pytest temp directory, which pytest
    prunes (the last three sessions are kept), not into /tmp, where every run left hundreds."""
    old = os.environ.get("SURGE_TEST_LOG_DIR")
    os.environ["SURGE_TEST_LOG_DIR"] = str(tmp_path_factory.getbasetemp() / "process-logs")
    yield
    if old is None:
        os.environ.pop("SURGE_TEST_LOG_DIR", None)
    else:
        os.environ["SURGE_TEST_LOG_DIR"] = old


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    """Path of the real SmolLM2-135M-Instruct GGUF (installed package, cache, or fetched)."""
    from surge.models.formats.resolve import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Folder of the real all-MiniLM-L6-v2 (installed package, cache, or fetched)."""
    from surge.models.formats.resolve import DEFAULT_EMBEDDING_MODEL, resolve_model

    return resolve_model(DEFAULT_EMBEDDING_MODEL)


def write_tiny_llama(
    folder: Path, gguf_path: Path, seed: int = 0, shapes: dict[str, int] | None = None
) -> Path:
    """A tiny random Llama as a Hugging Face folder, with SmolLM2's tokenizer and template;
    `shapes` overrides TINY_CONFIG's sizes."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    from surge.models.formats.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(GGUFReader(gguf_path))
    cfg = dict(TINY_CONFIG, vocab_size=tok.vocab_size) | (shapes or {})
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nh, nkv, vocab = cfg["num_attention_heads"], cfg["num_key_value_heads"], tok.vocab_size
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, std: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    # Untied head: a tied one makes a random model repeat its input token forever.
    weights = {
        "model.embed_tokens.weight": rnd(vocab, h, std=0.5),
        "lm_head.weight": rnd(vocab, h, std=0.25),
        "model.norm.weight": 1 + rnd(h),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": rnd(nh * hd, h),
            p + "self_attn.k_proj.weight": rnd(nkv * hd, h),
            p + "self_attn.v_proj.weight": rnd(nkv * hd, h),
            p + "self_attn.o_proj.weight": rnd(h, nh * hd),
            p + "mlp.gate_proj.weight": rnd(inter, h),
            p + "mlp.up_proj.weight": rnd(inter, h),
            p + "mlp.down_proj.weight": rnd(h, inter),
            p + "input_layernorm.weight": 1 + rnd(h),
            p + "post_attention_layernorm.weight": 1 + rnd(h),
        }
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    tok.backend.save(str(folder / "tokenizer.json"))
    tok_cfg = {
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "add_bos_token": False,
        "chat_template": tok.chat_template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf_path: Path) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), smollm2_gguf_path)


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """One `surge serve` of the tiny model for the whole session (server and gateway tests)."""
    server = ServerProcess(tiny_model_dir, "--dtype", "float32", "--enable-auto-tool-choice")
    yield server
    server.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_process_tests(items)  # `process`: the tests that start other processes
