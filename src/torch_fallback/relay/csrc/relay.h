#pragma once
// relay: PyTorch's PrivateUse1 device, renamed. Its tensors own memory on a
// *home*: host memory or a CUDA GPU's memory (allocated through PyTorch's CUDA
// allocator, found at run time). It implements natively only what a backend
// must; every other op reaches the boxed fallback.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <optional>
#include <string>

#include <torch_fallback/fallback.h>

namespace torch_fallback::relay {

enum class Home { Host, Cuda };

// Home of new allocations (TORCH_FALLBACK_RELAY_HOME, torch_fallback.relay.set_home).
Home current_home();
void set_current_home(Home home);
Home parse_home(const std::string& name);  // "cpu" | "cuda", else ValueError
std::string home_name(Home home);

// Devices: relay:i homes its CUDA memory on cuda:i, so there are as many relay
// devices as visible GPUs, and at least one.
c10::DeviceIndex device_count();
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
void synchronize(c10::DeviceIndex index);
// Waits until autograd's relay device threads hold no user graph; called at
// exit, where a graph released on a device thread during interpreter
// shutdown would take the GIL and abort the process.
void finish_autograd_work();
// Gives autograd's engine device threads for relay's devices when it started them
// before relay was imported (a backward ran first); called on import.
void add_autograd_device_threads();
// IndexError unless 0 <= index < device_count(); takes any integer, so nothing wraps.
void check_device_index(int64_t index);

// Random numbers (generator.cpp).
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
at::Generator target_generator(const std::optional<at::Generator>& generator,
                               c10::DeviceIndex index, c10::Device target);

// Memory figures per relay device, both homes counted (storage.cpp).
struct MemoryFigures {
  int64_t allocated;
  int64_t peak;
};
MemoryFigures memory_figures(c10::DeviceIndex index);
void reset_peak(c10::DeviceIndex index);
// Page-locked host memory for non_blocking copies, and whether a pointer is in it.
c10::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);

// Memory (storage.cpp).
c10::Allocator* allocator();
Home home_of(const c10::Storage& storage);
c10::Device home_device(const c10::Storage& storage);
c10::Storage home_storage(const c10::Storage& storage);
c10::Device output_home(c10::DeviceIndex index);
at::Tensor adopt(const at::Tensor& home_tensor, c10::DeviceIndex index);
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);
// Gives a relay storage `home` (a CPU or CUDA storage of its size, holding its bytes
// already) as its memory from now on: every tensor over the storage reads and writes
// `home`'s bytes. How a relay tensor sent to another process moves into shared memory.
void rehome(const c10::Storage& storage, const c10::Storage& home);

// The fallback's view of relay.
const BackendAdapter& backend();

}  // namespace torch_fallback::relay
