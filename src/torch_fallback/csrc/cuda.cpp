#include <torch_fallback/cuda.h>

#include <dlfcn.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <torch_fallback/cuda_functions.h>

namespace torch_fallback::cuda {

bool built() {
  // libc10_cuda.so registers the CUDA device guard when it loads; a CPU-only
  // PyTorch has no such library, so this is "built with CUDA", not "has a GPU".
  return c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA);
}

c10::DeviceIndex device_count() {
  // Fixed for the process (c10::cuda::device_count() caches it too); every call
  // on a GPU target asks it.
  static const c10::DeviceIndex count =
      built() ? c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() : 0;
  return count;
}

void check_usable(const char* purpose, const std::string& op) {
  if (C10_LIKELY(device_count() > 0)) return;  // every call on a GPU target asks
  TORCH_CHECK(built(), "torch_fallback: ", purpose, op.empty() ? "" : " (for " + op + ")",
              " needs CUDA, but this PyTorch (" TORCH_VERSION
              ") was built without CUDA. Use the CPU target (TORCH_FALLBACK_TARGET=cpu "
              "or auto), or install a CUDA build of PyTorch and rebuild torch-fallback "
              "against it.");
  TORCH_CHECK(device_count() > 0, "torch_fallback: ", purpose,
              op.empty() ? "" : " (for " + op + ")",
              " needs a CUDA GPU, but no GPU is visible (PyTorch " TORCH_VERSION
              " is built with CUDA, yet torch.cuda.device_count() == 0). Run it on a "
              "machine with a GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES), or use the "
              "CPU target (TORCH_FALLBACK_TARGET=cpu or auto).");
}

c10::DeviceIndex current_device() {
  check_usable("c10::cuda::current_device()");
  return c10::cuda::current_device();
}

void set_device(c10::DeviceIndex index) {
  check_usable("c10::cuda::set_device()");
  TORCH_CHECK_INDEX(index >= 0 && index < device_count(), "torch_fallback: CUDA device ",
                    static_cast<int>(index), " does not exist; ", static_cast<int>(device_count()),
                    " GPU(s) are visible.");
  c10::cuda::set_device(index);
}

void device_synchronize() {
  check_usable("c10::cuda::device_synchronize()");
  c10::cuda::device_synchronize();
}

c10::DeviceIndex current_device_unchecked() { return c10::cuda::current_device(); }

namespace {

struct Symbol {
  const char* mangled;
  void* address;
};

std::vector<Symbol> symbols() {
  // The addresses are taken in this library, so they are what _C's own calls
  // bound to, whichever shared object won symbol resolution.
  return {
      {"_ZN3c104cuda14current_deviceEv", reinterpret_cast<void*>(&c10::cuda::current_device)},
#if TORCH_FALLBACK_SET_DEVICE_HAS_FORCE
      {"_ZN3c104cuda10set_deviceEab",
       reinterpret_cast<void*>(static_cast<void (*)(c10::DeviceIndex, bool)>(&c10::cuda::set_device))},
#else
      {"_ZN3c104cuda10set_deviceEa",
       reinterpret_cast<void*>(static_cast<void (*)(c10::DeviceIndex)>(&c10::cuda::set_device))},
#endif
      {"_ZN3c104cuda18device_synchronizeEv", reinterpret_cast<void*>(&c10::cuda::device_synchronize)},
  };
}

}  // namespace

std::vector<std::string> symbol_names() {
  std::vector<std::string> names;
  for (const auto& symbol : symbols()) names.emplace_back(symbol.mangled);
  return names;
}

std::string symbol_provider(const std::string& symbol) {
  for (const auto& candidate : symbols()) {
    if (symbol != candidate.mangled) continue;
    Dl_info info{};
    TORCH_CHECK(dladdr(candidate.address, &info) != 0 && info.dli_fname != nullptr,
                "torch_fallback: dladdr found no shared object defining ", symbol);
    return info.dli_fname;
  }
  TORCH_CHECK_VALUE(false, "torch_fallback: unknown c10::cuda symbol '", symbol,
                    "'; known symbols are those of cuda_symbol_names()");
}

DeviceScope::DeviceScope(c10::DeviceIndex index) : previous_(c10::cuda::current_device()) {
  if (previous_ != index) c10::cuda::set_device(index);
}

DeviceScope::~DeviceScope() {
  try {
    if (c10::cuda::current_device() != previous_) c10::cuda::set_device(previous_);
  } catch (...) {
    // A destructor must not throw; the device was valid when the scope began.
  }
}

}  // namespace torch_fallback::cuda
