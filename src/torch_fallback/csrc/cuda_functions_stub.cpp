// torch_fallback._C_cuda_functions: stand-ins for the c10::cuda functions that
// only CUDA builds of PyTorch define (in libc10_cuda.so). torch_fallback loads
// this library with RTLD_GLOBAL before _C, and only when PyTorch was built
// without CUDA, so that _C imports on a CPU-only wheel. Each stand-in raises.
#include <stdexcept>
#include <string>

#include <torch_fallback/cuda_functions.h>
#include <torch_fallback/python_module.h>

namespace {

[[noreturn]] void unavailable(const char* function) {
  throw std::runtime_error(
      std::string("torch_fallback: c10::cuda::") + function +
      "() is unavailable: this PyTorch (" TORCH_VERSION
      ") was built without CUDA, so the CUDA fallback target cannot run. "
      "Use the CPU target (TORCH_FALLBACK_TARGET=cpu or auto), or install a "
      "CUDA build of PyTorch and rebuild torch-fallback against it.");
}

}  // namespace

namespace c10::cuda {

DeviceIndex current_device() { unavailable("current_device"); }

#if TORCH_FALLBACK_SET_DEVICE_HAS_FORCE
void set_device(DeviceIndex /*device*/, bool /*force*/) { unavailable("set_device"); }
#else
void set_device(DeviceIndex /*device*/) { unavailable("set_device"); }
#endif

void device_synchronize() { unavailable("device_synchronize"); }

}  // namespace c10::cuda

TORCH_FALLBACK_PYTHON_MODULE(_C_cuda_functions,
                              "Stand-ins for c10::cuda functions on PyTorch builds without CUDA.")
