"""A 0-dim CPU tensor among relay tensors is a scalar exactly where eager CUDA takes it.

PyTorch's generated CUDA kernels check that all of an op's tensors are on one device,
unless native_functions.yaml marks the op ``device_check: NoCheck`` (TensorIterator's
ops, indexing, the _foreach_ ops), which take a 0-dim CPU tensor as a scalar. On a CUDA
target the kernels check it themselves; on the CPU target every tensor a kernel sees is a
CPU tensor, so the fallback checks it: both targets answer as eager CUDA does.
"""

from __future__ import annotations

import pytest
import torch

from torch_fallback._cuda_device_checks import device_checked_ops, parse_device_checked
from torch_fallback._loader import read_build_info

# Ops marked device_check: NoCheck whose kernels take the 0-dim CPU tensor `s` as a
# scalar on CUDA too (not every such op does: some TensorIterator configurations refuse
# it, and the CPU target then takes what CUDA would refuse).
TAKE_CPU_SCALARS = {
    "add": lambda a, b, s: a + s,
    "mul": lambda a, b, s: torch.mul(a, s),
    "where": lambda a, b, s: torch.where(a > 0, b, s),
    "masked_fill": lambda a, b, s: a.masked_fill(a > 0, s),
    "pow": lambda a, b, s: a.abs() ** s,
    "maximum": lambda a, b, s: torch.maximum(a, s),
    "copy_": lambda a, b, s: a.clone().copy_(s),
    "fill_": lambda a, b, s: a.clone().fill_(s),
    "_foreach_mul": lambda a, b, s: torch._foreach_mul([a, b], s)[1],
}

# Ops whose CUDA kernels check devices: eager CUDA refuses the 0-dim CPU tensor.
REFUSE_CPU_SCALARS = {
    "aten::equal": lambda a, s: torch.equal(a[0], s),
    "aten::clamp.Tensor": lambda a, s: torch.clamp(a, min=s),
    "aten::index_select": lambda a, s: torch.index_select(a, 0, s.long()),
    "aten::take": lambda a, s: torch.take(a, s.long()),
    "aten::isin.Tensor_Tensor": lambda a, s: torch.isin(a, s),
    "aten::searchsorted.Tensor": lambda a, s: torch.searchsorted(a.sort().values, s),
}


def operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(4), torch.randn(4), torch.tensor(0.5)


@pytest.mark.usefixtures("placement")
@pytest.mark.parametrize("op", sorted(TAKE_CPU_SCALARS))
def test_an_op_cuda_takes_a_cpu_scalar_for_takes_it(op):
    a, b, s = operands()
    got = TAKE_CPU_SCALARS[op](a.to("relay"), b.to("relay"), s)
    assert got.device.type == "relay"
    torch.testing.assert_close(got.cpu(), TAKE_CPU_SCALARS[op](a, b, s))


@pytest.mark.usefixtures("placement")
@pytest.mark.parametrize("op", sorted(REFUSE_CPU_SCALARS))
def test_an_op_whose_cuda_kernel_checks_devices_refuses_a_cpu_scalar(op):
    a, _, s = operands()
    REFUSE_CPU_SCALARS[op](a, s)  # all on the CPU, the op runs
    with pytest.raises(RuntimeError, match="0-dim CPU tensors too") as error:
        REFUSE_CPU_SCALARS[op](a.to("relay"), s)
    assert op in str(error.value) and "Move it there first" in str(error.value)
    # With the scalar on relay too, the op runs.
    REFUSE_CPU_SCALARS[op](a.to("relay"), s.to("relay"))


@pytest.mark.requires_cuda
@pytest.mark.parametrize("op", sorted(REFUSE_CPU_SCALARS))
def test_eager_cuda_refuses_the_cpu_scalar_too(op):
    """The list read from native_functions.yaml says what CUDA's kernels do. No autograd
    runs here, so eager CUDA may share the process with relay (pytorch/pytorch#161129)."""
    a, _, s = operands()
    with pytest.raises(RuntimeError, match=r"same device|different devices"):
        REFUSE_CPU_SCALARS[op](a.cuda(), s)


@pytest.mark.requires_cuda
@pytest.mark.parametrize("op", sorted(TAKE_CPU_SCALARS))
def test_eager_cuda_takes_the_cpu_scalar(op):
    a, b, s = operands()
    got = TAKE_CPU_SCALARS[op](a.cuda(), b.cuda(), s)
    torch.testing.assert_close(got.cpu(), TAKE_CPU_SCALARS[op](a, b, s))


def test_the_checked_ops_are_read_from_torchs_own_operator_list():
    # The build recorded the list of the torch it built against, which is the one here.
    recorded = read_build_info()["cuda_device_checked_ops"]
    assert recorded == device_checked_ops()
    checked = set(recorded)
    assert set(REFUSE_CPU_SCALARS) <= checked
    for free in ("aten::add.Tensor", "aten::where.self", "aten::index.Tensor", "aten::copy_"):
        assert free not in checked


def test_the_operator_list_reader_follows_device_check_and_structured_delegates():
    text = """
- func: plain(Tensor self, Tensor other) -> Tensor
  dispatch:
    CPU, CUDA: plain_kernel

- func: iterator(Tensor self, Tensor other) -> Tensor
  device_check: NoCheck   # TensorIterator
  dispatch:
    CPU, CUDA: iterator_kernel

- func: cpu_only(Tensor self, Tensor other) -> Tensor
  dispatch:
    CPU: cpu_only_kernel
    CompositeExplicitAutograd: cpu_only_composite

- func: structured.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)
  structured: True
  dispatch:
    CUDA: structured_out

- func: structured(Tensor self) -> Tensor
  structured_delegate: structured.out

- func: composite(Tensor self) -> Tensor
  dispatch:
    CompositeExplicitAutograd: composite
"""
    assert parse_device_checked(text) == [
        "aten::plain",
        "aten::structured",
        "aten::structured.out",
    ]
