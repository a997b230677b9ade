"""relay's generators in the form DTensor's RNG tracker reads and writes (one process;
test_distributed.py runs DTensor's random ops over ranks)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

import torch_fallback
from torch_fallback.relay import _dtensor_random
from torch_fallback.relay._imports import OnImport

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is not built in this torch"
)


def test_the_pair_is_sixteen_bytes_and_reading_it_draws_nothing():
    generator = torch.Generator("relay").manual_seed(3)
    before = generator.get_state()
    form = _dtensor_random.PhiloxForm(generator)
    assert form.get_state().numel() == 16 and form.get_state().dtype == torch.uint8
    assert torch.equal(form.get_state(), form.get_state())
    assert torch.equal(generator.get_state(), before)


def test_a_written_pair_gives_the_same_numbers_and_another_offset_others():
    with torch_fallback.target("cpu"):
        generator = torch.Generator("relay").manual_seed(3)
        form = _dtensor_random.PhiloxForm(generator)
        pair = form.get_state()

        def draw(offset: int) -> torch.Tensor:
            moved = pair.clone()
            moved[8:] = torch.tensor([offset]).view(torch.uint8)
            form.set_state(moved)
            return torch.rand(4, device="relay", generator=generator).cpu()

        assert torch.equal(draw(0), draw(0))
        assert not torch.equal(draw(0), draw(4))


def test_a_whole_state_passes_through():
    generator = torch.Generator("relay").manual_seed(3)
    whole = generator.get_state()
    expected = torch.rand(4, device="relay", generator=generator).cpu()
    _dtensor_random.PhiloxForm(generator).set_state(whole)
    assert torch.equal(torch.rand(4, device="relay", generator=generator).cpu(), expected)


def test_the_tracker_serves_relay_meshes():
    import torch.distributed.tensor._random as tracker_module

    assert tracker_module.OffsetBasedRNGTracker._relay_aware
    _dtensor_random.install()  # a second time changes nothing
    assert tracker_module.OffsetBasedRNGTracker.__base__.__name__ == "OffsetBasedRNGTracker"
    assert not getattr(tracker_module.OffsetBasedRNGTracker.__base__, "_relay_aware", False)


def test_on_import_runs_after_the_module_and_only_once(tmp_path, monkeypatch):
    (tmp_path / "late_module.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    finder = OnImport("late_module", lambda module: seen.append(module.VALUE))
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    assert importlib.util.find_spec("late_module") is not None  # a look imports nothing
    assert seen == [] and finder in sys.meta_path
    import late_module  # noqa: F401

    assert seen == [41] and finder not in sys.meta_path
    monkeypatch.delitem(sys.modules, "late_module")
