#pragma once
// The c10::cuda functions torch-fallback calls, declared without
// c10/cuda/CUDAFunctions.h: that header pulls in cuda_runtime_api.h, which a
// CPU-only build host does not have. At load time the definitions come from
// libc10_cuda.so (CUDA builds of PyTorch) or from the stub library
// torch_fallback._C_cuda_functions (CPU-only builds).
//
// The declarations must match the torch being built against: torch 2.8 gave
// set_device a `bool force` parameter, which changes its mangled name
// (_ZN3c104cuda10set_deviceEa -> _ZN3c104cuda10set_deviceEab).
#include <c10/core/Device.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
#define TORCH_FALLBACK_SET_DEVICE_HAS_FORCE 1
#else
#define TORCH_FALLBACK_SET_DEVICE_HAS_FORCE 0
#endif

#define TORCH_FALLBACK_CUDA_API __attribute__((visibility("default")))

namespace c10::cuda {
TORCH_FALLBACK_CUDA_API DeviceIndex current_device();
#if TORCH_FALLBACK_SET_DEVICE_HAS_FORCE
TORCH_FALLBACK_CUDA_API void set_device(DeviceIndex device, bool force = false);
#else
TORCH_FALLBACK_CUDA_API void set_device(DeviceIndex device);
#endif
TORCH_FALLBACK_CUDA_API void device_synchronize();
}  // namespace c10::cuda
