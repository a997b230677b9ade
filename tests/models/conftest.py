"""Every zoo test restores torch_fallback's settings (tests/conftest.py)."""

import pytest


@pytest.fixture(autouse=True)
def _restore_settings(fallback_settings: None) -> None:
    """Autouse: the settings a test changes do not leak into the next one."""
