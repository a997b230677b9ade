"""relay's streams and events, for code that drives a device through them (FSDP2).

relay orders all the work of a device on one stream: the fallback runs host-homed
ops in call order and CUDA-homed ops on CUDA's current stream. So a side stream is
the device's stream under another name, waiting on a stream or an event is already
satisfied, and a host-side wait is a device synchronize.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

_PRIVATE_USE1 = 20  # c10::DeviceType::PrivateUse1, the device type torch.Stream takes


def _synchronize(device: torch.device) -> None:
    torch.relay.synchronize(device)  # type: ignore[attr-defined]


class Event:
    """A point on relay's one stream per device: complete once the work before it is."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.device: torch.device | None = None
        self.enable_timing = enable_timing
        self._recorded_at: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self.device = (stream or current_stream()).device
        if self.enable_timing:
            # The device's one stream runs in order: once it is synchronized, the
            # host's clock marks where the stream is.
            _synchronize(self.device)
            self._recorded_at = time.perf_counter()

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds from this event to `end_event`, as CUDA events give them."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._recorded_at is None or end_event._recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_at - self._recorded_at) * 1000.0

    def wait(self, stream: Stream | None = None) -> None:
        """Nothing to wait for: work on the stream is already ordered after the event."""

    def query(self) -> bool:
        self.synchronize()
        return True

    def synchronize(self) -> None:
        if self.device is not None:
            _synchronize(self.device)


class Stream(torch.Stream):
    """relay's stream of ``device``: every relay stream of a device is the same one.

    A ``torch.Stream``, as ``torch.cuda.Stream`` is: code that takes a device's
    streams generically (``Tensor.record_stream``, FSDP) takes it.
    """

    def __new__(
        cls, device: int | str | torch.device | None = None, priority: int = 0, **kwargs: object
    ) -> Stream:
        if kwargs:  # torch.Stream's own form: stream_id, device_index, device_type
            return super().__new__(cls, priority=priority, **kwargs)
        # relay:N as an index that exists (an IndexError otherwise), the current one for None.
        index = torch.relay._utils._get_device_index(device)  # type: ignore[attr-defined]
        # Stream 0 of the device, as its guard's default: no new stream is made.
        return super().__new__(
            cls, stream_id=0, device_index=index, device_type=_PRIVATE_USE1, priority=priority
        )

    def __init__(
        self, device: int | str | torch.device | None = None, priority: int = 0, **kwargs: object
    ) -> None:
        self.priority = priority

    def wait_stream(self, stream: Stream) -> None:
        """Already ordered: one stream per device."""

    def wait_event(self, event: Event) -> None:
        """Already ordered: one stream per device."""

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        self.synchronize()
        return True

    def synchronize(self) -> None:
        _synchronize(self.device)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(self.device)


def current_stream(device: int | str | torch.device | None = None) -> Stream:
    return Stream(device)


def default_stream(device: int | str | torch.device | None = None) -> Stream:
    return Stream(device)


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[None]:
    """``with torch.relay.stream(s):``: work inside runs on the device's one stream."""
    yield
