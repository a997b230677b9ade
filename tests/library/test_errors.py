"""Clear errors: a target PyTorch cannot serve, views, mixed devices, bad settings."""

from __future__ import annotations

import re

import pytest
import torch

import torch_fallback
import torch_fallback.relay
from torch_fallback import settings


def relay(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to("relay")


@pytest.mark.cpu_wheel
def test_cuda_target_on_a_cpu_only_torch():
    x = relay(torch.randn(4))
    torch_fallback.set_target("cuda")
    with pytest.raises(RuntimeError, match="was built without CUDA") as error:
        torch.nonzero(x)
    assert "aten::nonzero" in str(error.value)
    assert "TORCH_FALLBACK_TARGET=cpu" in str(error.value)
    stats = torch_fallback.metrics()["aten::nonzero"]
    # Counted where it was meant to run, as a call that failed there.
    assert (stats.errors, stats.calls_cuda, stats.calls_cpu) == (1, 1, 0)


@pytest.mark.cuda_wheel
def test_cuda_target_without_a_gpu():
    if torch.cuda.device_count() > 0:
        pytest.skip("a GPU is visible here; this test is about a CUDA build without one")
    x = relay(torch.randn(4))
    torch_fallback.set_target("cuda")
    with pytest.raises(RuntimeError, match="no GPU is visible") as error:
        torch.nonzero(x)
    assert "aten::nonzero" in str(error.value)


def test_cuda_home_without_a_usable_gpu_fails_at_the_first_allocation():
    if torch.cuda.device_count() > 0:
        pytest.skip("a GPU is visible here, so a CUDA home is valid")
    torch_fallback.relay.set_home("cuda")
    for target in ("cpu", "auto"):  # the home is what fails, whatever the target
        torch_fallback.set_target(target)
        with pytest.raises(RuntimeError, match="relay's home is 'cuda'") as error:
            torch.empty(3, device="relay")
        assert "set_home('cpu')" in str(error.value)
        assert "Use the CPU target" not in str(error.value)


def test_auto_target_without_a_gpu_runs_on_the_cpu():
    if torch.cuda.device_count() > 0:
        pytest.skip("a GPU is visible here, so auto picks CUDA")
    torch_fallback.set_target("auto")
    x = torch.tensor([0.0, 2.0])
    torch.testing.assert_close(torch.nonzero(relay(x)).cpu(), torch.nonzero(x))
    assert torch_fallback.metrics()["aten::nonzero"].calls_cpu == 1


def test_an_op_returning_a_view_is_refused():
    # Every aten view serves relay natively; a library's view op with a CPU
    # kernel only reaches the fallback, which cannot return a view.
    library = torch.library.Library("fallback_view_test", "DEF")
    library.define("flat(Tensor(a) self) -> Tensor(a)")
    library.impl("flat", lambda self: self.view(-1), "CPU")
    with pytest.raises(NotImplementedError, match="returns a view of its input") as error:
        torch.ops.fallback_view_test.flat(relay(torch.randn(2, 3)))
    assert "fallback_view_test::flat" in str(error.value)
    assert torch_fallback.metrics()["fallback_view_test::flat"].errors == 1


def test_view_as_real_is_a_native_relay_view():
    z = relay(torch.randn(3, dtype=torch.complex64))
    real = torch.view_as_real(z)
    real.mul_(0)
    assert torch.count_nonzero(torch.view_as_real(z)).item() == 0


@pytest.mark.parametrize(
    "write",
    [
        lambda r: torch.sum(r, 0, out=torch.empty(())),
        lambda r: torch.exp(r[1], out=torch.empty(())),
        lambda r: torch.max(r, 0, out=(torch.empty(()), torch.empty((), dtype=torch.long))),
        lambda r: torch.tensor(1.0).add_(r[1]),
    ],
    ids=["out", "out-of-0-dim", "two-outs", "in-place"],
)
def test_a_result_is_never_written_to_a_cpu_scalar(write):
    # A 0-dim CPU tensor is a scalar an op may read; CUDA refuses to write one.
    with pytest.raises(RuntimeError, match="would write its result into a tensor on cpu"):
        write(relay(torch.arange(3.0)))


def test_relay_and_a_non_scalar_cpu_tensor_in_one_op():
    with pytest.raises(
        RuntimeError, match="got a tensor on cpu together with relay tensors"
    ) as error:
        torch.cat([relay(torch.randn(3)), torch.randn(3)])
    assert "aten::cat" in str(error.value)


@pytest.mark.parametrize(
    "mix",
    [
        lambda r: r + torch.randn(3),
        lambda r: torch.cat([r, torch.randn(3)]),
        lambda r: torch.add(r, r, out=torch.empty(3)),
        lambda r: torch._foreach_add([r], [torch.randn(3)]),
        lambda r: torch.clamp(r, min=torch.tensor(0.0)),
    ],
    ids=["binary", "list", "out", "foreach", "checked-scalar"],
)
def test_a_mixed_device_refusal_carries_eagers_words(mix):
    # Code that catches eager's refusal (accelerate's, users') matches its words.
    eager = "Expected all tensors to be on the same device, but found at least two devices, "
    with pytest.raises(RuntimeError, match=re.escape(eager + "relay:0 and cpu!")):
        mix(relay(torch.randn(3)))


def test_a_foreach_op_refuses_a_cpu_tensor_in_its_lists():
    # CUDA gives each result on its input's device and refuses to write across
    # devices; a relay result for a CPU input, or a silent write, would be neither.
    on_relay, on_cpu = relay(torch.ones(3)), torch.ones(3)
    message = "got a tensor on cpu in a list together with relay tensors"
    with pytest.raises(RuntimeError, match=message):
        torch._foreach_add_([on_relay], [on_cpu])
    torch.testing.assert_close(on_relay.cpu(), torch.ones(3))
    with pytest.raises(RuntimeError, match=message):
        torch._foreach_mul([on_relay, on_cpu], 2.0)
    for in_place in (False, True):  # the in-place op has an unboxed kernel
        with pytest.raises(RuntimeError, match=message):
            (torch._foreach_mul_ if in_place else torch._foreach_mul)(
                [on_relay, torch.tensor(1.0)], 2.0
            )


def test_a_foreach_op_takes_its_scalars_as_cpu_tensors():
    x = torch.randn(3)
    on_relay = relay(x)
    torch._foreach_mul_([on_relay], torch.tensor(2.0))
    torch._foreach_addcdiv_([on_relay], [on_relay], [on_relay], torch.tensor([0.5]))
    torch.testing.assert_close(on_relay.cpu(), x * 2 + 0.5)
    # 0-dim CPU tensors in a later list, as CUDA's per-tensor path takes them.
    (added,) = torch._foreach_add([on_relay], [torch.tensor(1.0)])
    (larger,) = torch._foreach_maximum([on_relay], [torch.tensor(0.0)])
    assert added.device.type == "relay" and larger.device.type == "relay"
    torch.testing.assert_close(added.cpu(), x * 2 + 1.5)
    torch.testing.assert_close(larger.cpu(), (x * 2 + 0.5).clamp(min=0))


def test_foreach_copy_copies_between_relay_and_the_cpu():
    # As CUDA's: one copy_ per tensor where the devices differ (FSDP's
    # ShardedGradScaler copies its found_inf flags to the CPU so).
    on_cpu = [torch.randn(3), torch.randn(2)]
    on_relay = [relay(torch.zeros(3)), relay(torch.zeros(2))]
    torch._foreach_copy_(on_relay, on_cpu)
    back = [torch.zeros(3), torch.zeros(2)]
    torch._foreach_copy_(back, on_relay)
    for copied, original in zip(back, on_cpu, strict=True):
        torch.testing.assert_close(copied, original)


def test_an_optimizer_whose_state_stayed_on_the_cpu_says_what_to_do():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), foreach=True)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()  # its state is made on the CPU
    model.to("relay")
    model(relay(torch.randn(4, 3))).sum().backward()
    with pytest.raises(RuntimeError, match="move the model before the optimizer's first step"):
        optimizer.step()


def test_indexing_takes_cpu_indices_but_not_a_cpu_tensor_to_index():
    # CUDA: "indices should be either on cpu or on the same device as the indexed tensor".
    x = torch.arange(6.0)
    index, mask = relay(torch.tensor([4, 1])), relay(x > 2)
    attempts = (lambda: x[index], lambda: x[mask], lambda: x.index_put_((index,), x[:2]))
    refused = (
        "got a tensor on cpu together with relay tensors"
        "|would write its result into a tensor on cpu"
    )
    for index_cpu_tensor in attempts:
        with pytest.raises(RuntimeError, match=refused):
            index_cpu_tensor()
    torch.testing.assert_close(x, torch.arange(6.0))
    torch.testing.assert_close(relay(x)[index.cpu()].cpu(), x[torch.tensor([4, 1])])


def test_a_generator_of_another_device_is_refused_as_eager_refuses_it():
    def wrong_generator(expected: str, found: str) -> str:
        return f"Expected a '{expected}' device type for generator but found '{found}'"

    with pytest.raises(RuntimeError, match=wrong_generator("relay", "cpu")):
        torch.randn(3, device="relay", generator=torch.Generator())
    relay_generator = torch.Generator(device="relay")
    with pytest.raises(RuntimeError, match=wrong_generator("cpu", "relay")):
        torch.randn(3, generator=relay_generator)
    with pytest.raises(RuntimeError, match=wrong_generator("cpu", "relay")):
        list(torch.utils.data.RandomSampler(range(5), generator=relay_generator))
    assert torch.randn(3, device="relay", generator=relay_generator).device.type == "relay"


@pytest.mark.requires_cuda
def test_relay_and_cuda_tensors_in_one_op():
    with pytest.raises(RuntimeError, match="got a tensor on cuda:0 together with relay tensors"):
        torch.cat([relay(torch.randn(3)), torch.randn(3, device="cuda")])


@pytest.mark.requires_cuda
def test_cuda_target_restores_the_callers_current_device():
    torch_fallback.set_target("cuda")
    before = torch.cuda.current_device()
    torch.nonzero(relay(torch.tensor([0.0, 1.0])))
    assert torch.cuda.current_device() == before
    assert torch_fallback.metrics()["aten::nonzero"].calls_cuda == 1


def test_failed_in_place_op_leaves_its_input_unchanged_and_names_op_and_target():
    x = relay(torch.arange(6.0).reshape(2, 3))
    before = x.cpu()
    with pytest.raises(RuntimeError, match="shape mismatch") as error:
        x.index_put_((relay(torch.tensor([0, 1])),), relay(torch.ones(4)))
    message = str(error.value)
    assert "aten::_index_put_impl_" in message and "cpu fallback target" in message
    torch.testing.assert_close(x.cpu(), before)


@pytest.mark.parametrize(
    ("setter", "value", "valid"),
    [
        (settings.set_target, "gpu", "'cpu', 'cuda' and 'auto'"),
        (settings.set_cuda_sync, "sometimes", "'stream' and 'device'"),
        (torch_fallback.relay.set_home, "disk", "'cpu' (host memory) and 'cuda'"),
        (settings.set_cpu_ops, ["nonzero"], "'namespace::op'"),
    ],
)
def test_bad_settings_list_what_is_valid(setter, value, valid):
    with pytest.raises(ValueError, match="torch_fallback") as error:
        setter(value)
    assert valid in str(error.value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TORCH_FALLBACK_TARGET", "gpu"),
        ("TORCH_FALLBACK_CPU_OPS", "aten::nonzero,bad name"),
        ("TORCH_FALLBACK_CUDA_SYNC", "never"),
    ],
)
def test_bad_environment_is_a_clear_error(variable, value):
    with pytest.raises(ValueError, match=variable):
        settings.apply_environment({variable: value})


def test_environment_sets_target_and_cpu_ops():
    settings.apply_environment(
        {
            "TORCH_FALLBACK_TARGET": "auto",
            "TORCH_FALLBACK_CPU_OPS": "aten::nonzero, aten::sort.stable",
        }
    )
    assert settings.get_target() == "auto"
    assert settings.get_cpu_ops() == ["aten::nonzero", "aten::sort.stable"]


def test_target_context_manager_restores_the_previous_target():
    torch_fallback.set_target("cpu")
    with torch_fallback.target("auto"):
        assert torch_fallback.get_target() == "auto"
    assert torch_fallback.get_target() == "cpu"
