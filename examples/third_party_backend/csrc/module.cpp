// tinydev._C's Python face (operators in torch.ops.tinydev, and an empty module
// on the CPython stable ABI), and its own calls into c10::cuda.
//
// tinydev links no CUDA library and declares the c10::cuda functions through
// <torch_fallback/cuda_functions.h>, leaving them undefined. The dynamic
// loader binds them when this extension is imported, after `import
// torch_fallback`: to libc10_cuda.so on a CUDA build of PyTorch, to
// torch-fallback's stub library on a CPU-only build.
#include <dlfcn.h>

#include <torch/library.h>

#include <torch_fallback/cuda_functions.h>
#include <torch_fallback/python_module.h>

#include <string>

#include "tinydev.h"

namespace {

// The addresses are taken in this extension, so they are what its own calls
// are bound to, whichever shared object won symbol resolution.
c10::Dict<std::string, std::string> cuda_symbol_providers() {
#if TORCH_FALLBACK_SET_DEVICE_HAS_FORCE
  using SetDevice = void (*)(c10::DeviceIndex, bool);
#else
  using SetDevice = void (*)(c10::DeviceIndex);
#endif
  const void* addresses[] = {
      reinterpret_cast<void*>(&c10::cuda::current_device),
      reinterpret_cast<void*>(static_cast<SetDevice>(&c10::cuda::set_device)),
      reinterpret_cast<void*>(&c10::cuda::device_synchronize),
  };
  c10::Dict<std::string, std::string> providers;
  for (const void* address : addresses) {
    Dl_info info{};
    if (dladdr(address, &info) == 0 || info.dli_fname == nullptr || info.dli_sname == nullptr) {
      throw std::runtime_error("tinydev: dladdr found no shared object defining a c10::cuda symbol");
    }
    providers.insert_or_assign(info.dli_sname, info.dli_fname);
  }
  return providers;
}

}  // namespace

TORCH_LIBRARY(tinydev, m) {
  // Allocations tinydev's allocator made that are still alive.
  m.def("live_allocations", []() { return tinydev::live_allocations(); });
  // Accesses open over tinydev's locked memory (0 between ops).
  m.def("open_accesses", []() { return tinydev::open_accesses(); });
  // The tinydev device whose allocation holds `address` (-1: none does).
  m.def("device_of", [](int64_t address) {
    const auto device = tinydev::device_of(reinterpret_cast<const void*>(address));
    return device ? static_cast<int64_t>(*device) : int64_t{-1};
  });
  // Calls of tinydev's own views, _copy_from and attention choice.
  m.def("own_kernel_calls(str name) -> int", &tinydev::own_kernel_calls);
  // c10::cuda::current_device(), unchecked: on a CPU-only PyTorch, the stub's error.
  m.def("cuda_current_device", []() { return static_cast<int64_t>(c10::cuda::current_device()); });
  // {mangled c10::cuda symbol: shared object defining it}, as bound for this extension.
  m.def("cuda_symbol_providers", &cuda_symbol_providers);
}

// [readme:module]
TORCH_FALLBACK_PYTHON_MODULE(_C, "tinydev: a PrivateUse1 device whose unimplemented ops run through torch-fallback")
// [/readme:module]
