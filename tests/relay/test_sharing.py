"""relay tensors sent to other processes through torch.multiprocessing share their
memory with the sender, as CPU tensors do (torch_fallback/relay/_sharing.py)."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp

import torch_fallback.relay

TIMEOUT_S = 120


def _add_in_place(tensor: torch.Tensor, value: float, done) -> None:
    """In a spawned process: writes the tensor it was sent, then says what it got."""
    with torch.no_grad():
        tensor.add_(value)
    done.put((str(tensor.device), type(tensor).__name__, tensor.requires_grad))


def _step_parameters(model: torch.nn.Module, done) -> None:
    """In a spawned process: one SGD step of the shared model, as Hogwild's workers take."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model(torch.ones(1, 3, device="relay")).sum().backward()
    optimizer.step()
    done.put([str(p.device) for p in model.parameters()])


def _echo(inbox, outbox) -> None:
    """In a spawned process: the tensors it is sent, described in plain Python."""
    for _ in range(2):
        tensor = inbox.get(timeout=TIMEOUT_S)
        outbox.put((str(tensor.device), type(tensor).__name__, tensor.cpu().tolist()))


class _Samples(torch.utils.data.Dataset):
    """Samples made on `device`, as a dataset that keeps its data there makes them."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.full((2,), float(i), device=self.device), "y": torch.tensor(i)}


def _spawned(target, *args):
    process = mp.get_context("spawn").Process(target=target, args=args)
    process.start()
    return process


@pytest.fixture
def host_home():
    with torch_fallback.relay.home("cpu"):
        yield


def test_a_view_sent_to_a_process_shares_the_senders_memory(host_home):
    base = torch.arange(6.0, device="relay")
    done = mp.get_context("spawn").Queue()
    process = _spawned(_add_in_place, base[2:5], 10.0, done)
    assert done.get(timeout=TIMEOUT_S) == ("relay:0", "Tensor", False)
    process.join(TIMEOUT_S)
    assert process.exitcode == 0
    # The child wrote through its view; every tensor over the storage sees it.
    assert base.cpu().tolist() == [0.0, 1.0, 12.0, 13.0, 14.0, 5.0]
    assert (base * 2).cpu().tolist() == [0.0, 2.0, 24.0, 26.0, 28.0, 10.0]


def test_a_model_shared_with_a_process_trains_in_place(host_home):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to("relay")
    expected = torch.nn.Linear(3, 2)  # the same step on the CPU
    expected.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    expected(torch.ones(1, 3)).sum().backward()
    torch.optim.SGD(expected.parameters(), lr=1.0).step()

    done = mp.get_context("spawn").Queue()
    process = _spawned(_step_parameters, model, done)
    assert done.get(timeout=TIMEOUT_S) == ["relay:0", "relay:0"]
    process.join(TIMEOUT_S)
    assert process.exitcode == 0
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value.cpu(), expected.state_dict()[name])


def test_tensors_through_a_queue_arrive_as_relay_tensors(host_home):
    context = mp.get_context("spawn")
    inbox, outbox = context.Queue(), context.Queue()
    process = _spawned(_echo, inbox, outbox)
    tensor = torch.tensor([1.0, 2.0], device="relay")
    parameter = torch.nn.Parameter(torch.tensor([3.0], device="relay"))
    inbox.put(tensor)
    inbox.put(parameter)
    assert outbox.get(timeout=TIMEOUT_S) == ("relay:0", "Tensor", [1.0, 2.0])
    assert outbox.get(timeout=TIMEOUT_S) == ("relay:0", "Parameter", [3.0])
    process.join(TIMEOUT_S)
    assert process.exitcode == 0


def test_the_reducer_moves_host_memory_to_shared_memory_once(host_home):
    tensor = torch.arange(4.0, device="relay")
    view = tensor[1:]
    assert not torch.ops.relay.home_view(tensor).untyped_storage().is_shared()
    allocated = torch_fallback.relay.memory_allocated()
    ForkingPickler.dumps(view)
    assert torch_fallback.relay.memory_allocated() == allocated  # the old bytes let go
    home = torch.ops.relay.home_view(tensor)
    assert home.untyped_storage().is_shared()
    assert tensor.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]  # the bytes moved with the storage
    ForkingPickler.dumps(tensor)
    assert torch.ops.relay.home_view(tensor).untyped_storage().data_ptr() == (
        home.untyped_storage().data_ptr()
    )
    tensor.add_(1)  # relay ops run on the shared bytes
    assert home.tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(0, device="relay"),
        lambda: torch.arange(6, device="relay", dtype=torch.int64)[2:],
        lambda: torch.randn(2, 3, device="relay").t(),
        lambda: torch.randn(4, device="relay", dtype=torch.bfloat16)[::2],
        lambda: torch.tensor([True, False, True], device="relay"),
        lambda: torch.randn(2, 2, device="relay", dtype=torch.complex64).conj(),
        lambda: torch.randn(2, 2, device="relay", dtype=torch.complex64).conj().imag,
    ],
    ids=["empty", "int64-offset", "transposed", "bf16-strided", "bool", "complex-conj", "neg"],
)
def test_dtypes_and_geometries_come_back_equal_over_the_same_memory(host_home, make):
    tensor = make()
    received = pickle.loads(ForkingPickler.dumps(tensor))  # the receiving side, here
    assert received.device == tensor.device and received.dtype == tensor.dtype
    assert received.shape == tensor.shape and received.stride() == tensor.stride()
    assert (received.is_conj(), received.is_neg()) == (tensor.is_conj(), tensor.is_neg())
    torch.testing.assert_close(received.cpu(), tensor.cpu(), equal_nan=True)
    if tensor.numel() > 0:
        assert torch.ops.relay.home_view(received).data_ptr() == (
            torch.ops.relay.home_view(tensor).data_ptr()
        )


def _sent(tensor: torch.Tensor) -> torch.Tensor:
    return pickle.loads(ForkingPickler.dumps(tensor))  # the receiving side, here


@pytest.mark.parametrize(
    "make",
    [
        lambda device: torch.ones(3, device=device),
        lambda device: torch.ones(3, device=device).add_(1),
        lambda device: torch.arange(6.0, device=device)[2:],
        lambda device: torch.randn(2, 2, device=device, dtype=torch.complex64).conj(),
        lambda device: torch.ones(2, device=device, requires_grad=True),
        lambda device: torch.nn.Parameter(torch.ones(2, device=device)),
        lambda device: torch.nn.Parameter(torch.ones(2, device=device), requires_grad=False),
    ],
    ids=["fresh", "written", "view", "conj", "requires-grad", "parameter", "frozen-parameter"],
)
def test_a_received_tensor_has_the_autograd_state_a_cpu_tensor_gets(host_home, make):
    received, expected = _sent(make("relay")), _sent(make("cpu"))
    assert type(received) is type(expected)
    assert received._version == expected._version  # what autograd checks saved tensors by
    assert (received.requires_grad, received.is_leaf) == (expected.requires_grad, expected.is_leaf)
    assert received.grad_fn is None and expected.grad_fn is None
    with torch.no_grad():
        received.add_(1)  # counted as eager counts it
        expected.add_(1)
    assert received._version == expected._version


def test_dataloader_workers_send_relay_batches_as_cpu_batches(host_home):
    def batches(device: str) -> list:
        loader = torch.utils.data.DataLoader(
            _Samples(device), batch_size=4, num_workers=2, multiprocessing_context="spawn"
        )
        return [
            (str(b["x"].device), b["x"].cpu().tolist(), b["x"]._version, b["y"].tolist())
            for b in loader
        ]

    relay, cpu = batches("relay"), batches("cpu")
    assert [batch[0] for batch in relay] == ["relay:0", "relay:0"]
    assert [batch[1:] for batch in relay] == [batch[1:] for batch in cpu]


def test_other_tensors_keep_torchs_own_reduction():
    reduced = ForkingPickler._extra_reducers[torch.Tensor](torch.ones(2))
    assert reduced[0] is torch.multiprocessing.reductions.rebuild_tensor
    # Plain pickling (torch.save's path) is not torch.multiprocessing's.
    assert pickle.loads(pickle.dumps(torch.ones(2, device="relay"))).device.type == "relay"


def test_a_non_leaf_that_requires_grad_gets_torchs_error(host_home):
    leaf = torch.ones(2, device="relay", requires_grad=True)
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        ForkingPickler.dumps(leaf * 2)


def test_the_reducer_serves_every_tensor_class_torch_registered():
    wrapped = [
        cls
        for cls, reduce in ForkingPickler._extra_reducers.items()
        if getattr(reduce, "__qualname__", "").startswith("_wrapped")
    ]
    assert torch.Tensor in wrapped and torch.nn.Parameter in wrapped


@pytest.mark.requires_cuda
def test_gpu_memory_is_refused_with_what_to_do_instead():
    with torch_fallback.relay.home("cuda"):
        tensor = torch.ones(2, device="relay")
    with pytest.raises(RuntimeError, match=r"home 'cuda'.*cannot be sent to another process"):
        ForkingPickler.dumps(tensor)
