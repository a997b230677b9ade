"""What this process loaded: torch variant, CUDA, and who defines c10::cuda."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import torch

from . import settings
from ._extension import ops
from ._loader import mapped_files, read_build_info, release


@dataclass(frozen=True)
class Info:
    torch_version: str
    torch_variant: str
    cuda_built: bool
    cuda_available: bool
    cuda_device_count: int
    cuda_symbols: dict[str, str]
    cuda_stub_loaded: bool
    built_torch_version: str
    built_cuda_version: str | None
    relay: dict[str, object] | None  # home and device count, when relay is registered
    fallback_target: str
    cpu_ops: list[str]
    cuda_sync: str

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def built_for_other_torch(self) -> bool:
        return self.built_torch_version != self.torch_version


def cuda_stub_loaded() -> bool:
    return any(path.name.startswith("_C_cuda_functions") for path in mapped_files())


def relay_info() -> dict[str, object] | None:
    relay = sys.modules.get(f"{__package__}.relay")
    if relay is None:
        return None
    return {"home": relay.get_home(), "device_count": relay.device_count()}


def collect() -> Info:
    built = read_build_info()
    return Info(
        torch_version=str(torch.__version__),
        torch_variant=f"cuda {torch.version.cuda}" if torch.version.cuda else "cpu",
        cuda_built=torch.backends.cuda.is_built(),
        cuda_available=torch.cuda.is_available(),
        cuda_device_count=torch.cuda.device_count(),
        cuda_symbols={name: ops.cuda_symbol_provider(name) for name in ops.cuda_symbol_names()},
        cuda_stub_loaded=cuda_stub_loaded(),
        built_torch_version=built["torch_version"],
        built_cuda_version=built["cuda_version"],
        relay=relay_info(),
        fallback_target=settings.get_target(),
        cpu_ops=settings.get_cpu_ops(),
        cuda_sync=settings.get_cuda_sync(),
    )


def render(info: Info) -> str:
    lines = [
        f"torch                  {info.torch_version} ({info.torch_variant})",
        f"CUDA                   built: {info.cuda_built}, available: {info.cuda_available}, "
        f"devices: {info.cuda_device_count}",
        f"c10::cuda stub loaded  {info.cuda_stub_loaded}",
        "c10::cuda symbols resolved to:",
        *(f"  {name}  {path}" for name, path in info.cuda_symbols.items()),
        f"_C built against       torch {info.built_torch_version}"
        + (f" (CUDA {info.built_cuda_version})" if info.built_cuda_version else " (no CUDA)"),
        "relay                  "
        + (
            f"home: {info.relay['home']}, devices: {info.relay['device_count']}"
            if info.relay
            else "not registered (import torch_fallback.relay)"
        ),
        f"fallback               target: {info.fallback_target}, cuda sync: {info.cuda_sync}, "
        f"cpu ops: {', '.join(info.cpu_ops) or '-'}",
    ]
    if info.built_for_other_torch:
        same_release = release(info.built_torch_version) == release(info.torch_version)
        lines.append(
            f"WARNING: _C was built against torch {info.built_torch_version} and runs under "
            f"torch {info.torch_version}"
            + (" (same release, another variant)." if same_release else ".")
        )
    return "\n".join(lines)
