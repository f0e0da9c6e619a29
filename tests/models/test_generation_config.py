"""The model's recommended sampling: read from generation_config.json or a GGUF's
general.sampling.* keys, named by --generation-config, overridden field by field."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from surge.models.formats.generation_config import read_model_defaults, sampling_defaults


def test_a_folders_generation_config_gives_the_request_fields(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": True, "temperature": 0.6,
        "top_p": 0.95, "top_k": 20, "max_new_tokens": 512, "repetition_penalty": None,
    }))  # fmt: skip
    assert read_model_defaults(tmp_path) == {
        "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 512,
    }  # fmt: skip
    assert sampling_defaults(tmp_path, "vllm") == {}  # vLLM's name for "none of the model's"
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text('{"min_p": 0.05}')
    assert sampling_defaults(tmp_path, str(other)) == {"min_p": 0.05}
    over = sampling_defaults(tmp_path, "auto", {"temperature": 0.2, "max_new_tokens": 9})
    assert over["temperature"] == 0.2 and over["max_tokens"] == 9 and over["top_k"] == 20
    with pytest.raises(ValueError, match="not one of"):
        sampling_defaults(tmp_path, "auto", {"beams": 4})
    with pytest.raises(ValueError, match="no generation_config"):
        sampling_defaults(tmp_path, str(tmp_path / "missing"))
    assert read_model_defaults(tmp_path / "other" / "nothing") == {}


def test_a_ggufs_sampling_keys(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_float32("general.sampling.temp", 0.7)
    writer.add_int32("general.sampling.top_k", 40)
    writer.add_float32("general.sampling.penalty_repeat", 1.1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    found = read_model_defaults(path)
    assert found == {"temperature": pytest.approx(0.7), "top_k": 40,
                     "repetition_penalty": pytest.approx(1.1)}  # fmt: skip
    assert isinstance(found["top_k"], int)


def test_offline_generate_takes_the_models_defaults(tiny_model_dir: Path, tmp_path: Path) -> None:
    """LLM.generate with no SamplingParams samples as the model's files recommend (vLLM's
    get_default_sampling_params): top_k 1 is greedy, max_new_tokens the length."""
    import shutil

    from surge import LLM, SamplingParams

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "generation_config.json").write_text('{"top_k": 1, "max_new_tokens": 5}')
    llm = LLM(str(folder), dtype="float32", num_blocks=32)
    defaults = llm.get_default_sampling_params()
    assert defaults.top_k == 1 and defaults.max_tokens == 5 and defaults.temperature == 1.0
    [out] = llm.generate(["Hello there"], use_tqdm=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    [ref] = llm.generate(["Hello there"], greedy, use_tqdm=False)
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
