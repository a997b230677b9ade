"""Bounded caches: a store of cached entries (the cells' environments, the wheelhouses) kept under
a size cap by removing the least recently used entries first. The standard library only: a
cell's job prunes its environments where it runs, on an image's bare Python.

An entry is a directory of its store. Beside it, ``<name>.in-use``: every run that uses the entry
touches it (its mtime is the entry's last use) and holds a shared lock on it while it does. The
pruner removes an entry only while it holds that lock exclusively, so an entry in use by any run,
this one or another, is never removed.
"""

import fcntl
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fallback_matrix.errors import CapError

CACHE_ENV = "FALLBACK_MATRIX_CACHE"  # the cache root instead of the user's cache directory
CAP_ENV = "FALLBACK_MATRIX_CACHE_CAP"
DEFAULT_CAP = "20GB"
IN_USE_SUFFIX = ".in-use"
TRASH_SUFFIX = ".pruning"  # an entry being removed: renamed first, so no run sees half of it
UNITS = {
    "": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "KI": 2**10,
    "MI": 2**20,
    "GI": 2**30,
    "TI": 2**40,
}
NO_CAP = ("off", "none", "unlimited")


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the host keeps the wheelhouses, the local runner's cache, the local index:
    $FALLBACK_MATRIX_CACHE, else fallback-matrix in the user's cache directory
    ($XDG_CACHE_HOME, else ~/.cache), shared by every clone as the Docker volume is, so a new
    clone does not download its wheels again."""
    if configured := environ.get(CACHE_ENV):
        return Path(configured).resolve()
    user_cache = environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME", "~")) / ".cache"
    return Path(user_cache).expanduser().resolve() / "fallback-matrix"


def parse_cap(text: str) -> int | None:
    """Bytes of a cap written as ``20GB``, ``500M``, ``1.5GiB`` or bytes; None for ``off``."""
    cleaned = text.strip().upper().replace(" ", "").removesuffix("B")
    if cleaned.lower() in NO_CAP:
        return None
    number = cleaned.rstrip("KMGTI")
    unit = cleaned[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in UNITS or not value >= 0 or value == float("inf"):
        raise CapError(
            f"cache cap {text!r} is not a size: write it as bytes or with a unit, e.g. 20GB, "
            f"500MB, 1.5GiB (or off for no cap), in ${CAP_ENV} or --cache-cap"
        )
    return int(value * UNITS[unit])


def format_size(size: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def disk_usage(path: Path) -> int:
    """Bytes ``path`` takes on disk: its files' blocks, each inode once, links not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            try:
                info = os.lstat(os.path.join(directory, name))
            except OSError:  # removed meanwhile
                continue
            if info.st_nlink > 1:
                if (info.st_dev, info.st_ino) in seen:
                    continue
                seen.add((info.st_dev, info.st_ino))
            total += info.st_blocks * 512
    return total


@dataclass(frozen=True)
class Entry:
    path: Path
    size: int  # bytes
    last_used: float  # seconds since the epoch

    @property
    def name(self) -> str:
        return self.path.name


def in_use_file(entry: Path) -> Path:
    return entry.with_name(entry.name + IN_USE_SUFFIX)


def last_used(entry: Path) -> float:
    """When a run last used ``entry``: its in-use file's mtime, else the directory's own."""
    for candidate in (in_use_file(entry), entry):
        try:
            return candidate.stat().st_mtime
        except OSError:
            continue
    return 0.0


def scan(store: Path, size: Callable[[Path], int] = disk_usage) -> list[Entry]:
    """The entries of ``store``: its directories, hidden ones (fills and removals under way)
    left out."""
    if not store.is_dir():
        return []
    return [
        Entry(path, size(path), last_used(path))
        for path in sorted(store.iterdir())
        if path.is_dir() and not path.is_symlink() and not path.name.startswith(".")
    ]


def least_recently_used(entries: Collection[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda entry: (entry.last_used, entry.name))


@contextmanager
def in_use(entry: Path) -> Iterator[None]:
    """Mark ``entry`` used now, and keep it from being pruned until the block ends (a shared
    lock: other runs may use it too). Waits while a pruner is removing it."""
    marker = in_use_file(entry)
    marker.parent.mkdir(parents=True, exist_ok=True)
    with marker.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        os.utime(marker)
        yield  # closing the file releases the lock


def remove_entry(entry: Path) -> str | None:
    """Remove ``entry`` unless a run holds it; None when removed, else why not."""
    try:
        with in_use_file(entry).open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return "in use by a run"
            trash = entry.with_name(f".{entry.name}{TRASH_SUFFIX}")
            shutil.rmtree(trash, ignore_errors=True)
            entry.rename(trash)  # atomic: a run that comes now finds no entry and makes it anew
            shutil.rmtree(trash, ignore_errors=True)
    except OSError as error:
        return f"cannot be removed: {error}"
    return None


@dataclass
class Pruned:
    """What pruning one store did, for the run's output."""

    what: str  # e.g. "environments"
    store: Path
    cap: int
    before: int = 0
    entries: int = 0
    removed: list[Entry] = field(default_factory=list)
    kept: list[tuple[Entry, str]] = field(default_factory=list)  # over the cap, and why kept

    @property
    def freed(self) -> int:
        return sum(entry.size for entry in self.removed)

    @property
    def after(self) -> int:
        return self.before - self.freed

    def lines(self) -> list[str]:
        cap = f"the cap of {format_size(self.cap)} (${CAP_ENV}, --cache-cap)"
        head = f"cache of {self.what} {self.store}"
        if not self.removed and not self.kept:
            size = f"{format_size(self.before)} in {self.entries} entries"
            return [f"{head}: {size}, under {cap}; nothing pruned"]
        lines = []
        for entry in self.removed:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used))
            lines.append(
                f"{head}: pruned {entry.name} ({format_size(entry.size)}, last used {used})"
            )
        freed = f"freed {format_size(self.freed)}" if self.removed else "nothing pruned"
        lines.append(f"{head}: {freed}; {format_size(self.after)} left, {cap}")
        if self.after > self.cap:
            why = ", ".join(f"{entry.name} ({reason})" for entry, reason in self.kept)
            lines.append(
                f"{head}: still over the cap; kept {why}. Entries in use are never pruned: raise "
                f"the cap, or free disk space elsewhere"
            )
        return lines


def prune(
    store: Path,
    cap: int,
    keep: Collection[Path] = (),
    *,
    what: str = "entries",
    size: Callable[[Path], int] = disk_usage,
    remove: Callable[[Path], str | None] = remove_entry,
) -> Pruned:
    """Remove ``store``'s least recently used entries until it fits under ``cap`` bytes; never
    one in ``keep`` (this run's) nor one another run holds (``in_use``)."""
    for trash in store.glob(f".*{TRASH_SUFFIX}"):  # left by an interrupted removal
        shutil.rmtree(trash, ignore_errors=True)
    entries = scan(store, size)
    result = Pruned(what, store, cap, sum(entry.size for entry in entries), len(entries))
    kept = {path.resolve() for path in keep}
    for entry in least_recently_used(entries):
        if result.after <= cap:
            break
        problem = "in use by this run" if entry.path.resolve() in kept else remove(entry.path)
        if problem is None:
            result.removed.append(entry)
        else:
            result.kept.append((entry, problem))
    return result
