// The unboxed engine: DirectCall runs an op's target kernel directly on views
// of backend tensors that already live on the target (DirectKernel, kernels.h).
#include "call_support.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "decompositions.h"
#include "metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace torch_fallback {
namespace detail {

void WrittenVersions::watch(const at::Tensor& backend, const at::Tensor& target,
                            uint32_t counted_above) {
  c10::TensorImpl* backend_impl = backend.unsafeGetTensorImpl();
  c10::TensorImpl* target_impl = target.unsafeGetTensorImpl();
  if (backend_impl == target_impl || !backend_impl->version_counter().enabled() ||
      !target_impl->version_counter().enabled()) {
    return;
  }
  watched_.push_back({backend_impl, target_impl,
                      target_impl->version_counter().current_version() + counted_above});
}

void WrittenVersions::pass_on_watched() const {
  // Backend views of one tensor share its count, as their target tensors'
  // writes would in eager; each target tensor is watched once.
  for (const Watched& watched : watched_) {
    const uint32_t now = watched.target->version_counter().current_version();
    const uint32_t writes = now > watched.target_before ? now - watched.target_before : 0;
    for (uint32_t i = 0; i < writes; ++i) watched.backend->bump_version();
  }
}

DirectCall::DirectCall(const BackendAdapter& backend, const OpRules& rules)
    : backend_(backend), rules_(rules), record_(rules, /*unboxed=*/true) {}

const OpRules& DirectCall::rules_for(const c10::OperatorHandle& op) { return op_rules(op); }

DirectCall::~DirectCall() {
  if (!started_) return;  // the boxed fallback serves (and counts) the call
  if (pool_ != nullptr) {
    for (at::Tensor& view : views_) pool_->park(std::move(view));
    if (C10_UNLIKELY(!view_lists_.empty())) park_list_views();
  }
  record_.record(/*failed=*/!finished_);
}

// Out of line: most calls take no list, and the loop would sit among the lines
// every call runs.
void DirectCall::park_list_views() {
  for (auto& views : view_lists_) {
    for (at::Tensor& view : views) pool_->park(std::move(view));
  }
}

void DirectCall::offer(const at::Tensor& tensor) {
  if (!usable_ || !tensor.defined()) return;
  const c10::Device device = tensor.device();
  if (C10_UNLIKELY(device.type() != backend_.device_type)) {
    // TensorIterator takes 0-dim CPU tensors as scalars on any device; an op whose
    // CUDA kernel checks devices takes none (the boxed fallback says so).
    usable_ = device.is_cpu() && tensor.dim() == 0 && !rules_.takes_no_cpu_scalars;
    return;
  }
  if (C10_UNLIKELY(tensor.layout() != c10::kStrided || tensor.is_nested() ||
                   (index_ && *index_ != device.index()))) {
    usable_ = false;
    return;
  }
  const c10::Device home = backend_.home_device(storage_of(tensor));
  usable_ = !home_ || *home_ == home;
  index_ = device.index();
  home_ = home;
  ++tensors_;
}

void DirectCall::offer(at::Tensor& written) {
  // A kernel writes only the backend's memory through a view: no CPU scalar here.
  if (written.defined() && written.device().type() != backend_.device_type) usable_ = false;
  offer(static_cast<const at::Tensor&>(written));
}

void DirectCall::offer(at::TensorList tensors) {
  const size_t single = tensors_;  // views of list elements go to view_lists_, not views_
  for (const at::Tensor& tensor : tensors) {
    // A _foreach_ op's first list gives its results: a CPU tensor there is the
    // boxed fallback's to refuse.
    if (lists_offered_ == 0 && tensor.defined() && tensor.device().type() != backend_.device_type) {
      usable_ = false;
    }
    offer(tensor);
  }
  tensors_ = single;
  list_tensors_ += tensors.size();
  // An in-place _foreach_ op writes its first list, which nothing may read meanwhile.
  const auto& written = rules_.written_arguments;
  if (lists_offered_++ == 0 && !written.empty() && written.front() == 0) {
    written_list_ = tensors.data();
  }
}

void DirectCall::offer(const at::ITensorListRef& tensors) {
  const size_t single = tensors_;
  for (const at::Tensor& tensor : tensors) offer(tensor);
  tensors_ = single;
  list_tensors_ += tensors.size();
  ++lists_offered_;
}

void DirectCall::offer(const c10::List<std::optional<at::Tensor>>& tensors) {
  const size_t single = tensors_;
  for (const std::optional<at::Tensor>& tensor : tensors) offer(tensor);
  tensors_ = single;
  list_tensors_ += tensors.size();
  ++lists_offered_;
}

void DirectCall::offer(std::optional<c10::ScalarType> dtype) {
  usable_ = usable_ && !(dtype && c10::isQIntType(*dtype));
}

void DirectCall::offer(const std::optional<at::Generator>& generator) {
  if (generator.has_value() && generator->defined() &&
      generator->device().type() != backend_.device_type) {
    usable_ = false;
  }
}

std::optional<at::Generator> DirectCall::on_target(std::optional<at::Generator>& generator) {
  if (backend_.target_generator == nullptr) return generator;
  return backend_.target_generator(generator, *index_, target_);
}

bool DirectCall::start() {
  if (!usable_ || !rules_.runs_direct || !home_) return false;
  const c10::DeviceIndex index = backend_device_index(backend_, index_);
  const bool on_home = rules_.reads_on_home && !rules_.forced_to_cpu();
  const Target wanted = on_home ? (home_->is_cuda() ? Target::Cuda : Target::Cpu)
                                : wanted_target(rules_, /*nested=*/false);
  if (wanted == Target::Cuda) {
    // A GPU of this index is there, so CUDA is usable: the boxed fallback says
    // what is missing where it is not.
    if (!rules_.has_cuda_kernel || index >= cuda::device_count()) return false;
    target_ = c10::Device(c10::kCUDA, index);
    target_keys_ = c10::DispatchKeySet(c10::DispatchKey::CUDA);
  } else if (!rules_.has_cpu_kernel) {
    return false;
  }
  // item()'s number needs no home for results.
  if (*home_ != target_ || (!on_home && backend_.output_home(index) != target_)) return false;
  index_ = index;
  pool_ = TargetImplPool::for_this_call();
  views_.reserve(tensors_);
  homes_.reserve(tensors_ + list_tensors_);
  started_ = true;
  record_.enter(target_);
  return true;
}

C10_ALWAYS_INLINE c10::StorageImpl* DirectCall::home_in_call(
    c10::StorageImpl* backend_storage) const {
  // A linear search: cheaper under callgrind than SmallMap's index even for
  // _foreach_addcdiv_'s 222 tensors (782K against 788K instructions per call).
  for (const auto& [storage, on_target] : homes_) {
    if (storage == backend_storage) return on_target;
  }
  return nullptr;
}

at::Tensor DirectCall::view_of(const at::Tensor& tensor) {
  const c10::Storage& backend_storage = storage_of(tensor);
  c10::StorageImpl* home = home_in_call(backend_storage.unsafeGetStorageImpl());
  // The first view of a storage (the common case) holds its home storage for the call.
  c10::Storage storage;
  if (C10_LIKELY(home == nullptr)) {
    storage = home_storage_of(backend_, backend_storage);
    homes_.emplace_back(backend_storage.unsafeGetStorageImpl(), storage.unsafeGetStorageImpl());
  } else {
    storage = storage_ref(home);
  }
  // One call of the inlined pool path, whichever storage the view gets.
  return pooled_tensor_over(pool_, std::move(storage), target_, tensor);
}

at::Tensor DirectCall::kept_view_of(const at::Tensor& tensor, bool add) {
  // Kept views are plain tensors of the target, whose writes count: none made in
  // inference mode (inference tensors count none) or under a Python dispatch
  // mode, where the pool is off. They live in BackendMeta, which only a backend
  // that lends it gives us.
  KeptTargetView* kept =
      pool_ != nullptr && !pool_->for_inference_mode() && backend_.lend_backend_meta
          ? KeptTargetView::of(tensor, add)
          : nullptr;
  if (kept == nullptr) return view_of(tensor);
  std::optional<KeptTargetView::View> view = kept->get(tensor, target_);
  if (!view) {
    const c10::Storage& storage = storage_of(tensor);
    c10::Storage home = home_storage_of(backend_, storage);
    const bool shared = home_storage_of(backend_, storage).unsafeGetStorageImpl() ==
                        home.unsafeGetStorageImpl();
    view = KeptTargetView::View{tensor_over(home, target_, tensor), shared};
    kept->keep(tensor, *view);
  }
  // A tensor listed twice gets a view of its own the second time: each view a
  // call writes through stands for one tensor of the list (WrittenVersions).
  if (view->tensor.use_count() > 2) return view_of(tensor);  // the kept one and this
  if (view->shared_storage) return std::move(view->tensor);
  // Tensors that share a backend storage share one target storage within the call.
  c10::StorageImpl* backend_storage = storage_of(tensor).unsafeGetStorageImpl();
  c10::StorageImpl* kept_home = storage_of(view->tensor).unsafeGetStorageImpl();
  c10::StorageImpl* home = home_in_call(backend_storage);
  if (home == nullptr) {
    homes_.emplace_back(backend_storage, kept_home);
  } else if (home != kept_home) {
    return pooled_tensor_over(pool_, storage_ref(home), target_, tensor);
  }
  return std::move(view->tensor);
}

const at::Tensor& DirectCall::on_target(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.device().type() != backend_.device_type) return tensor;
  views_.push_back(view_of(tensor));
  return views_.back();
}

at::Tensor& DirectCall::on_target(at::Tensor& written) {
  if (!written.defined()) return written;
  views_.push_back(view_of(written));
  written_versions_.watch(written, views_.back());
  return views_.back();
}

at::TensorList DirectCall::on_target(at::TensorList tensors) {
  std::vector<at::Tensor>& views = view_lists_.emplace_back();
  views.reserve(tensors.size());
  // The list an in-place _foreach_ op writes keeps the views of tensors it has
  // written before (KeptTargetView::of); others are the pool's.
  const bool add = tensors.data() == written_list_;
  for (const at::Tensor& tensor : tensors) {
    views.push_back(tensor.defined() && tensor.device().type() == backend_.device_type
                        ? kept_view_of(tensor, add)
                        : tensor);
    if (add && tensor.defined()) written_versions_.watch(tensor, views.back());
  }
  return views;
}

at::ITensorListRef DirectCall::on_target(const at::ITensorListRef& tensors) {
  std::vector<at::Tensor>& views = view_lists_.emplace_back();
  views.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) {
    views.push_back(tensor.defined() && tensor.device().type() == backend_.device_type
                        ? view_of(tensor)
                        : tensor);
  }
  return at::ITensorListRef(views);
}

c10::List<std::optional<at::Tensor>> DirectCall::on_target(
    const c10::List<std::optional<at::Tensor>>& tensors) {
  std::vector<at::Tensor>& views = view_lists_.emplace_back();  // parked with the call
  views.reserve(tensors.size());
  c10::List<std::optional<at::Tensor>> on_target;
  on_target.reserve(tensors.size());
  for (const std::optional<at::Tensor>& tensor : tensors) {
    if (tensor.has_value() && tensor->defined() &&
        tensor->device().type() == backend_.device_type) {
      views.push_back(view_of(*tensor));
      on_target.push_back(views.back());
    } else {
      on_target.push_back(tensor);
    }
  }
  return on_target;
}

at::Tensor DirectCall::finish(const at::Tensor& result) {
  kernel_done();
  at::Tensor on_backend = to_backend(result);
  finished_ = true;
  return on_backend;
}

std::vector<at::Tensor> DirectCall::finish(const std::vector<at::Tensor>& results) {
  kernel_done();
  std::vector<at::Tensor> on_backend;
  on_backend.reserve(results.size());
  for (const at::Tensor& result : results) on_backend.push_back(to_backend(result));
  finished_ = true;
  return on_backend;
}

void DirectCall::finish() {
  kernel_done();
  finished_ = true;
}

void DirectCall::wait_if_asked() const {
  if (cuda_sync() == CudaSync::Device) cuda::device_synchronize();
}

at::Tensor DirectCall::to_backend(const at::Tensor& result) {
  // Outputs the target kernel keeps on the CPU stay there, as in the boxed fallback.
  if (!result.defined() || result.device() != target_) return result;
  check_servable_result(rules_, backend_.device_type, result);
  return adopt_result(backend_, result, target_, *index_);
}

void DirectCall::add_context(c10::Error& error) const {
  add_target_context(error, rules_, target_);
}

at::Tensor HistcOnTarget::run(c10::DispatchKeySet keys, const at::Tensor& self, int64_t bins,
                              const c10::Scalar& min, const c10::Scalar& max) {
  if (keys.has(c10::DispatchKey::CUDA) || !histc_counts_in_double(self)) {
    return at::_ops::histc::redispatch(keys, self, bins, min, max);
  }
  return at::_ops::histc::redispatch(keys, self.to(at::kDouble), bins, min, max)
      .to(self.scalar_type());
}

std::optional<c10::DimVector> broadcast_shape(std::initializer_list<c10::IntArrayRef> sizes) {
  size_t dims = 0;
  for (c10::IntArrayRef shape : sizes) dims = std::max(dims, shape.size());
  c10::DimVector result(dims, 1);
  for (c10::IntArrayRef shape : sizes) {
    const size_t skipped = dims - shape.size();  // leading dimensions of size 1
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t& size = result[skipped + i];
      if (shape[i] == size || shape[i] == 1) continue;
      if (size != 1) return std::nullopt;
      size = shape[i];
    }
  }
  return result;
}

int64_t arange_size(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step,
                    c10::ScalarType dtype) {
  // The CPU and CUDA kernels' size (arange_out): in int64 for int64, else in
  // double. -1 where the kernels refuse, and where torch releases size a range
  // differently: fractional bounds or steps with an integer dtype, which some
  // truncate before checking and sizing and others do not.
  const auto whole = [](const c10::Scalar& value) {
    return value.isIntegral(/*includeBool=*/false) ||
           (value.isFloatingPoint() && std::trunc(value.to<double>()) == value.to<double>());
  };
  if (start.isComplex() || end.isComplex() || step.isComplex()) return -1;
  if (c10::isIntegralType(dtype, /*includeBool=*/false) &&
      !(whole(start) && whole(end) && whole(step))) {
    return -1;
  }
  if (dtype == c10::kLong) {
    const int64_t first = start.to<int64_t>();
    const int64_t last = end.to<int64_t>();
    const int64_t by = step.to<int64_t>();
    if (by == 0 || (by > 0 && last < first) || (by < 0 && last > first)) return -1;
    return (last - first + by - (by > 0 ? 1 : -1)) / by;
  }
  if (!c10::isFloatingType(dtype) && !c10::isIntegralType(dtype, /*includeBool=*/false)) {
    return -1;
  }
  const double first = start.to<double>();
  const double last = end.to<double>();
  const double by = step.to<double>();
  if (by == 0 || !std::isfinite(first) || !std::isfinite(last) || (by > 0 && last < first) ||
      (by < 0 && last > first)) {
    return -1;
  }
  const double size = std::ceil((last - first) / by);
  const bool fits = size >= 0 && size <= static_cast<double>(std::numeric_limits<int64_t>::max());
  return fits ? static_cast<int64_t>(size) : -1;
}

}  // namespace detail
}  // namespace torch_fallback
