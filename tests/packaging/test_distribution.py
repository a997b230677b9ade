"""The installed distribution says which torch it was built for: users' pip relies on it."""

from __future__ import annotations

from importlib import metadata

import torch
from packaging.requirements import Requirement
from packaging.version import Version

RELEASE = Version(torch.__version__).public  # 2.13.0+cpu -> 2.13.0


def test_the_wheel_requires_exactly_the_torch_release_it_runs_with():
    requires = [Requirement(text) for text in metadata.requires("torch-fallback") or []]
    torch_pins = [str(req.specifier) for req in requires if req.name == "torch"]
    assert torch_pins == [f"=={RELEASE}"]


def test_the_version_label_if_any_names_that_torch_release():
    version = Version(metadata.version("torch-fallback"))
    label = version.local or ""  # no label: the build that goes to PyPI
    assert label == "" or label.startswith(f"pt{RELEASE.replace('.', '')}"), version
