"""Every relay test restores torch_fallback's settings (tests/conftest.py)."""

import pytest


@pytest.fixture(autouse=True)
def _restore_settings(fallback_settings: None) -> None:
    """Autouse: even tests without a placement leave the settings as they found them."""
