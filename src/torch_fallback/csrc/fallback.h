#pragma once
// A generalized boxed fallback: an op that a backend has no kernel for runs on
// the CPU or on a CUDA GPU. Generalized from at::native::cpu_fallback to a
// target device, and zero-copy wherever a backend tensor's memory already lives
// on the target device.
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/Storage.h>

namespace c10 {
class OperatorHandle;
}

namespace torch_fallback {

// What the fallback needs to know about the backend whose ops it serves.
struct BackendAdapter {
  c10::DeviceType device_type;
  // The device whose memory holds a backend storage: the CPU or a CUDA GPU.
  c10::Device (*home_device)(const c10::Storage& storage);
  // A storage on the home device sharing the backend storage's bytes.
  c10::Storage (*home_storage)(const c10::Storage& storage);
  // The home device for new backend tensors on backend device `index`.
  c10::Device (*output_home)(c10::DeviceIndex index);
  // A backend tensor on device `index` taking over a home-device tensor's memory.
  at::Tensor (*adopt)(const at::Tensor& home_tensor, c10::DeviceIndex index);
};

void boxed_fallback(const BackendAdapter& backend, const c10::OperatorHandle& op,
                    torch::jit::Stack* stack);

// A tensor on the backend storage's home device viewing the same bytes.
at::Tensor home_view(const BackendAdapter& backend, const at::Tensor& tensor);

}  // namespace torch_fallback
