// The fallback's shared pieces (call_support.h) and the public functions over
// them: tensors over other tensors' memory, home views, copies, the call record.
#include "call_support.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/NestedTensorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "metrics.h"

namespace torch_fallback {

const std::thread::id g_loading_thread = std::this_thread::get_id();

// Bytes [first, end) of a storage that `tensor` may touch.
std::pair<int64_t, int64_t> byte_extent(const at::Tensor& tensor) {
  const int64_t item = static_cast<int64_t>(tensor.element_size());
  int64_t last = tensor.storage_offset();
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (tensor.size(d) == 0) return {tensor.storage_offset() * item, tensor.storage_offset() * item};
    last += (tensor.size(d) - 1) * tensor.stride(d);
  }
  return {tensor.storage_offset() * item, (last + 1) * item};
}

namespace {

void release_storages(void* ctx) { delete static_cast<std::pair<c10::Storage, c10::Storage>*>(ctx); }

// An open access to a backend storage's bytes (BackendAdapter::begin_access),
// ended when the last tensor over its home storage is gone.
struct OpenAccess {
  const BackendAdapter* backend;
  c10::Storage storage;  // the backend's
  c10::Storage home;

  static void end(void* ctx) {
    std::unique_ptr<OpenAccess> access(static_cast<OpenAccess*>(ctx));
    access->home = c10::Storage();  // the home view goes before the access ends
    access->backend->end_access(access->storage);
  }
};

}  // namespace

// A resizable storage over `home`'s bytes that keeps `backend` (whose memory
// they are) and `home` (an access to them) alive; a resize gives it new memory
// and leaves both untouched.
c10::Storage resizable_alias(const c10::Storage& backend, const c10::Storage& home) {
  const c10::Device device = home.device();
  c10::DataPtr data(const_cast<void*>(home.data()),
                    new std::pair<c10::Storage, c10::Storage>(backend, home), &release_storages,
                    device);
  return c10::Storage(c10::Storage::use_byte_size_t(), home.nbytes(), std::move(data),
                      c10::GetAllocator(device.type()), /*resizable=*/true);
}

c10::Storage home_storage_in_access(const BackendAdapter& backend, const c10::Storage& storage) {
  backend.begin_access(storage);
  auto access = std::make_unique<OpenAccess>(OpenAccess{&backend, storage, c10::Storage()});
  try {
    access->home = backend.home_storage(storage);
  } catch (...) {
    backend.end_access(storage);
    throw;
  }
  const c10::Storage& home = access->home;
  const size_t nbytes = home.nbytes();
  c10::Allocator* allocator = home.allocator();
  c10::DataPtr data(const_cast<void*>(home.data()), access.get(), &OpenAccess::end, home.device());
  access.release();  // the DataPtr owns it now
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), allocator,
                      /*resizable=*/false);
}

at::Tensor adopt_home_tensor(const BackendAdapter& backend, const at::Tensor& home_tensor,
                             c10::DeviceIndex index) {
  if (backend.adopt != nullptr) return backend.adopt(home_tensor, index);
  // Into memory the backend allocates itself, filled through a home view of it.
  const c10::TensorOptions options = home_tensor.options().device(backend.device_type, index);
  at::Tensor result = home_tensor.is_non_overlapping_and_dense()
                          ? at::empty_strided(home_tensor.sizes(), home_tensor.strides(), options)
                          : at::empty(home_tensor.sizes(), options);
  home_view(backend, result).copy_(home_tensor);
  return result;
}

std::string device_type_name(c10::DeviceType type) {
  return c10::DeviceTypeName(type, /*lower_case=*/true);
}

void add_target_context(c10::Error& error, const OpRules& rules, c10::Device target) {
  error.add_context("torch_fallback: raised by " + rules.full_name + " on the " +
                    device_type_name(target.type()) + " fallback target");
}

// The backend device of a call: its tensors', else the current one.
c10::DeviceIndex backend_device_index(const BackendAdapter& backend,
                                      std::optional<c10::DeviceIndex> of_tensors) {
  if (of_tensors && *of_tensors >= 0) return *of_tensors;
  return c10::impl::getDeviceGuardImpl(backend.device_type)->getDevice().index();
}

void throw_unservable_result(const OpRules& rules, c10::DeviceType backend,
                             const at::Tensor& result) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "torch_fallback: ", rules.full_name, " returned a ",
                              result.is_quantized() ? "quantized" : "non-strided", " tensor (",
                              result.toString(), "), which ", device_type_name(backend),
                              " tensors cannot be. Run it on CPU or CUDA tensors instead.");
}

at::Tensor adopt_zero_tensor(const BackendAdapter& backend, const at::Tensor& result,
                             c10::Device home, c10::DeviceIndex index) {
  return adopt_home_tensor(backend, at::zeros(result.sizes(), result.options().device(home)),
                           index);
}

namespace {

// A plain TensorImpl's keys on `device` with dispatch key `key`, made in the mode asked
// for, whichever mode the call that asks comes in.
c10::DispatchKeySet keys_on(c10::Device device, c10::DispatchKey key, bool inference) {
  const c10::InferenceMode mode(inference);
  return at::detail::make_tensor<c10::TensorImpl>(empty_storage(device), c10::DispatchKeySet(key),
                                                  caffe2::TypeMeta::Make<float>())
      .key_set();
}

}  // namespace

PlainKeySets make_plain_key_sets() {
  const c10::Device cpu(c10::kCPU);
  const c10::Device cuda(c10::kCUDA, 0);
  return {{{keys_on(cpu, c10::DispatchKey::CPU, false), keys_on(cpu, c10::DispatchKey::CPU, true)},
           {keys_on(cuda, c10::DispatchKey::CUDA, false),
            keys_on(cuda, c10::DispatchKey::CUDA, true)}}};
}

std::array<std::array<std::atomic<uint64_t>, 2>, c10::COMPILE_TIME_MAX_DEVICE_TYPES>
    g_plain_backend_keys{};

uint64_t make_plain_backend_keys(c10::DeviceType type, bool inference) {
  const c10::Device device(type, 0);
  const uint64_t raw =
      keys_on(device, c10::computeDispatchKey(std::nullopt, c10::kStrided, device), inference)
          .raw_repr();
  g_plain_backend_keys[static_cast<size_t>(type)][inference].store(raw, std::memory_order_relaxed);
  return raw;
}

at::Tensor tensor_over(c10::Storage storage, c10::Device device, const at::Tensor& like) {
  const auto key = c10::computeDispatchKey(std::nullopt, c10::kStrided, device);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                         c10::DispatchKeySet(key), like.dtype());
  take_geometry(tensor.unsafeGetTensorImpl(), like);
  return tensor;
}

at::Tensor map_nested_buffer(const at::Tensor& nested,
                             const std::function<at::Tensor(const at::Tensor&)>& map) {
  const auto* impl = at::native::get_nested_tensor_impl(nested);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      map(impl->get_unsafe_storage_as_tensor()), impl->get_nested_sizes(),
      impl->get_nested_strides(), impl->get_storage_offsets());
}

bool targets_cuda() {
  return target() == Target::Cuda || (target() == Target::Auto && cuda::device_count() > 0);
}

at::Tensor backend_tensor_over(c10::Storage storage, const at::Tensor& home_tensor) {
  const c10::Device device = storage.device();
  if (is_plain_and_unshared(home_tensor) && !python_modes_may_be_set()) {
    c10::TensorImpl* impl = home_tensor.unsafeGetTensorImpl();
    TensorImplAccess::become_plain_tensor_over(
        impl, std::move(storage), plain_backend_keys(device.type(), impl->is_inference()));
    return home_tensor;
  }
  return tensor_over(std::move(storage), device, home_tensor);
}

at::Tensor home_view(const BackendAdapter& backend, const at::Tensor& tensor) {
  return tensor_over(home_storage_of(backend, tensor.storage()), backend.home_device(tensor.storage()),
                     tensor);
}

void copy_between(const BackendAdapter& backend, const at::Tensor& src, const at::Tensor& dst,
                  bool non_blocking) {
  // Every autocast cast comes here: the views are the pool's, as a DirectCall's are.
  TargetImplPool* const pool = TargetImplPool::for_this_call();
  const auto on_home = [&](const at::Tensor& tensor) {
    if (tensor.device().type() != backend.device_type) return tensor;
    const c10::Storage& storage = storage_of(tensor);
    return pooled_tensor_over(pool, home_storage_of(backend, storage), backend.home_device(storage),
                              tensor);
  };
  if (src.device().type() == backend.device_type && dst.device().type() == backend.device_type &&
      src.storage().is_alias_of(dst.storage())) {
    // The home views are separate storages, so eager's overlap checks would not see this.
    // A copy onto the very same elements is a no-op, as in eager.
    if (same_geometry(src, dst) && src.dtype() == dst.dtype() &&
        src.is_conj() == dst.is_conj() && src.is_neg() == dst.is_neg()) {
      return;
    }
    at::assert_no_internal_overlap(dst);
    at::assert_no_partial_overlap(dst, src);
  }
  at::Tensor dst_on_home = on_home(dst);
  at::Tensor src_on_home = on_home(src);
  dst_on_home.copy_(src_on_home, non_blocking);
  if (pool != nullptr) {
    pool->park(std::move(dst_on_home));
    pool->park(std::move(src_on_home));
  }
}

namespace detail {

TargetImplPool::ThisThread& TargetImplPool::make_this_thread() {
  thread_local ThisThread thread;
  return thread;
}

}  // namespace detail

namespace metrics {

std::vector<int64_t> parked_target_impls() { return TargetImplPool::parked_counts(); }

}  // namespace metrics

}  // namespace torch_fallback
