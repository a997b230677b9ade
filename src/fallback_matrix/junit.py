"""Counts from a pytest JUnit XML report."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JUnitCounts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.errors + self.skipped

    def __add__(self, other: JUnitCounts) -> JUnitCounts:
        return JUnitCounts(
            self.passed + other.passed,
            self.failed + other.failed,
            self.errors + other.errors,
            self.skipped + other.skipped,
        )


def _attr(element: ET.Element, name: str) -> int:
    try:
        return int(element.get(name, "0"))
    except ValueError:
        return 0


def read_counts(report: Path) -> JUnitCounts | None:
    """The counts of ``report``; None when it is missing or unreadable."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = JUnitCounts()
    for suite in suites:
        tests, failures = _attr(suite, "tests"), _attr(suite, "failures")
        errors, skipped = _attr(suite, "errors"), _attr(suite, "skipped")
        total += JUnitCounts(max(tests - failures - errors - skipped, 0), failures, errors, skipped)
    return total
