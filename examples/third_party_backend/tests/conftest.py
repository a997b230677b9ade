"""tinydev's tests use torch-fallback's pytest plugin: the markers requires_cuda,
requires_two_gpus, cpu_wheel and cuda_wheel, with the same rules as torch-fallback's own
tests (a missing GPU skips a requires_cuda test with the reason, and fails it under
TORCH_FALLBACK_REQUIRE_GPU=1)."""

pytest_plugins = ["torch_fallback.testing.plugin"]
