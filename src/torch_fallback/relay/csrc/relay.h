#pragma once
// relay: PyTorch's PrivateUse1 device, renamed. Its tensors own memory on a
// *home*: host memory or a CUDA GPU's memory (allocated through PyTorch's CUDA
// allocator, found at run time). It implements natively only what a backend
// must; every other op reaches the boxed fallback.
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

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

// Memory (storage.cpp).
c10::Allocator* allocator();
Home home_of(const c10::Storage& storage);
c10::Device home_device(const c10::Storage& storage);
c10::Storage home_storage(const c10::Storage& storage);
c10::Device output_home(c10::DeviceIndex index);
at::Tensor adopt(const at::Tensor& home_tensor, c10::DeviceIndex index);
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);

// The fallback's view of relay.
const BackendAdapter& backend();

}  // namespace torch_fallback::relay
