// The boxed fallback: generalized from at::native::cpu_fallback to a target
// device (CPU or CUDA), zero-copy wherever a backend tensor's memory already
// lives on the target.
#include <torch_fallback/fallback.h>

#include <chrono>
#include <optional>

#include <ATen/MemoryOverlap.h>
#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_copy_from_and_resize.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch_fallback/cuda.h>

#include <mutex>
#include <thread>
#include <typeinfo>

#include "decompositions.h"
#include "metrics.h"
#include "op_rules.h"
#include "settings.h"
#include "small_map.h"
#include "tensors.h"

namespace torch_fallback {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t nbytes(const at::Tensor& tensor) {
  return static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
}

bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.storage_offset() == b.storage_offset();
}

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

void release_storage_reference(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

// Gives `impl` the geometry of `like`; lazy conjugation and negation travel as
// bits, not data.
void take_geometry(c10::TensorImpl* impl, const at::Tensor& like) {
  // A TensorImpl from the pool often has it already (ops of one shape come in a
  // row); its contiguity flags then still hold and need no recomputing.
  if (impl->storage_offset() != like.storage_offset() || impl->sizes() != like.sizes() ||
      impl->strides() != like.strides()) {
    impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  }
  impl->_set_conj(like.is_conj());
  impl->_set_neg(like.is_neg());
}

// The thread that loads the library: the main thread, which imports it.
const std::thread::id g_loading_thread = std::this_thread::get_id();

// A resizable storage over `home`'s bytes that keeps `backend` (whose memory
// they are) alive; a resize gives it new memory and leaves both untouched.
c10::Storage resizable_alias(const c10::Storage& backend, const c10::Storage& home) {
  const c10::Device device = home.device();
  c10::DataPtr data(const_cast<void*>(home.data()), new c10::Storage(backend),
                    &release_storage_reference, device);
  return c10::Storage(c10::Storage::use_byte_size_t(), home.nbytes(), std::move(data),
                      c10::GetAllocator(device.type()), /*resizable=*/true);
}

// The target an op runs on before its kernels are looked at: the CPU op list,
// then the target setting; 'auto' takes the GPU where the op has a kernel there.
Target wanted_target(const OpRules& rules, bool nested) {
  const Target wanted = rules.forced_to_cpu() ? Target::Cpu : target();
  if (wanted != Target::Auto) return wanted;
  const bool has_cuda_kernel = nested ? rules.has_nested_cuda_kernel : rules.has_cuda_kernel;
  return cuda::device_count() > 0 && has_cuda_kernel ? Target::Cuda : Target::Cpu;
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

// Results a backend tensor cannot be: sparse, quantized and other non-strided ones.
void check_servable_result(const OpRules& rules, c10::DeviceType backend, const at::Tensor& result) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      result.layout() == c10::kStrided && !result.is_quantized(), "torch_fallback: ",
      rules.full_name, " returned a ", result.is_quantized() ? "quantized" : "non-strided",
      " tensor (", result.toString(), "), which ", device_type_name(backend),
      " tensors cannot be. Run it on CPU or CUDA tensors instead.");
}

// The backend tensor holding a result on its home device (a zero tensor, which
// has no memory, gets some there).
at::Tensor adopt_result(const BackendAdapter& backend, const at::Tensor& result, c10::Device home,
                        c10::DeviceIndex index) {
  if (result._is_zerotensor()) {
    return backend.adopt(at::zeros(result.sizes(), result.options().device(home)), index);
  }
  return backend.adopt(result, index);
}

// Copies of the backend storages an op reads, made once per storage so that
// arguments which alias each other on the backend alias each other on the target.
struct StorageCopy {
  c10::Storage storage;  // on the target
  int64_t first_byte;    // the backend storage's byte that its byte 0 holds
};

c10::Storage empty_storage(c10::Device device) {
  return c10::Storage(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, device),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

// The dispatch keys of a CPU or CUDA TensorImpl as tensor_over makes it, lazy bits aside.
c10::DispatchKeySet plain_keys(bool cuda) {
  const auto keys_on = [](c10::Device device, c10::DispatchKey key) {
    return at::detail::make_tensor<c10::TensorImpl>(empty_storage(device),
                                                    c10::DispatchKeySet(key),
                                                    caffe2::TypeMeta::Make<float>())
        .key_set();
  };
  static const c10::DispatchKeySet cpu = keys_on(c10::Device(c10::kCPU), c10::DispatchKey::CPU);
  static const c10::DispatchKeySet on_cuda =
      keys_on(c10::Device(c10::kCUDA, 0), c10::DispatchKey::CUDA);
  return cuda ? on_cuda : cpu;
}

// Whether `tensor` is a plain CPU or CUDA TensorImpl that nothing else holds and
// no kernel gave state a fresh one lacks: one the fallback may set up anew.
bool is_plain_and_unshared(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.use_count() != 1 || tensor.weak_use_count() != 1) return false;
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  if (!impl->is_cpu() && !impl->is_cuda()) return false;
  // The key set tells a plain TensorImpl from its subclasses (nested, sparse, ...).
  return impl->key_set().remove(c10::DispatchKey::Conjugate).remove(c10::DispatchKey::Negative) ==
             plain_keys(impl->is_cuda()) &&
         impl->autograd_meta() == nullptr && impl->get_backend_meta() == nullptr &&
         !impl->is_wrapped_number() && impl->allow_tensor_metadata_change();
}

}  // namespace

namespace detail {

// The target tensors of a call are made by the hundred in a training step (a
// _foreach_ op's lists) and dropped when the call ends. Each thread keeps the
// TensorImpls its calls dropped and sets them up again for the next call,
// instead of allocating, constructing and destroying one per tensor.
class TargetImplPool {
  using Impl = c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

 public:
  // This thread's pool, or none where target tensors must be made as usual:
  // inference tensors, and tensors Python dispatch modes may keep.
  static TargetImplPool* for_this_call() {
    if (c10::InferenceMode::is_enabled() || c10::impl::TorchDispatchModeTLS::any_modes_set()) {
      return nullptr;
    }
    thread_local TargetImplPool pool;
    return &pool;
  }

  ~TargetImplPool() {
    // The main thread's pool goes after Python has finalized: an impl that a
    // Python kernel once wrapped must not touch its PyObject then.
    if (std::this_thread::get_id() != g_loading_thread) return;
    for (auto* parked : {&cpu_, &cuda_}) {
      for (auto& impl : *parked) impl.release();
    }
  }

  // A CPU or CUDA tensor over `storage` with the geometry of `like` (tensor_over's).
  at::Tensor take(const c10::Storage& storage, c10::Device device, const at::Tensor& like) {
    auto& parked = device.is_cuda() ? cuda_ : cpu_;
    if (parked.empty()) return tensor_over(storage, device, like);
    Impl impl = std::move(parked.back());
    parked.pop_back();
    impl->set_storage_and_dtype(storage, like.dtype());
    take_geometry(impl.get(), like);
    return at::Tensor(std::move(impl));
  }

  // Keeps `tensor`'s TensorImpl for a later call when nothing else holds it
  // and no kernel gave it state a fresh one lacks.
  void park(at::Tensor&& tensor) {
    if (!is_plain_and_unshared(tensor)) return;
    c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    const bool cuda = impl->is_cuda();
    auto& parked = cuda ? cuda_ : cpu_;
    if (parked.size() >= kCapacity) return;
    impl->set_storage_keep_dtype(cuda ? empty_cuda_ : empty_cpu_);  // frees no memory late
    parked.push_back(tensor.unsafeReleaseIntrusivePtr());
  }

 private:
  static constexpr size_t kCapacity = 1024;

  std::vector<Impl> cpu_;
  std::vector<Impl> cuda_;
  c10::Storage empty_cpu_ = empty_storage(c10::Device(c10::kCPU));
  c10::Storage empty_cuda_ = empty_storage(c10::Device(c10::kCUDA, 0));
};

// A backend tensor's view on the target, kept with it (as its BackendMeta) from
// one call to the next: an optimizer's _foreach_ ops view the same parameters
// and states, with the same geometry, at every step. A view is reused only
// while it still matches its tensor (the same backend storage and bytes, the
// same geometry and lazy bits); else it is made anew. Shallow copies (detach,
// .data) start without one.
class KeptTargetView final : public c10::BackendMeta {
 public:
  c10::intrusive_ptr<c10::BackendMeta> clone(
      const c10::intrusive_ptr<c10::BackendMeta>& /*ptr*/) const override {
    return nullptr;
  }

  struct View {
    at::Tensor tensor;
    // The adapter gives this backend storage the same target storage at every
    // call: then every view of it shares that storage, with no bookkeeping.
    bool shared_storage;
  };

  // The kept view of `tensor` on `target`, if it still matches the tensor.
  std::optional<View> get(const at::Tensor& tensor, c10::Device target) {
    std::lock_guard<std::mutex> lock(mutex_);
    const c10::Storage& storage = tensor.storage();
    if (!view_.tensor.defined() || backend_storage_ != storage.unsafeGetStorageImpl() ||
        view_.tensor.device() != target || view_.tensor.dtype() != tensor.dtype()) {
      return std::nullopt;
    }
    const c10::Storage& viewed = view_.tensor.storage();
    if (viewed.data() != storage.data() || viewed.nbytes() != storage.nbytes() ||
        !same_geometry(view_.tensor, tensor) || view_.tensor.is_conj() != tensor.is_conj() ||
        view_.tensor.is_neg() != tensor.is_neg()) {
      return std::nullopt;
    }
    return view_;
  }

  void keep(const at::Tensor& tensor, View view) {
    std::lock_guard<std::mutex> lock(mutex_);
    backend_storage_ = tensor.storage().unsafeGetStorageImpl();
    view_ = std::move(view);
  }

  // The kept view of `tensor`'s TensorImpl. With `add`, one is added where the
  // tensor has no BackendMeta (a backend's own is left alone) and has been
  // written in place twice already: a parameter or an optimizer state, which
  // later calls will view again, not a temporary that dies within the step.
  static KeptTargetView* of(const at::Tensor& tensor, bool add) {
    c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    c10::BackendMeta* meta = impl->get_backend_meta();
    if (meta == nullptr && add && impl->version_counter().enabled() &&
        impl->version_counter().current_version() >= 2) {
      impl->set_backend_meta(c10::make_intrusive<KeptTargetView>());
      meta = impl->get_backend_meta();
    }
    return meta != nullptr && typeid(*meta) == typeid(KeptTargetView)
               ? static_cast<KeptTargetView*>(meta)
               : nullptr;
  }

 private:
  std::mutex mutex_;
  c10::StorageImpl* backend_storage_ = nullptr;  // compared only: the tensor holds it
  View view_;
};

}  // namespace detail

namespace {

using detail::KeptTargetView;
using detail::TargetImplPool;

// tensor_over's tensor, set up from `pool`'s TensorImpls where there is a pool.
at::Tensor pooled_tensor_over(TargetImplPool* pool, const c10::Storage& storage,
                              c10::Device device, const at::Tensor& like) {
  return pool != nullptr ? pool->take(storage, device, like) : tensor_over(storage, device, like);
}

// One run of one op through the fallback.
class FallbackCall {
 public:
  FallbackCall(const BackendAdapter& backend, const c10::OperatorHandle& op,
               torch::jit::Stack* stack)
      : backend_(backend),
        schema_(op.schema()),
        op_(op),
        stack_(stack),
        rules_(op_rules(op)) {}

  ~FallbackCall() {
    if (pool_ == nullptr) return;
    on_target_.clear();  // the last holders of the target tensors besides targets_
    for (auto& entry : targets_) pool_->park(std::move(entry.second));
  }

  FallbackCall(const FallbackCall&) = delete;
  FallbackCall& operator=(const FallbackCall&) = delete;

  void run() {
    const auto start = Clock::now();
    try {
      refuse_unservable();
      find_backend_device();
      choose_target();
      // With one GPU visible it is the current device already: no need to ask CUDA.
      std::optional<cuda::DeviceScope> cuda_scope;
      if (target_.is_cuda() && cuda::device_count() > 1) cuda_scope.emplace(target_.index());
      find_resizable_storages();
      move_arguments_to_target();
      call_op();
      written_versions_.pass_on();
      write_back_mutated_arguments();
      move_returns_to_backend();
      wait_for_queued_copies();
    } catch (...) {
      call_.failed = true;
      try {
        wait_for_queued_copies();
      } catch (...) {
        // The op's own error is the one to report.
      }
      finish(start);
      throw;
    }
    finish(start);
  }

 private:
  const std::string& full_name() const { return rules_.full_name; }

  // For error messages only (TORCH_CHECK evaluates its message on failure).
  std::string backend_name() const { return device_type_name(backend_.device_type); }

  void finish(Clock::time_point start) {
    call_.on_cuda = target_.is_cuda();
    call_.time_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    metrics::record(*rules_.counters, call_);
  }

  // Before anything runs: ops whose results a backend tensor cannot hold.
  void refuse_unservable() const {
    TORCH_CHECK_NOT_IMPLEMENTED(
        !rules_.returns_a_view, "torch_fallback: ", full_name(),
        " returns a view of its input, which a boxed fallback cannot give ", backend_name(),
        ": its result would be a copy that no longer shares memory with the input. Register a "
        "native ",
        backend_name(), " kernel for ", full_name(),
        " (torch_fallback::register_view_kernels covers the common views).");
    TORCH_CHECK_NOT_IMPLEMENTED(rules_.unservable_result.empty(), "torch_fallback: ",
                                full_name(), " makes ", rules_.unservable_result,
                                " tensors, which ", backend_name(),
                                " tensors cannot be. Run it on CPU or CUDA tensors instead.");
    const size_t first = stack_->size() - schema_.arguments().size();
    for (size_t i : rules_.dtype_arguments) {
      const c10::IValue& arg = (*stack_)[first + i];
      if (arg.isNone()) continue;
      const auto dtype = static_cast<c10::ScalarType>(arg.toInt());
      TORCH_CHECK_NOT_IMPLEMENTED(!c10::isQIntType(dtype), "torch_fallback: ", full_name(),
                                  " would make a quantized (", dtype, ") tensor, which ",
                                  backend_name(),
                                  " tensors cannot be. Quantize CPU or CUDA tensors instead.");
    }
    for (size_t i : rules_.layout_arguments) {
      const c10::IValue& arg = (*stack_)[first + i];
      if (arg.isNone()) continue;
      const auto layout = static_cast<c10::Layout>(arg.toInt());
      TORCH_CHECK_NOT_IMPLEMENTED(layout == c10::kStrided, "torch_fallback: ", full_name(),
                                  " would make a tensor of layout ", layout, ", which ",
                                  backend_name(),
                                  " tensors cannot have (only torch.strided). Use CPU or CUDA "
                                  "tensors for other layouts.");
    }
  }

  void check_tensor_device(const at::Tensor& tensor) {
    if (!tensor.defined()) return;
    const c10::Device device = tensor.device();
    if (device.type() == backend_.device_type) {
      TORCH_CHECK_NOT_IMPLEMENTED(tensor.layout() == c10::kStrided, "torch_fallback: ",
                                  full_name(), " got a ", backend_name(), " tensor of layout ",
                                  tensor.layout(), "; ", backend_name(),
                                  " serves strided (and nested) tensors only.");
      if (!backend_index_) {
        backend_index_ = device.index();
        return;
      }
      TORCH_CHECK(*backend_index_ == device.index(), "torch_fallback: ", full_name(),
                  " got tensors on ", backend_name(), ":", static_cast<int>(*backend_index_),
                  " and on ", device, "; move them to one device first.");
      return;
    }
    // TensorIterator takes 0-dim CPU tensors as scalars on any device, and
    // some ops take index tensors on the CPU as CUDA does.
    TORCH_CHECK(device.is_cpu() && (tensor.dim() == 0 || rules_.accepts_cpu_tensors),
                "torch_fallback: ", full_name(), " got a tensor on ", device, " together with ",
                backend_name(), " tensors; all its tensors must be on ", backend_name(),
                " (0-dim CPU tensors excepted). Move it there first, e.g. with .to('",
                backend_name(), "').");
  }

  template <typename Visit>
  static void for_each_tensor_in(const c10::IValue& arg, Visit&& visit) {
    if (arg.isTensor()) {
      visit(arg.toTensor());
    } else if (arg.isTensorList()) {
      for (const at::Tensor& tensor : arg.toTensorList()) visit(tensor);
    } else if (arg.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& tensor : arg.toOptionalTensorList()) {
        if (tensor) visit(*tensor);
      }
    }
  }

  // Visits the tensor arguments as the caller passed them.
  template <typename Visit>
  void for_each_tensor_argument(Visit&& visit) {
    const auto args = originals_.empty()
                          ? torch::jit::last(*stack_, schema_.arguments().size())
                          : c10::ArrayRef<c10::IValue>(originals_);
    for (const auto& arg : args) for_each_tensor_in(arg, visit);
  }

  void find_backend_device() {
    for_each_tensor_argument([this](const at::Tensor& tensor) {
      check_tensor_device(tensor);
      nested_ = nested_ || (tensor.defined() && tensor.is_nested());
    });
    if (backend_index_) return;
    for (const auto& arg : torch::jit::last(*stack_, schema_.arguments().size())) {
      if (arg.isDevice() && arg.toDevice().type() == backend_.device_type &&
          arg.toDevice().has_index()) {
        backend_index_ = arg.toDevice().index();
        return;
      }
    }
  }

  c10::DeviceIndex backend_index() const { return backend_device_index(backend_, backend_index_); }

  void choose_target() {
    if (wanted_target(rules_, nested_) == Target::Cuda) {
      // Computed: a composite kernel (convolution's, say) serves CUDA too.
      const bool has_cuda_kernel = nested_ ? rules_.has_nested_cuda_kernel : rules_.has_cuda_kernel;
      cuda::check_usable("the CUDA fallback target", full_name());
      TORCH_CHECK_NOT_IMPLEMENTED(
          has_cuda_kernel, "torch_fallback: ", full_name(),
          " has no CUDA kernel in this PyTorch, so the CUDA fallback target cannot serve it. "
          "Use the 'auto' target, which runs such ops on the CPU, or put the op on the CPU op "
          "list (TORCH_FALLBACK_CPU_OPS or torch_fallback.set_cpu_ops).");
      const c10::DeviceIndex index = backend_index();
      TORCH_CHECK(index < cuda::device_count(), "torch_fallback: ", backend_name(), ":",
                  static_cast<int>(index), " runs its CUDA fallback on cuda:",
                  static_cast<int>(index), ", but only ",
                  static_cast<int>(cuda::device_count()), " GPU(s) are visible.");
      target_ = c10::Device(c10::kCUDA, index);
      decomposition_ = rules_.cuda_runner;
      return;
    }
    target_ = c10::Device(c10::kCPU);
    if (nested_ ? rules_.has_nested_cpu_kernel : rules_.has_cpu_kernel) return;
    decomposition_ = rules_.cpu_decomposition;
    TORCH_CHECK_NOT_IMPLEMENTED(
        decomposition_ != nullptr, "torch_fallback: ", full_name(),
        " has no CPU kernel in this PyTorch and torch_fallback has no decomposition for it, so "
        "the CPU fallback target cannot serve it.",
        cuda::device_count() > 0 ? " Use the CUDA target (TORCH_FALLBACK_TARGET=cuda or auto)."
                                 : " It needs a CUDA build of PyTorch and a GPU.");
  }

  // One home storage per backend storage, so that tensors which alias each
  // other on the backend alias each other on the target too. The kernel may
  // resize a storage (an out= argument growing): it gets a storage of its own
  // over the same bytes, so that a resize swaps that storage's memory, never
  // the backend's; write_back then copies back.
  const c10::Storage& home_storage(const c10::Storage& storage) {
    c10::StorageImpl* key = storage.unsafeGetStorageImpl();
    if (c10::Storage* known = home_storages_.find(key)) return *known;
    c10::Storage home = backend_.home_storage(storage);
    if (resizable_storages_.find(key) != nullptr) home = resizable_alias(storage, home);
    return home_storages_.insert(key, std::move(home));
  }

  void find_resizable_storages() {
    const size_t first = stack_->size() - schema_.arguments().size();
    for (size_t i : rules_.resizable_arguments) {
      for_each_tensor_in((*stack_)[first + i], [this](const at::Tensor& tensor) {
        if (!is_backend(tensor) || tensor.is_nested()) return;
        c10::StorageImpl* key = tensor.storage().unsafeGetStorageImpl();
        if (resizable_storages_.find(key) == nullptr) resizable_storages_.insert(key, true);
      });
    }
  }

  bool is_backend(const at::Tensor& tensor) const {
    return tensor.defined() && tensor.device().type() == backend_.device_type;
  }

  // Whether more than one argument tensor views `storage`: then the op must
  // see one copy of it on the target, not one per tensor.
  bool shared_by_arguments(c10::StorageImpl* storage) {
    if (bool* known = shared_storages_.find(storage)) return *known;
    const c10::TensorImpl* first = nullptr;
    bool shared = false;
    for_each_tensor_argument([&](const at::Tensor& tensor) {
      if (!is_backend(tensor) || tensor.is_nested() ||
          tensor.storage().unsafeGetStorageImpl() != storage) {
        return;
      }
      if (first == nullptr) first = tensor.unsafeGetTensorImpl();
      shared = shared || first != tensor.unsafeGetTensorImpl();
    });
    return shared_storages_.insert(storage, shared);
  }

  // The target copy of the bytes of a shared storage that the op's arguments span.
  const StorageCopy& storage_copy(const at::Tensor& tensor, c10::Device home) {
    c10::StorageImpl* key = tensor.storage().unsafeGetStorageImpl();
    if (const StorageCopy* known = storage_copies_.find(key)) return *known;
    int64_t first = std::numeric_limits<int64_t>::max();
    int64_t end = 0;
    for_each_tensor_argument([&](const at::Tensor& other) {
      if (!is_backend(other) || other.is_nested() ||
          other.storage().unsafeGetStorageImpl() != key) {
        return;
      }
      const auto [a, b] = byte_extent(other);
      first = std::min(first, a);
      end = std::max(end, b);
    });
    first -= first % 16;  // a multiple of every element size
    const at::Tensor home_bytes =
        at::detail::make_tensor<c10::TensorImpl>(
            c10::Storage(home_storage(tensor.storage())),
            c10::DispatchKeySet(home.is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU),
            caffe2::TypeMeta::Make<uint8_t>())
            .as_strided({end - first}, {1}, first);
    const at::Tensor on_target = copied_to_target(home_bytes);
    call_.bytes_to_target += static_cast<uint64_t>(end - first);
    return storage_copies_.insert(key, StorageCopy{on_target.storage(), first});
  }

  at::Tensor copy_to_target(const at::Tensor& tensor, c10::Device home) {
    if (shared_by_arguments(tensor.storage().unsafeGetStorageImpl())) {
      const StorageCopy& copy = storage_copy(tensor, home);
      const int64_t shift = copy.first_byte / static_cast<int64_t>(tensor.element_size());
      auto on_target = tensor_over(copy.storage, target_, tensor);
      on_target.unsafeGetTensorImpl()->set_storage_offset(tensor.storage_offset() - shift);
      return on_target;
    }
    call_.bytes_to_target += nbytes(tensor);
    return copied_to_target(tensor_over(home_storage(tensor.storage()), home, tensor));
  }

  // Copies to the GPU are queued on the current stream; from page-locked host
  // memory they run asynchronously, and the call waits for them before it
  // returns (wait_for_queued_copies) unless a copy back to the host already did.
  at::Tensor copied_to_target(const at::Tensor& on_home) {
    const bool queued = target_.is_cuda() && on_home.is_cpu();
    awaiting_copies_ = awaiting_copies_ || queued;
    return on_home.to(at::TensorOptions().device(target_), /*non_blocking=*/queued,
                      /*copy=*/true);
  }

  // A result copied from the GPU lands in page-locked host memory: the copy
  // runs at full speed, and so does the next copy of it to the GPU.
  at::Tensor copied_to_home(const at::Tensor& on_target, c10::Device home) {
    if (!(on_target.is_cuda() && home.is_cpu())) {
      return on_target.to(at::TensorOptions().device(home), /*non_blocking=*/false,
                          /*copy=*/true);
    }
    at::Tensor staged =
        at::empty_like(on_target, on_target.options().device(home).pinned_memory(true));
    staged.copy_(on_target);  // waits for the stream, and so for the queued copies
    awaiting_copies_ = false;
    return staged;
  }

  // The host memory of queued copies must not change before they are done.
  void wait_for_queued_copies() {
    if (!awaiting_copies_) return;
    awaiting_copies_ = false;
    c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(target_).synchronize();
  }

  // An out= argument on the target: its contents are only written, so a copy
  // needs only its geometry, unless another argument views the same memory.
  at::Tensor out_to_target(const at::Tensor& tensor) {
    if (!is_backend(tensor) || tensor.is_nested() ||
        backend_.home_device(tensor.storage()) == target_ ||
        shared_by_arguments(tensor.storage().unsafeGetStorageImpl())) {
      return to_target(tensor);
    }
    c10::TensorImpl* key = tensor.unsafeGetTensorImpl();
    if (const at::Tensor* known = targets_.find(key)) return *known;
    at::Tensor fresh = at::empty_strided(tensor.sizes(), tensor.strides(),
                                         tensor.options().device(target_));
    fresh._set_conj(tensor.is_conj());
    fresh._set_neg(tensor.is_neg());
    return targets_.insert(key, std::move(fresh));
  }

  // The target tensor for a backend tensor: one per backend tensor, so that an
  // argument passed twice (self and out=) is one tensor to the kernel too.
  at::Tensor to_target(const at::Tensor& tensor) {
    if (!is_backend(tensor)) return tensor;
    c10::TensorImpl* key = tensor.unsafeGetTensorImpl();
    if (const at::Tensor* known = targets_.find(key)) return *known;
    if (tensor.is_nested()) {
      return targets_.insert(key, map_nested_buffer(tensor, [this](const at::Tensor& buffer) {
        return to_target(buffer);
      }));
    }
    const c10::Storage& home = home_storage(tensor.storage());
    const c10::Device device = home.device();
    if (device == target_) {
      return targets_.insert(key, pooled_tensor_over(pool_, home, device, tensor));
    }
    return targets_.insert(key, copy_to_target(tensor, device));
  }

  at::Tensor to_backend(const at::Tensor& tensor) {
    if (!tensor.defined()) return tensor;
    // Outputs the target kernel keeps on the CPU (a CUDA kernel's RNG seed, say) stay there.
    if (tensor.device() != target_) return tensor;
    if (tensor.is_nested()) {
      return map_nested_buffer(tensor, [this](const at::Tensor& buffer) {
        return to_backend(buffer);
      });
    }
    check_servable_result(rules_, backend_.device_type, tensor);
    const c10::DeviceIndex index = backend_index();
    const c10::Device home = backend_.output_home(index);
    if (tensor.device() == home || tensor._is_zerotensor()) {
      return adopt_result(backend_, tensor, home, index);
    }
    call_.bytes_from_target += nbytes(tensor);
    return backend_.adopt(copied_to_home(tensor, home), index);
  }

  void move_arguments_to_target() {
    const size_t num_args = schema_.arguments().size();
    const size_t first = stack_->size() - num_args;
    originals_.assign(stack_->begin() + first, stack_->end());
    size_t tensors = 0;
    for (const c10::IValue& arg : originals_) {
      tensors += arg.isTensor() ? 1 : (arg.isList() ? arg.toListRef().size() : 0);
    }
    targets_.reserve(tensors);  // a _foreach_ op's lists would grow them step by step
    home_storages_.reserve(tensors);
    const auto& schema_args = schema_.arguments();
    for (size_t i = 0; i < num_args; ++i) {
      c10::IValue& arg = (*stack_)[first + i];
      if (arg.isTensor()) {
        arg = schema_args[i].is_out() ? out_to_target(arg.toTensor()) : to_target(arg.toTensor());
      } else if (arg.isTensorList()) {
        const auto tensors = arg.toTensorList();
        c10::List<at::Tensor> moved;
        moved.reserve(tensors.size());
        for (const at::Tensor& tensor : tensors) moved.push_back(to_target(tensor));
        arg = std::move(moved);
      } else if (arg.isOptionalTensorList()) {
        const auto tensors = arg.toOptionalTensorList();
        c10::List<std::optional<at::Tensor>> moved;
        moved.reserve(tensors.size());
        for (const std::optional<at::Tensor>& tensor : tensors) {
          moved.push_back(tensor ? std::optional<at::Tensor>(to_target(*tensor)) : tensor);
        }
        arg = std::move(moved);
      } else if (arg.isDevice() && arg.toDevice().type() == backend_.device_type) {
        arg = target_;
      }
    }
    if (backend_.target_generator != nullptr) {
      for (size_t i : rules_.generator_arguments) {
        c10::IValue& arg = (*stack_)[first + i];
        if (arg.isNone() || (arg.isGenerator() && arg.toGenerator().device().type() ==
                                                      backend_.device_type)) {
          arg = backend_.target_generator(
              arg.isNone() ? std::nullopt : std::optional<at::Generator>(arg.toGenerator()),
              backend_index(), target_);
        }
      }
    }
    // What the kernel writes, for write_back (the kernel's outputs replace the stack).
    if (!rules_.written_arguments.empty()) {
      on_target_.assign(stack_->begin() + first, stack_->end());
      for (size_t i : rules_.written_arguments) watch_versions(originals_[i], on_target_[i]);
    }
  }

  // Calls visit(original, on_target) for each tensor of an argument (a tensor or
  // a list) and the target tensor that stands for it.
  template <typename Visit>
  static void for_each_tensor_pair(const c10::IValue& original, const c10::IValue& on_target,
                                   Visit&& visit) {
    if (original.isTensor()) {
      visit(original.toTensor(), on_target.toTensor());
    } else if (original.isTensorList()) {
      const auto originals = original.toTensorList();
      const auto targets = on_target.toTensorList();
      for (size_t j = 0; j < originals.size(); ++j) visit(originals[j], targets[j]);
    } else if (original.isOptionalTensorList()) {
      const auto originals = original.toOptionalTensorList();
      const auto targets = on_target.toOptionalTensorList();
      for (size_t j = 0; j < originals.size(); ++j) {
        const std::optional<at::Tensor> a = originals[j];
        const std::optional<at::Tensor> b = targets[j];
        if (a && b) visit(*a, *b);
      }
    }
  }

  void watch_versions(const c10::IValue& original, const c10::IValue& on_target) {
    for_each_tensor_pair(original, on_target, [this](const at::Tensor& a, const at::Tensor& b) {
      watch_version(a, b);
    });
  }

  // A backend tensor has one target tensor, however often it is listed.
  void watch_version(const at::Tensor& original, const at::Tensor& on_target) {
    if (!original.defined() || watched_.find(original.unsafeGetTensorImpl()) != nullptr) return;
    watched_.insert(original.unsafeGetTensorImpl(), true);
    written_versions_.watch(original, on_target);
  }

  void call_op() {
    try {
      if (decomposition_ != nullptr) {
        decomposition_(op_, stack_);
      } else {
        op_.callBoxed(stack_);
      }
    } catch (c10::Error& error) {
      refuse_resized_in_place_argument(error);
      add_target_context(error, rules_, target_);
      throw;
    }
    if (target_.is_cuda() && cuda_sync() == CudaSync::Device) cuda::device_synchronize();
  }

  // Some kernels resize an in-place op's self to the broadcast shape (CPU
  // addbmm_, say); eager lets them, the fallback refuses. Arguments written in
  // place run on the backend's own storage, which refuses a resize.
  void refuse_resized_in_place_argument(const c10::Error& error) const {
    if (error.msg().find("Trying to resize storage that is not resizable") == std::string::npos) {
      return;
    }
    const auto& args = schema_.arguments();
    for (size_t i : rules_.written_arguments) {
      if (args[i].is_out() || !originals_[i].isTensor()) continue;
      TORCH_CHECK(false, "torch_fallback: ", full_name(),
                  " would change the shape of its in-place argument '", args[i].name(),
                  "' from ", originals_[i].toTensor().sizes(),
                  "; an in-place op never resizes its input. Use the out-of-place op instead.");
    }
  }

  // Makes `original` (a backend tensor) hold what the op wrote into `written`.
  void write_back(const at::Tensor& written, const at::Tensor& original, bool may_resize) {
    if (!is_backend(original) || !written.defined()) return;
    if (original.is_nested()) return;  // nested tensors are never mutated in place here
    const c10::Storage* home = home_storages_.find(original.storage().unsafeGetStorageImpl());
    const bool shares_memory = home != nullptr && written.storage().is_alias_of(*home) &&
                               written.storage().data() == original.storage().data();
    if (written.sizes() != original.sizes()) {
      // Eager never resizes an in-place op's self; the target kernel did not either
      // unless the op is wrong for this input, so refuse rather than change it.
      TORCH_CHECK(may_resize, "torch_fallback: ", full_name(), " would change the shape of ",
                  "its in-place argument from ", original.sizes(), " to ", written.sizes(),
                  "; an in-place op never resizes its input. Use the out-of-place op instead.");
    }
    if (shares_memory) {
      // Written in place; an out= argument may still have been resized within its
      // capacity, or given a lazy conjugation (linalg_lu_solve's, for left=False).
      if (!same_geometry(written, original)) {
        original.unsafeGetTensorImpl()->set_sizes_and_strides(written.sizes(), written.strides(),
                                                              written.storage_offset());
      }
      if (written.is_conj() != original.is_conj()) original._set_conj(written.is_conj());
      if (written.is_neg() != original.is_neg()) original._set_neg(written.is_neg());
      return;
    }
    const c10::Device home_device = backend_.home_device(original.storage());
    if (written.device() != home_device) call_.bytes_from_target += nbytes(written);
    at::_copy_from_and_resize(written, original);
    // A copy to the host waits for the stream, and so for the queued copies.
    if (written.is_cuda() && home_device.is_cpu()) awaiting_copies_ = false;
  }

  void write_back_argument(size_t i, bool may_resize) {
    for_each_tensor_pair(originals_[i], on_target_[i],
                         [&](const at::Tensor& original, const at::Tensor& written) {
                           write_back(written, original, may_resize);
                         });
  }

  bool is_also_an_input(size_t i) const {
    if (!originals_[i].isTensor()) return false;
    const c10::TensorImpl* impl = originals_[i].toTensor().unsafeGetTensorImpl();
    for (size_t j = 0; j < originals_.size(); ++j) {
      if (j != i && originals_[j].isTensor() &&
          originals_[j].toTensor().unsafeGetTensorImpl() == impl) {
        return true;
      }
    }
    return false;
  }

  void write_back_mutated_arguments() {
    const auto& args = schema_.arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      const auto* alias = args[i].alias_info();
      if (alias != nullptr && alias->isWrite()) {
        // out= arguments may be resized; an in-place op's self may not, nor an
        // out= argument that is also an input (an in-place op calling its out= form).
        write_back_argument(i, args[i].is_out() && !is_also_an_input(i));
      }
    }
    // Arguments that kernels write although the schema does not say so.
    for (size_t i : rules_.hidden_mutations) write_back_argument(i, /*may_resize=*/false);
  }

  const c10::IValue& mutated_argument_for(const c10::AliasInfo& ret_alias) const {
    const auto& args = schema_.arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      const auto* alias = args[i].alias_info();
      if (alias != nullptr && alias->isWrite() && alias->beforeSets() == ret_alias.beforeSets()) {
        return originals_[i];
      }
    }
    TORCH_INTERNAL_ASSERT(false, "torch_fallback: ", full_name(),
                          " returns a mutated alias that matches none of its arguments");
  }

  void move_returns_to_backend() {
    const auto& returns = schema_.returns();
    const size_t first = stack_->size() - returns.size();
    for (size_t r = 0; r < returns.size(); ++r) {
      c10::IValue& value = (*stack_)[first + r];
      const auto* alias = returns[r].alias_info();
      if (alias != nullptr && alias->isWrite()) {
        value = mutated_argument_for(*alias);
      } else if (value.isTensor()) {
        value = to_backend(value.toTensor());
      } else if (value.isTensorList()) {
        const auto tensors = value.toTensorList();
        c10::List<at::Tensor> moved;
        moved.reserve(tensors.size());
        for (const at::Tensor& tensor : tensors) moved.push_back(to_backend(tensor));
        value = std::move(moved);
      }
    }
  }

  const BackendAdapter& backend_;
  const c10::FunctionSchema& schema_;
  const c10::OperatorHandle& op_;
  torch::jit::Stack* stack_;
  const OpRules& rules_;
  TargetImplPool* const pool_ = TargetImplPool::for_this_call();

  std::optional<c10::DeviceIndex> backend_index_;
  bool nested_ = false;  // a nested tensor among the arguments
  c10::Device target_{c10::kCPU};
  bool awaiting_copies_ = false;  // copies to the GPU nobody has waited for yet
  Decomposition decomposition_ = nullptr;
  SmallMap<c10::StorageImpl*, c10::Storage> home_storages_;
  SmallMap<c10::StorageImpl*, bool> shared_storages_;
  SmallMap<c10::StorageImpl*, bool> resizable_storages_;
  SmallMap<c10::StorageImpl*, StorageCopy, 2> storage_copies_;
  SmallMap<c10::TensorImpl*, at::Tensor> targets_;
  c10::SmallVector<c10::IValue, 8> originals_;
  c10::SmallVector<c10::IValue, 8> on_target_;
  detail::WrittenVersions written_versions_;
  SmallMap<c10::TensorImpl*, bool> watched_;
  metrics::Call call_;
};

}  // namespace

at::Tensor tensor_over(const c10::Storage& storage, c10::Device device, const at::Tensor& like) {
  const auto key = c10::computeDispatchKey(std::nullopt, c10::kStrided, device);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
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

void boxed_fallback(const BackendAdapter& backend, const c10::OperatorHandle& op,
                    torch::jit::Stack* stack) {
  FallbackCall(backend, op, stack).run();
}

at::Tensor backend_tensor_over(c10::Storage storage, const at::Tensor& home_tensor) {
  const c10::Device device = storage.device();
  if (is_plain_and_unshared(home_tensor) && !c10::impl::TorchDispatchModeTLS::any_modes_set()) {
    c10::TensorImpl* impl = home_tensor.unsafeGetTensorImpl();
    impl->set_storage_keep_dtype(std::move(storage));
    impl->_change_backend_component_keys(device);
    return home_tensor;
  }
  return tensor_over(storage, device, home_tensor);
}

at::Tensor home_view(const BackendAdapter& backend, const at::Tensor& tensor) {
  return tensor_over(backend.home_storage(tensor.storage()), backend.home_device(tensor.storage()),
                     tensor);
}

void copy_between(const BackendAdapter& backend, const at::Tensor& src, const at::Tensor& dst,
                  bool non_blocking) {
  // Every autocast cast comes here: the views are the pool's, as a DirectCall's are.
  TargetImplPool* const pool = TargetImplPool::for_this_call();
  const auto on_home = [&](const at::Tensor& tensor) {
    if (tensor.device().type() != backend.device_type) return tensor;
    const c10::Storage& storage = tensor.storage();
    return pooled_tensor_over(pool, backend.home_storage(storage), backend.home_device(storage),
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

void WrittenVersions::watch(const at::Tensor& backend, const at::Tensor& target) {
  c10::TensorImpl* backend_impl = backend.unsafeGetTensorImpl();
  c10::TensorImpl* target_impl = target.unsafeGetTensorImpl();
  if (backend_impl == target_impl || !backend_impl->version_counter().enabled() ||
      !target_impl->version_counter().enabled()) {
    return;
  }
  watched_.push_back({backend_impl, target_impl, target_impl->version_counter().current_version()});
}

void WrittenVersions::pass_on() const {
  // Backend views of one tensor share its count, as their target tensors'
  // writes would in eager; each target tensor is watched once.
  for (const Watched& watched : watched_) {
    const uint32_t writes =
        watched.target->version_counter().current_version() - watched.target_before;
    for (uint32_t i = 0; i < writes; ++i) watched.backend->bump_version();
  }
}

DirectCall::DirectCall(const BackendAdapter& backend, const OpRules& rules)
    : backend_(backend), rules_(rules), start_(Clock::now()) {}

const OpRules& DirectCall::rules_for(const c10::OperatorHandle& op) { return op_rules(op); }

DirectCall::~DirectCall() {
  if (!started_) return;  // the boxed fallback serves (and counts) the call
  if (pool_ != nullptr) {
    for (at::Tensor& view : views_) pool_->park(std::move(view));
    for (auto& views : view_lists_) {
      for (at::Tensor& view : views) pool_->park(std::move(view));
    }
  }
  metrics::Call call;
  call.on_cuda = target_.is_cuda();
  call.unboxed = true;
  call.failed = !finished_;
  call.time_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count());
  metrics::record(*rules_.counters, call);
}

void DirectCall::offer(const at::Tensor& tensor) {
  if (!usable_ || !tensor.defined()) return;
  const c10::Device device = tensor.device();
  if (device.type() != backend_.device_type) {
    // TensorIterator takes 0-dim CPU tensors as scalars on any device.
    usable_ = device.is_cpu() && tensor.dim() == 0;
    return;
  }
  if (tensor.layout() != c10::kStrided || tensor.is_nested() ||
      (index_ && *index_ != device.index())) {
    usable_ = false;
    return;
  }
  const c10::Device home = backend_.home_device(tensor.storage());
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
  for (const at::Tensor& tensor : tensors) offer(tensor);
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

void DirectCall::offer(std::optional<c10::ScalarType> dtype) {
  usable_ = usable_ && !(dtype && c10::isQIntType(*dtype));
}

bool DirectCall::start() {
  if (!usable_ || !rules_.runs_direct || !home_) return false;
  const c10::DeviceIndex index = backend_device_index(backend_, index_);
  if (wanted_target(rules_, /*nested=*/false) == Target::Cuda) {
    if (!rules_.has_cuda_kernel || index >= cuda::device_count()) return false;
    cuda::check_usable("the CUDA fallback target", rules_.full_name);
    target_ = c10::Device(c10::kCUDA, index);
    target_keys_ = c10::DispatchKeySet(c10::DispatchKey::CUDA);
  } else if (!rules_.has_cpu_kernel) {
    return false;
  }
  if (*home_ != target_ || backend_.output_home(index) != target_) return false;
  index_ = index;
  pool_ = TargetImplPool::for_this_call();
  views_.reserve(tensors_);
  homes_.reserve(tensors_ + list_tensors_);
  started_ = true;
  if (target_.is_cuda() && cuda::device_count() > 1) device_scope_.emplace(target_.index());
  return true;
}

const c10::Storage* DirectCall::home_in_call(c10::StorageImpl* backend_storage) const {
  // A linear search: cheaper under callgrind than SmallMap's index even for
  // _foreach_addcdiv_'s 222 tensors (782K against 788K instructions per call).
  for (const auto& [storage, on_target] : homes_) {
    if (storage == backend_storage) return &on_target;
  }
  return nullptr;
}

at::Tensor DirectCall::view_of(const at::Tensor& tensor) {
  c10::StorageImpl* backend_storage = tensor.storage().unsafeGetStorageImpl();
  const c10::Storage* home = home_in_call(backend_storage);
  if (home == nullptr) {
    homes_.emplace_back(backend_storage, backend_.home_storage(tensor.storage()));
    home = &homes_.back().second;
  }
  return pooled_tensor_over(pool_, *home, target_, tensor);
}

at::Tensor DirectCall::kept_view_of(const at::Tensor& tensor, bool add) {
  // Kept views are plain tensors of the target: none made in inference mode or
  // under a Python dispatch mode, where the pool is off too.
  KeptTargetView* kept = pool_ != nullptr ? KeptTargetView::of(tensor, add) : nullptr;
  if (kept == nullptr) return view_of(tensor);
  std::optional<KeptTargetView::View> view = kept->get(tensor, target_);
  if (!view) {
    const c10::Storage& storage = tensor.storage();
    c10::Storage home = backend_.home_storage(storage);
    const bool shared = backend_.home_storage(storage).unsafeGetStorageImpl() ==
                        home.unsafeGetStorageImpl();
    view = KeptTargetView::View{tensor_over(home, target_, tensor), shared};
    kept->keep(tensor, *view);
  }
  // A tensor listed twice gets a view of its own the second time: each view a
  // call writes through stands for one tensor of the list (WrittenVersions).
  if (view->tensor.use_count() > 2) return view_of(tensor);  // the kept one and this
  if (view->shared_storage) return std::move(view->tensor);
  // Tensors that share a backend storage share one target storage within the call.
  c10::StorageImpl* backend_storage = tensor.storage().unsafeGetStorageImpl();
  const c10::Storage* home = home_in_call(backend_storage);
  if (home == nullptr) {
    homes_.emplace_back(backend_storage, view->tensor.storage());
  } else if (home->unsafeGetStorageImpl() != view->tensor.storage().unsafeGetStorageImpl()) {
    return pooled_tensor_over(pool_, *home, target_, tensor);
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

void DirectCall::kernel_done() const {
  if (target_.is_cuda() && cuda_sync() == CudaSync::Device) cuda::device_synchronize();
  written_versions_.pass_on();
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

}  // namespace detail
}  // namespace torch_fallback
