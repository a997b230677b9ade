"""relay's answer to torch.compile's inductor backend: a clear refusal.

Inductor generates Triton or C++ kernels for a device; relay has no code
generator of its own (its ops run through the fallback), so graphs on relay
tensors are refused, naming relay and the backends that do work. Inductor
looks these classes up on the device module (torch.relay.Scheduling, ...)
when it compiles anything; they refuse only when a graph runs on relay.
"""

from __future__ import annotations

from typing import Any, NoReturn

MESSAGE = (
    "torch_fallback: torch.compile's inductor backend cannot generate code for relay tensors "
    "(relay has no kernel code generator; its ops run through torch-fallback). Use "
    "torch.compile(..., backend='aot_eager') or backend='eager', which run relay graphs."
)


class _Refusing(type):
    def __getattr__(cls, name: str) -> NoReturn:
        refuse()


class NoCodegen(metaclass=_Refusing):
    """Stands for inductor's scheduling and wrapper code generators on relay:
    using it in any way (an attribute, an instance) is the refusal."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        refuse()


def refuse() -> NoReturn:
    raise NotImplementedError(MESSAGE)


def codegen_class(name: str) -> type[NoCodegen]:
    """The class inductor asked for; registers relay's (empty) device op overrides
    first, which inductor reads before it asks for the wrapper code generator."""
    if name == "Scheduling":
        from torch._inductor.codegen.common import DeviceOpOverrides, register_device_op_overrides

        register_device_op_overrides("relay", DeviceOpOverrides())
    return NoCodegen


CODEGEN_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")
