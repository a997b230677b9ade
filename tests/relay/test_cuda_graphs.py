"""CUDA graphs of relay ops: capture, replay, the graph's private memory pool,
make_graphed_callables, and an op that cannot be captured.

relay tensors homed on the GPU with the CUDA target run CUDA kernels on the current
stream, so torch.cuda.graph captures them as it captures CUDA ops; tensors allocated
during the capture come from the graph's private pool.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.requires_cuda


@pytest.fixture(autouse=True)
def on_the_gpu(fallback_settings: None) -> None:
    import torch_fallback
    import torch_fallback.relay

    torch_fallback.set_target("cuda")
    torch_fallback.relay.set_home("cuda")


def warm_up(fn, *args) -> None:
    """What PyTorch asks before a capture: a few runs on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)


def block(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Elementwise, matmul, reduction and normalization ops of one model block."""
    hidden = torch.nn.functional.gelu(x @ weight + 1.0)
    hidden = torch.nn.functional.layer_norm(hidden, hidden.shape[-1:])
    return hidden.softmax(dim=-1) * hidden.sum(dim=-1, keepdim=True)


def test_replay_computes_what_eager_relay_computes_on_new_inputs():
    torch.manual_seed(0)
    x = torch.randn(8, 64, device="relay")
    weight = torch.randn(64, 64, device="relay")
    warm_up(block, x, weight)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = block(x, weight)
    for _ in range(3):
        x.copy_(torch.randn(8, 64))
        graph.replay()
        torch.cuda.synchronize()
        assert y.device.type == "relay"
        torch.testing.assert_close(y.cpu(), block(x, weight).cpu(), rtol=0, atol=0)


def test_tensors_made_in_a_capture_come_from_the_graphs_private_pool():
    x = torch.randn(1024, device="relay")
    warm_up(lambda t: t * 2 + 1, x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2 + 1
    segments = torch.cuda.memory_snapshot()
    address = y.data_ptr()
    (segment,) = [s for s in segments if s["address"] <= address < s["address"] + s["total_size"]]
    assert tuple(segment["segment_pool_id"]) == tuple(graph.pool())
    graph.replay()
    torch.testing.assert_close(y.cpu(), x.cpu() * 2 + 1)


def test_a_captured_backward_replays_the_gradients_of_new_inputs():
    # Autograd runs relay's backward on its device thread, on the stream the forward
    # recorded: the capture stream, so the backward kernels are captured too.
    torch.manual_seed(0)
    x = torch.randn(8, 64, device="relay")
    weight = torch.randn(64, 64, device="relay", requires_grad=True)

    def gradient():
        return torch.autograd.grad(block(x, weight).square().sum(), weight)[0]

    warm_up(gradient)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grad = gradient()
    for _ in range(3):
        x.copy_(torch.randn(8, 64))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(grad.cpu(), gradient().cpu())


def test_relay_streams_are_the_cuda_streams_of_its_gpu():
    # What autograd records for a node and makes current for its backward.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        current = torch.accelerator.current_stream(0)
        assert current.device.type == "relay" and current.stream_id == side.stream_id
    assert torch.accelerator.current_stream(0).stream_id == torch.cuda.current_stream().stream_id


# In a process of its own, as a failed capture can leave the CUDA generator mid-capture
# ("Offset increment outside graph capture"), failing every later random op.
GRAPHED_TRAINING = """
import torch
from torch import nn
import torch_fallback, torch_fallback.relay

torch_fallback.set_target("cuda")
torch_fallback.relay.set_home("cuda")
torch.manual_seed(0)
plain = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("relay")
graphed_module = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to("relay")
graphed_module.load_state_dict(plain.state_dict())
# as PyTorch asks: the sample's requires_grad is the real inputs'
sample = torch.randn(16, 32, device="relay")
graphed = torch.cuda.make_graphed_callables(graphed_module, (sample,))
for step in range(3):
    x = torch.randn(16, 32, device="relay")
    for module in (plain, graphed):
        module.zero_grad()
        module(x).square().sum().backward()
    torch.cuda.synchronize()
    for (name, expected), got in zip(
        plain.named_parameters(), graphed_module.parameters(), strict=True
    ):
        torch.testing.assert_close(got.grad.cpu(), expected.grad.cpu(), msg=f"{name} {step}")
"""


def test_make_graphed_callables_trains_as_the_module_does():
    done = subprocess.run(
        [sys.executable, "-c", GRAPHED_TRAINING], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]


HOST_SYNC_IN_CAPTURE = """
import sys
import torch
import torch_fallback, torch_fallback.relay

torch_fallback.set_target("cuda")
torch_fallback.relay.set_home("cuda")
x = torch.randn(64, device=sys.argv[1])
graph = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(graph):
        x.nonzero()  # its output size needs the host to wait for the GPU
except RuntimeError as error:
    print("refused:", str(error).splitlines()[0])
else:
    sys.exit("the capture of nonzero() did not fail")
"""


@pytest.mark.parametrize("device", ["cuda", "relay"])
def test_an_op_that_synchronizes_the_host_fails_the_capture_as_on_cuda(device):
    # In a process of its own: a failed capture leaves the CUDA generator mid-capture,
    # on CUDA as on relay, and every later random op of the process fails.
    done = subprocess.run(
        [sys.executable, "-c", HOST_SYNC_IN_CAPTURE, device],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:] or done.stdout
    assert "refused:" in done.stdout
