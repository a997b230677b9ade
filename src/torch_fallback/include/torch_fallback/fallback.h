#pragma once
// torch-fallback's public C++ API: a generalized boxed fallback that runs the
// ops a backend has no kernel for on the CPU or on a CUDA GPU.
//
// A backend describes its memory with a BackendAdapter and registers the
// fallback for its dispatch key:
//
//   #include <torch_fallback/fallback.h>
//   #include <torch_fallback/kernels.h>  // register_kernels, in the TU that registers
//
//   const torch_fallback::BackendAdapter& my_adapter() {
//     static const torch_fallback::BackendAdapter adapter{
//         c10::DeviceType::PrivateUse1, &home_device, &home_storage, &output_home, &adopt};
//     return adapter;
//   }
//   TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
//     m.fallback(torch_fallback::boxed_fallback_for<&my_adapter>());
//   }
//   TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {  // nested tensors too
//     m.fallback(torch_fallback::boxed_fallback_for<&my_adapter>());
//   }
//   TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
//     ... the backend's memory: empty.memory_format, empty_strided, resize_
//     torch_fallback::register_kernels<&my_adapter>(m);  // views, copies, last
//   }
//   TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {  // with the nested fallback
//     torch_fallback::register_nested_kernels<&my_adapter>(m);  // kernels.h
//   }
//
// Words used throughout:
//   backend      the out-of-tree device (its dispatch key, e.g. PrivateUse1) and
//                its tensors, whose ops the fallback serves.
//   home         the device whose memory holds a backend storage: the CPU or a
//                CUDA GPU (BackendAdapter::home_device).
//   target       the device an op runs on: the CPU or a CUDA GPU (the target
//                setting, TORCH_FALLBACK_TARGET). Where home and target are the
//                same device the op runs on the memory in place (zero-copy).
//   home view    a CPU or CUDA tensor over a backend tensor's bytes (home_view).
//   adopt        a backend tensor taking over a result's memory on its home
//                (BackendAdapter::adopt).
//   output_home  the home of a new backend tensor (BackendAdapter::output_home).
//   kept view    a backend tensor's view on the target, kept by the library from
//                one call to the next while it still matches (library-internal).
//
// Stable (TORCH_FALLBACK_API_VERSION 2): everything in this header and in
// kernels.h, cuda.h, cuda_functions.h and python_module.h outside a `detail`
// namespace. torch_fallback/detail/ is machinery the templates need; it may
// change in any release.
//
// The target, the ops forced to the CPU and the CUDA sync mode are
// torch_fallback's settings (torch_fallback.set_target, ...); every call is
// counted in torch_fallback.metrics().
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Storage.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "api.h"
#include "cuda.h"

namespace torch_fallback {

// How a backend's tensors map to memory the CPU or CUDA can use.
struct BackendAdapter {
  // The backend's device type (PrivateUse1 for out-of-tree backends).
  c10::DeviceType device_type;
  // The device whose memory holds a backend storage: the CPU or a CUDA GPU.
  c10::Device (*home_device)(const c10::Storage& storage);
  // A storage on the home device sharing the backend storage's bytes. It may be
  // the same storage at every call (one kept with the backend storage): the
  // fallback never resizes it, and gives arguments a kernel may resize (out=
  // ones) a resizable storage of their own over the same bytes.
  c10::Storage (*home_storage)(const c10::Storage& storage);
  // The home device for new backend tensors on backend device `index`.
  c10::Device (*output_home)(c10::DeviceIndex index);
  // A backend tensor on device `index` taking over a home-device tensor's memory
  // (backend_tensor_over). Null: the backend keeps only memory its allocator
  // made (an allocation table, say), and the library copies each result into a
  // backend tensor it allocates with at::empty_strided on the backend device.
  at::Tensor (*adopt)(const at::Tensor& home_tensor, c10::DeviceIndex index);
  // Optional: the generator a random op running on `target` draws from, for
  // the backend generator it was given (none: the backend's default generator
  // for device `index`). Without it, random ops use the target's generators.
  at::Generator (*target_generator)(const std::optional<at::Generator>& generator,
                                    c10::DeviceIndex index, c10::Device target) = nullptr;
  // Optional, both or neither: for memory that is locked outside the backend's
  // own kernels (mprotect). begin_access(storage) runs before the library asks
  // home_storage for a view of `storage`'s bytes, and end_access(storage) once
  // the last tensor over that view is gone, whenever that is: views a kernel
  // returns, or the library keeps, keep the access open. Calls nest: count them
  // per storage. Neither is called under a lock of the library.
  void (*begin_access)(const c10::Storage& storage) = nullptr;
  void (*end_access)(const c10::Storage& storage) = nullptr;
  // Whether the library may keep its per-tensor state in a backend tensor's
  // BackendMeta slot when that slot is empty: the target views of an
  // optimizer's parameters and states, reused from step to step (fewer host
  // instructions per step). Leave it false if the backend sets BackendMeta or
  // reads it (a serialization hook) anywhere: the library then keeps no state
  // on the backend's tensors at all.
  bool lend_backend_meta = false;
};

// Runs `op` from `stack` on the fallback target for `backend`'s tensors.
TORCH_FALLBACK_API void boxed_fallback(const BackendAdapter& backend,
                                       const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The fallback as a kernel for torch::Library::fallback or ::impl, for the
// backend whose adapter `Adapter()` returns.
namespace detail {
template <const BackendAdapter& (*Adapter)()>
void fallback_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  boxed_fallback(Adapter(), op, stack);
}
}  // namespace detail

template <const BackendAdapter& (*Adapter)()>
torch::CppFunction boxed_fallback_for() {
  return torch::CppFunction::makeFromBoxedFunction<&detail::fallback_kernel<Adapter>>();
}

// Whether the fallback now sends ops that have a CUDA kernel to a GPU (the
// target setting; for 'auto', whether a GPU is visible). A backend whose memory
// lives on the host may then allocate it page-locked, so that the fallback's
// copies to and from the GPU run asynchronously and at full speed.
TORCH_FALLBACK_API bool targets_cuda();

// A CPU or CUDA tensor viewing the same bytes as a backend tensor.
TORCH_FALLBACK_API at::Tensor home_view(const BackendAdapter& backend, const at::Tensor& tensor);

// A backend tensor over `storage` (a backend storage sharing `home_tensor`'s
// memory) with `home_tensor`'s dtype and geometry: what an adopt returns. A
// kernel's fresh result, which nothing else holds, becomes that tensor itself
// rather than leaving a second TensorImpl to make and one to free.
TORCH_FALLBACK_API at::Tensor backend_tensor_over(c10::Storage storage,
                                                  const at::Tensor& home_tensor);

// A copy between a backend tensor and a CPU, CUDA or backend tensor, run on
// the home devices. Refuses overlapping source and destination as eager
// copy_ does.
TORCH_FALLBACK_API void copy_between(const BackendAdapter& backend, const at::Tensor& src,
                                     const at::Tensor& dst, bool non_blocking);

// Registers the metadata-only view ops (as_strided, view, _reshape_alias,
// unfold, view_as_real, view_as_complex) and, for PrivateUse1, the set_ ops
// (which grow a storage through the backend's PrivateUse1 hooks) that
// `device_type` has no kernel for yet: a boxed fallback cannot return views or
// rebind a tensor's storage, so every backend needs them natively.
TORCH_FALLBACK_API void register_view_kernels(torch::Library& aten, c10::DeviceType device_type);


// Ops whose composite (device-agnostic) kernels do not serve a third-party
// device as eager serves CPU and CUDA, so they go to the fallback whole:
// _convolution's calls convolution_overrideable, conj_physical_ and kaiser_window call a
// DispatchStub directly, and every op with its own CPU kernel besides a
// composite one (addr, the norms) checks and computes as the CPU kernel does.
TORCH_FALLBACK_API const std::vector<std::string>& ops_run_whole();

// The adapter registered for `device_type` (register_kernels registers the
// backend's), or null: what the library's pieces reached from Python without a
// template argument (the c10d backend of torch_fallback.distributed) use.
TORCH_FALLBACK_API void register_adapter(const BackendAdapter& backend);
TORCH_FALLBACK_API const BackendAdapter* adapter_for(c10::DeviceType device_type);

// Lets nn.Module.to (and .data = ...) move a tensor between `device_type` and
// the CPU or CUDA in place, as it moves one between the CPU and CUDA: the
// Parameter object stays, so tied weights stay tied and an optimizer built
// before the move keeps its tensors. Only calls with a `device_type` tensor
// among their arguments see it; register_kernels calls it.
TORCH_FALLBACK_API void register_device_moves(c10::DeviceType device_type);

}  // namespace torch_fallback
