"""A backend's backward leaves no OpenMP threads behind.

The autograd engine runs a backend's backward on a thread of its own (named
pt_autograd_<device>). A CPU kernel there starts an OpenMP team whose threads
outlive the backward and wait beside the main thread's team: with more OpenMP
threads than CPUs, every later parallel region of the main thread pays for it
(pytorch/pytorch#8280). The fallback lets that team go when the backward ends.
"""

import subprocess
import sys
import textwrap
from string import Template

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads the threads from /proc"
)

SCRIPT = Template(
    textwrap.dedent(
        """
    import collections, os, time
    import torch
    import torch_fallback
    import torch_fallback.relay

    torch.set_num_threads(2)  # a team of two, whatever the host's CPUs
    torch_fallback.set_target("cpu")
    torch_fallback.relay.set_home("cpu")

    def autograd_threads():
        names = []
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as comm:
                    names.append(comm.read().strip())
            except FileNotFoundError:  # a thread that just ended
                pass
        # A thread takes its creator's name: an OpenMP thread a pt_autograd_<n>
        # thread started has that name too.
        return collections.Counter(n for n in names if n.startswith("pt_autograd_"))

    # Above the grain size: the kernels run parallel regions, forward and backward.
    x = torch.randn(1 << 20).to("relay")
    weight = torch.randn(1 << 20).to("relay").requires_grad_()
    for _ in range($steps):
        loss = $step
        loss.backward()
    assert weight.grad is not None
    deadline = time.monotonic() + 10
    while max(autograd_threads().values(), default=0) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    counts = autograd_threads()
    print(dict(counts))
    assert counts, "the backward ran on no autograd thread"
    assert max(counts.values()) == 1, f"OpenMP threads left by the backward: {dict(counts)}"
    torch.testing.assert_close(weight.grad.cpu(), $grad)
    """
    )
)

STEPS = {
    # one op's backward, twice (a second graph task registers again)
    "mul": ("(x * weight).sum()", 2, "x.cpu() * 2"),
    # a chain whose backward runs several parallel kernels
    "chain": ("(torch.tanh(x * weight) * x).sum()", 1,
              "(1 - torch.tanh(x.cpu() * weight.detach().cpu()) ** 2) * x.cpu() ** 2"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(STEPS))
def test_a_backward_on_the_cpu_target_leaves_no_openmp_team(case):
    step, steps, grad = STEPS[case]
    script = SCRIPT.substitute(step=step, steps=steps, grad=grad)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
