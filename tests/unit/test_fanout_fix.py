"""The fix a cpu-fanout finding gives follows from what its sites' lines do."""

from __future__ import annotations

from profkit.analysis.attribution import SiteShare
from profkit.analysis.findings import byte_copy, fanout_fix
from profkit.bundle.frames import Frame

# The serving front's sites as the GPU host's captures placed them: the copy into shared memory
# (a Tensor.copy_() on its line) and the preprocessing's dtype conversion, whose kernel is
# aten::copy_ too.
SHM = "destination.copy_(pixel_values.view(torch.uint8).reshape(-1))  # the pool fans out"
TO_FLOAT = "x = image.unsqueeze(0).to(torch.float32) / 255.0"


def site(line: int, function: str, op: str | None, share: float, code: str | None) -> SiteShare:
    frame = Frame("/srv/recipes/mm_serving/front.py", function, line)
    return SiteShare(frame, op, "stack", share, share, 10, 10, code)


def test_a_copy_called_on_its_line_is_a_byte_copy() -> None:
    assert byte_copy(site(37, "to_shared_memory", "aten::copy_", 0.5, SHM))
    assert byte_copy(site(37, "to_shared_memory", "aten::copy_", 0.5, None))  # line not read
    assert not byte_copy(site(52, "preprocess", "aten::copy_", 0.5, TO_FLOAT))
    assert not byte_copy(site(56, "preprocess", None, 0.5, "x = (x - MEAN) / STD"))


def test_the_numpy_view_is_offered_for_the_byte_copy_only() -> None:
    copy = site(37, "to_shared_memory", "aten::copy_", 0.46, SHM)
    conversion = site(52, "preprocess", "aten::copy_", 0.33, TO_FLOAT)
    first = fanout_fix((copy, conversion))
    assert copy.site.label == "/srv/recipes/mm_serving/front.py:37"
    assert first.startswith(f"at {copy.site.label}, copy without the intra-op pool")
    # The conversion on top: the pool is capped; the shared-memory copy below it can still go
    # through a numpy view, the conversion never.
    second = fanout_fix((conversion, copy))
    assert second.startswith("several sites fan out (aten::copy_ at")
    assert f"the copy at {copy.site.label} can also go through a numpy view" in second
    alone = fanout_fix((conversion,))
    assert "numpy view" not in alone and "cap" in alone
    assert fanout_fix(()) == "cap the intra-op pool (OMP_NUM_THREADS / torch.set_num_threads)"
