// tinydev._C: tinydev's Python face, and its own calls into c10::cuda.
//
// tinydev links no CUDA library and declares the c10::cuda functions through
// <torch_fallback/cuda_functions.h>, leaving them undefined. The dynamic
// loader binds them when this extension is imported, after `import
// torch_fallback`: to libc10_cuda.so on a CUDA build of PyTorch, to
// torch-fallback's stub library on a CPU-only build. This file includes no
// ATen header, so it compiles in seconds.
#include <dlfcn.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch_fallback/cuda_functions.h>

#include <map>
#include <string>

#include "tinydev.h"

namespace py = pybind11;

namespace {

// The addresses are taken in this extension, so they are what its own calls
// are bound to, whichever shared object won symbol resolution.
std::map<std::string, std::string> cuda_symbol_providers() {
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
  std::map<std::string, std::string> providers;
  for (const void* address : addresses) {
    Dl_info info{};
    if (dladdr(address, &info) == 0 || info.dli_fname == nullptr || info.dli_sname == nullptr) {
      throw std::runtime_error("tinydev: dladdr found no shared object defining a c10::cuda symbol");
    }
    providers[info.dli_sname] = info.dli_fname;
  }
  return providers;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tinydev: a PrivateUse1 device whose unimplemented ops run through torch-fallback";
  m.def("live_allocations", &tinydev::live_allocations,
        "Storages tinydev's allocator made that are still alive.");
  m.def("cuda_current_device", [] { return static_cast<int>(c10::cuda::current_device()); },
        "c10::cuda::current_device(), unchecked: on a CPU-only PyTorch, the stub's error.");
  m.def("cuda_symbol_providers", &cuda_symbol_providers,
        "{mangled c10::cuda symbol: shared object defining it}, as bound for this extension.");
}
