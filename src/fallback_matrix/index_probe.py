"""A quick reachability check of a package index (seconds, not pip's minute of retries)."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ProbeResult:
    url: str
    reachable: bool
    detail: str


def probe_index(url: str, project: str = "torch", timeout: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Whether ``url`` answers for ``project``'s page: one HEAD request, no retries."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        exists = Path(parsed.path).is_dir()
        return ProbeResult(url, exists, "directory exists" if exists else "no such directory")
    page = url.rstrip("/") + f"/{project}/"
    request = urllib.request.Request(page, method="HEAD", headers={"User-Agent": "fallback-matrix"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return ProbeResult(url, True, f"HTTP {response.status}")
    except urllib.error.HTTPError as error:
        return ProbeResult(url, False, f"HTTP {error.code} for {page}")
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return ProbeResult(url, False, str(reason) or type(error).__name__)
