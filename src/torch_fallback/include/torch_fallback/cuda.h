#pragma once
// Guarded access to the c10::cuda functions: each call first checks that this
// PyTorch was built with CUDA and that a GPU is visible, and says which is
// missing instead of letting the CUDA runtime answer with a driver error.
#include <c10/core/Device.h>

#include "api.h"

#include <string>
#include <vector>

namespace torch_fallback::cuda {

// libc10_cuda.so is loaded (PyTorch was built with CUDA), GPU or not.
TORCH_FALLBACK_API bool built();
// GPUs visible to this process; 0 without CUDA or without a GPU.
TORCH_FALLBACK_API c10::DeviceIndex device_count();
// Throws a clear error naming what is missing when `purpose` (for `op`, if
// given) cannot run on a GPU. Cheap when it passes: it builds no message.
TORCH_FALLBACK_API void check_usable(const char* purpose, const std::string& op = {});

TORCH_FALLBACK_API c10::DeviceIndex current_device();
TORCH_FALLBACK_API void set_device(c10::DeviceIndex index);
TORCH_FALLBACK_API void device_synchronize();

// Calls c10::cuda::current_device() with no check: on a CPU-only PyTorch this
// reaches the stub library and raises its error.
TORCH_FALLBACK_API c10::DeviceIndex current_device_unchecked();

// Mangled names of the c10::cuda functions torch-fallback calls.
TORCH_FALLBACK_API std::vector<std::string> symbol_names();
// Path of the shared object whose definition of `symbol` _C resolved to (dladdr).
TORCH_FALLBACK_API std::string symbol_provider(const std::string& symbol);

// Sets the current CUDA device for a scope and restores the caller's on exit.
class TORCH_FALLBACK_API DeviceScope {
 public:
  explicit DeviceScope(c10::DeviceIndex index);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

}  // namespace torch_fallback::cuda
