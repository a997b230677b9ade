"""What torch_fallback gives the tests of a backend built on it (and its own tests).

plugin  a pytest plugin: the GPU and torch-build markers (requires_cuda,
        requires_two_gpus, cpu_wheel, cuda_wheel) and the rules that skip them,
        TORCH_FALLBACK_REQUIRE_GPU=1 turning a missing GPU into a failure.
        Enable it with ``pytest_plugins = ["torch_fallback.testing.plugin"]`` in the
        root conftest.py, or ``pytest -p torch_fallback.testing.plugin``.
calls   which engine served a backend's calls: boxed_calls(), unboxed_ops(),
        unservable_boxed_calls(), those an unboxed kernel could have served (not out=,
        no device or layout argument: served_boxed_only(); a kernel of their own on
        their target: has_target_kernels()), and assert_served_as_placed() (a
        launch-bound path's tests assert there are none).
sweep   an OpInfo sweep: every op of PyTorch's OpInfo database on a backend's
        device against eager CPU/CUDA, in worker processes that survive crashes
        (``python -m torch_fallback.testing.sweep --help``).

Importing this package imports torch_fallback, which needs torch.
"""
