"""What a capture keeps for the next one (host/bootcache.py): only root's, only in root's own
directory, never another boot's, and the same answer a fresh measurement gives."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profkit.capture.ebpf import btf, costs
from profkit.host import bootcache

from .conftest import StartRecipe, attach

pytestmark = [pytest.mark.live, pytest.mark.root]

NOBODY = 65534


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[bootcache.BootCache]:
    kept = bootcache.BootCache(tmp_path / "run" / "boot")
    monkeypatch.setattr(bootcache, "shared", lambda: kept)
    yield kept
    kept.close()


def entry(cache: bootcache.BootCache, name: str) -> Path:
    return cache.directory / f"{name}.{bootcache.boot_id()}"


def test_an_entry_is_kept_0600_in_a_0700_directory_and_stale_ones_go(
    cache: bootcache.BootCache,
) -> None:
    cache.put("one", b"first")
    assert cache.get("one") == b"first"
    assert oct(cache.directory.stat().st_mode & 0o777) == "0o700"
    assert oct(entry(cache, "one").stat().st_mode & 0o777) == "0o600"
    earlier = cache.directory / "one.0123456789abcdef"  # an earlier boot's
    earlier.write_bytes(b"stale")
    gone = subprocess.Popen(["true"])
    gone.wait()
    half = cache.directory / f".one.{bootcache.boot_id()}.{gone.pid}"  # a dead writer's
    half.write_bytes(b"half")
    writing = cache.directory / f".two.{bootcache.boot_id()}.{os.getppid()}"  # a live one's
    writing.write_bytes(b"")
    cache.put("two", b"second")
    assert writing.exists()
    writing.unlink()
    assert sorted(p.name for p in cache.directory.iterdir()) == sorted(
        [entry(cache, "one").name, entry(cache, "two").name]
    )


@pytest.mark.parametrize("how", ["others-may-enter", "another-owner", "a-link"])
def test_a_directory_not_roots_alone_is_neither_read_nor_written(tmp_path: Path, how: str) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (real / f"one.{bootcache.boot_id()}").write_bytes(b"planted")
    directory = real
    if how == "others-may-enter":
        real.chmod(0o755)
    elif how == "another-owner":
        os.chown(real, NOBODY, NOBODY)
    else:
        directory = tmp_path / "link"
        directory.symlink_to(real)
    cache = bootcache.BootCache(directory)
    try:
        assert cache.get("one") is None
        cache.put("two", b"written")
        assert [p.name for p in real.iterdir()] == [f"one.{bootcache.boot_id()}"]
        assert cache.reason
    finally:
        cache.close()


def test_an_entry_not_roots_or_a_link_is_not_read_nor_written_through(
    cache: bootcache.BootCache, tmp_path: Path
) -> None:
    cache.put("one", b"first")
    path = entry(cache, "one")
    os.chown(path, NOBODY, NOBODY)
    assert cache.get("one") is None
    path.unlink()
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    path.symlink_to(victim)
    assert cache.get("one") is None
    cache.put("one", b"second")  # the link is replaced, never written through
    assert victim.read_bytes() == b"untouched"
    assert not path.is_symlink() and cache.get("one") == b"second"


def test_the_kept_btf_index_is_the_one_a_fresh_pass_makes(cache: bootcache.BootCache) -> None:
    btf.kernel_btf.cache_clear()
    try:
        fresh = btf.kernel_btf()  # a pass over the types, kept
        [kept] = list(cache.directory.iterdir())
        assert kept.name.startswith("btf-index-") and kept.read_bytes() == fresh.index()
        btf.kernel_btf.cache_clear()
        again = btf.kernel_btf()  # from the kept index
        assert again._at == fresh._at and again._name_at == fresh._name_at
        assert again.named("task_struct") == fresh.named("task_struct") != []
        assert again.layout("task_struct") == fresh.layout("task_struct")
        # An index these bytes cannot have given (two starts swapped) is not taken, and is
        # replaced by a fresh pass's.
        starts = bytearray(fresh.index())
        starts[4:8], starts[8:12] = starts[8:12], starts[4:8]
        kept.write_bytes(bytes(starts))
        btf.kernel_btf.cache_clear()
        assert btf.kernel_btf()._at == fresh._at
        assert kept.read_bytes() == fresh.index()
    finally:
        btf.kernel_btf.cache_clear()


def test_a_calibration_is_kept_for_an_hour_and_only_for_its_loader(
    cache: bootcache.BootCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = costs.TrapCost(2e-6, 20e-6, "calibrated: by the test", time.time() - 60, 4242)
    assert costs._keep("core", made) is made
    kept = costs._kept("core")
    assert kept is not None and kept.kept
    assert (kept.emulated_s, kept.stepped_s, kept.made_by_pid) == (2e-6, 20e-6, 4242)
    assert kept.made_unix == made.made_unix
    assert kept.how.startswith("calibrated: by the test; made by pid 4242 at ")
    assert kept.as_record()["kept"] is True and made.as_record()["kept"] is False
    assert costs._kept("bcc") is None
    # An hour after it was made, it is made again.
    with monkeypatch.context() as later:
        later.setattr(time, "time", lambda: made.made_unix + costs.KEPT_S + 1)
        assert costs._kept("core") is None
    for bad in (
        b"{not json",
        json.dumps({"emulated_s": 1.0, "stepped_s": 0, "how": "", "unix": time.time(), "pid": 1}),
        json.dumps({"emulated_s": 0, "stepped_s": 0, "how": 7, "unix": time.time(), "pid": 1}),
        json.dumps(
            {"emulated_s": 0, "stepped_s": 0, "how": "", "unix": time.time() + 99, "pid": 1}
        ),
    ):
        cache.put("traps-core", bad if isinstance(bad, bytes) else bad.encode())
        assert costs._kept("core") is None, bad


def test_a_capture_uses_the_calibration_an_earlier_one_made(
    start_recipe: StartRecipe, tmp_path: Path
) -> None:
    """Two captures: the second's traps are a calibration made since the test began and kept
    (the first capture's, or that of another lane's capture that calibrated at the same time:
    the last to finish is kept)."""
    recipe = start_recipe("shm_fanout.py", "--copy", "torch", "--threads", "2", "--pause-ms", "10")
    began = time.time()
    for kept in bootcache.DIRECTORY.glob("traps-core.*"):
        kept.unlink()
    traps = []
    for name in ("first", "second"):
        result = attach(recipe.pid, tmp_path / name, "--ebpf-loader", "core", duration=0.5)
        assert result.returncode == 0, result.stderr
        traps.append(json.loads((tmp_path / name / "ebpf.json").read_text())["costs"]["traps"])
    first, second = traps
    assert second["kept"] is True and second["made_unix"] >= began - 1, second
    assert second["how"].startswith("calibrated: ") and "kept an hour" in second["how"]
    assert first["made_unix"] >= began - 1, first
