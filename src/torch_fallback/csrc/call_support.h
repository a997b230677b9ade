#pragma once
// What the fallback's two engines share: the boxed one (boxed_call.cpp:
// FallbackCall) and the unboxed one (direct_call.cpp: DirectCall). Tensor
// helpers, the per-thread pool of target TensorImpls, the views kept from one
// call to the next, and the rules for choosing a target.
#include <torch_fallback/detail/direct_kernel.h>

#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <thread>
#include <typeinfo>
#include <utility>

#include "op_rules.h"
#include "settings.h"
#include "tensors.h"

namespace torch_fallback {

inline uint64_t nbytes(const at::Tensor& tensor) {
  return static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
}

// Element by element: a tensor has a few dimensions, fewer than a call to memcmp
// (IntArrayRef's ==) is worth.
inline bool same_values(c10::IntArrayRef a, c10::IntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

inline bool same_geometry(const c10::TensorImpl& a, const c10::TensorImpl& b) {
  return a.storage_offset() == b.storage_offset() && same_values(a.sizes(), b.sizes()) &&
         same_values(a.strides(), b.strides());
}

inline bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  return same_geometry(*a.unsafeGetTensorImpl(), *b.unsafeGetTensorImpl());
}

// Bytes [first, end) of a storage that `tensor` may touch.
std::pair<int64_t, int64_t> byte_extent(const at::Tensor& tensor);

// TensorImpl's protected members that setting up a view reads and writes. A
// view takes its tensor's geometry with the contiguity already computed for
// it, where set_sizes_and_strides would compute it again (the larger part of a
// view's cost in a decode loop, whose shapes change from call to call).
struct TensorImplAccess : c10::TensorImpl {
  // Sizes and strides held as plain numbers: no subclass policy, no symbolic
  // shape, no ExtraMeta (names, backend meta) that a copy would carry over.
  static bool has_plain_geometry(const c10::TensorImpl& impl) {
    return impl.*(&TensorImplAccess::extra_meta_) == nullptr &&
           !(impl.*(&TensorImplAccess::matches_policy))(SizesStridesPolicy::CustomStrides);
  }
  // The sizes and strides, the offset, the element count and the layout flags
  // computed from them: what copy_generic_tensor_metadata copies of a plain
  // impl, without its dtype, device, policies and ExtraMeta (a third of a view's
  // cost where shapes change from call to call). A view is a tensor, never a
  // Python number, whatever it views (as set_sizes_and_strides leaves it).
  static void copy_geometry(const c10::TensorImpl& from, c10::TensorImpl* to) {
    to->*(&TensorImplAccess::sizes_and_strides_) = from.*(&TensorImplAccess::sizes_and_strides_);
    to->*(&TensorImplAccess::storage_offset_) = from.*(&TensorImplAccess::storage_offset_);
    to->*(&TensorImplAccess::numel_) = from.*(&TensorImplAccess::numel_);
    // Bit-fields have no member pointers: both impls are read as this type, which
    // adds no member to TensorImpl.
    // All read before any is written: the compiler then merges the six
    // read-modify-writes of one byte, which it cannot while `from` may be `to`.
    const auto& source = static_cast<const TensorImplAccess&>(from);
    auto& target = static_cast<TensorImplAccess&>(*to);
    const bool contiguous = source.is_contiguous_;
    const bool channels_last = source.is_channels_last_;
    const bool channels_last_contiguous = source.is_channels_last_contiguous_;
    const bool channels_last_3d = source.is_channels_last_3d_;
    const bool channels_last_3d_contiguous = source.is_channels_last_3d_contiguous_;
    const bool non_overlapping_and_dense = source.is_non_overlapping_and_dense_;
    target.is_contiguous_ = contiguous;
    target.is_channels_last_ = channels_last;
    target.is_channels_last_contiguous_ = channels_last_contiguous;
    target.is_channels_last_3d_ = channels_last_3d;
    target.is_channels_last_3d_contiguous_ = channels_last_3d_contiguous;
    target.is_non_overlapping_and_dense_ = non_overlapping_and_dense;
  }

  // Lazy conjugation and negation: bits of the key set, not data.
  static constexpr c10::DispatchKeySet kLazyBits{
      {c10::DispatchKey::Conjugate, c10::DispatchKey::Negative}};
  // Makes a plain CPU or CUDA impl (is_plain_and_unshared) a plain tensor over
  // `storage` (a backend's) whose keys are `plain_keys` (plain_backend_keys), lazy
  // bits kept: what set_storage_keep_dtype and _change_backend_component_keys do,
  // without working the keys out anew.
  static void become_plain_tensor_over(c10::TensorImpl* impl, c10::Storage&& storage,
                                       c10::DispatchKeySet plain_keys) {
    impl->*(&TensorImplAccess::device_opt_) = storage.device();
    impl->*(&TensorImplAccess::storage_) = std::move(storage);
    c10::DispatchKeySet& keys = impl->*(&TensorImplAccess::key_set_);
    keys = plain_keys | (keys & kLazyBits);
  }
  // The conjugate and negative bits of `from`: set as _set_conj and _set_neg set them.
  static void take_lazy_bits(const c10::TensorImpl& from, c10::TensorImpl* to) {
    c10::DispatchKeySet& keys = to->*(&TensorImplAccess::key_set_);
    keys = (keys - kLazyBits) | (from.key_set() & kLazyBits);
  }
  // The storage, without TensorImpl::storage()'s virtual call: no TensorImpl
  // overrides it, and it throws only where this flag says so (its error).
  static const c10::Storage& storage_of(const c10::TensorImpl& impl) {
    if (C10_UNLIKELY(static_cast<const TensorImplAccess&>(impl).storage_access_should_throw_)) {
      return impl.storage();
    }
    return impl.unsafe_storage();
  }
  // Lets go of `impl`'s storage without giving it another: for an impl that
  // waits unused until set_storage gives it one.
  static void drop_storage(c10::TensorImpl* impl) {
    impl->*(&TensorImplAccess::storage_) = c10::Storage();
  }
  // set_storage_and_dtype, for an impl whose metadata may change (is_plain_and_unshared
  // says so): without the check, which the compiler keeps out of line with its message.
  static void set_storage(c10::TensorImpl* impl, c10::Storage&& storage, c10::Device device,
                          caffe2::TypeMeta dtype) {
    impl->*(&TensorImplAccess::storage_) = std::move(storage);
    impl->*(&TensorImplAccess::device_opt_) = device;
    impl->*(&TensorImplAccess::data_type_) = dtype;
  }
};

inline const c10::Storage& storage_of(const at::Tensor& tensor) {
  return TensorImplAccess::storage_of(*tensor.unsafeGetTensorImpl());
}

// Gives `impl` the geometry of `like`; lazy conjugation and negation travel as
// bits, not data.
C10_ALWAYS_INLINE void take_geometry(c10::TensorImpl* impl, const at::Tensor& like) {
  const c10::TensorImpl& from = *like.unsafeGetTensorImpl();
  // Copied whether or not the impl has it already: a pooled impl rarely has
  // (one time in eight in a model's forward), and comparing costs a third of copying.
  if (C10_LIKELY(TensorImplAccess::has_plain_geometry(from) &&
                 TensorImplAccess::has_plain_geometry(*impl))) {
    TensorImplAccess::copy_geometry(from, impl);
  } else if (!same_geometry(*impl, from)) {
    impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  }
  TensorImplAccess::take_lazy_bits(from, impl);
}

// The thread that loads the library: the main thread, which imports it.
extern const std::thread::id g_loading_thread;

// A resizable storage over `home`'s bytes that keeps `backend` (whose memory
// they are) alive; a resize gives it new memory and leaves both untouched.
c10::Storage resizable_alias(const c10::Storage& backend, const c10::Storage& home);

c10::Storage home_storage_in_access(const BackendAdapter& backend, const c10::Storage& storage);

// backend.home_storage(storage), within an access to its bytes where the
// backend locks them (BackendAdapter::begin_access): every home view the
// library makes comes from here.
inline c10::Storage home_storage_of(const BackendAdapter& backend, const c10::Storage& storage) {
  if (backend.begin_access == nullptr) return backend.home_storage(storage);
  return home_storage_in_access(backend, storage);
}

// A backend tensor on device `index` holding a home tensor's values: adopted
// where the backend adopts memory, else copied into memory it allocates.
at::Tensor adopt_home_tensor(const BackendAdapter& backend, const at::Tensor& home_tensor,
                             c10::DeviceIndex index);

// The target an op runs on before its kernels are looked at: the CPU op list,
// then the target setting; 'auto' takes the GPU where the op has a kernel there.
inline Target wanted_target(const OpRules& rules, bool nested) {
  const Target wanted = rules.forced_to_cpu() ? Target::Cpu : target();
  if (wanted != Target::Auto) return wanted;
  const bool has_cuda_kernel = nested ? rules.has_nested_cuda_kernel : rules.has_cuda_kernel;
  return cuda::device_count() > 0 && has_cuda_kernel ? Target::Cuda : Target::Cpu;
}

std::string device_type_name(c10::DeviceType type);

void add_target_context(c10::Error& error, const OpRules& rules, c10::Device target);

// The backend device of a call: its tensors', else the current one.
c10::DeviceIndex backend_device_index(const BackendAdapter& backend,
                                      std::optional<c10::DeviceIndex> of_tensors);

[[noreturn]] void throw_unservable_result(const OpRules& rules, c10::DeviceType backend,
                                          const at::Tensor& result);

// Results a backend tensor cannot be: sparse, quantized and other non-strided ones.
inline void check_servable_result(const OpRules& rules, c10::DeviceType backend,
                                  const at::Tensor& result) {
  if (C10_UNLIKELY(result.layout() != c10::kStrided || result.is_quantized())) {
    throw_unservable_result(rules, backend, result);
  }
}

at::Tensor adopt_zero_tensor(const BackendAdapter& backend, const at::Tensor& result,
                             c10::Device home, c10::DeviceIndex index);

// The backend tensor holding a result on its home device (a zero tensor, which
// has no memory, gets some there).
inline at::Tensor adopt_result(const BackendAdapter& backend, const at::Tensor& result,
                               c10::Device home, c10::DeviceIndex index) {
  if (C10_UNLIKELY(result._is_zerotensor())) return adopt_zero_tensor(backend, result, home, index);
  if (backend.adopt != nullptr) return backend.adopt(result, index);
  return adopt_home_tensor(backend, result, index);
}

// Copies of the backend storages an op reads, made once per storage so that
// arguments which alias each other on the backend alias each other on the target.
struct StorageCopy {
  c10::Storage storage;  // on the target
  int64_t first_byte;    // the backend storage's byte that its byte 0 holds
};

inline c10::Storage empty_storage(c10::Device device) {
  return c10::Storage(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, device),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

// The dispatch keys of CPU and CUDA TensorImpls as tensor_over makes them, lazy
// bits aside, [cuda][inference]: with autograd's keys, or without them where
// made in inference mode.
using PlainKeySets = std::array<std::array<c10::DispatchKeySet, 2>, 2>;
PlainKeySets make_plain_key_sets();  // out of line: the hot paths keep only the read
inline const PlainKeySets& plain_key_sets() {
  static const PlainKeySets keys = make_plain_key_sets();
  return keys;
}

// The dispatch keys of a plain tensor of backend `type`, as the TensorImpl
// constructor gives them in or out of inference mode; made once per type and mode
// (make_plain_backend_keys), read from g_plain_backend_keys after (0: not made yet,
// a plain tensor has keys).
extern std::array<std::array<std::atomic<uint64_t>, 2>, c10::COMPILE_TIME_MAX_DEVICE_TYPES>
    g_plain_backend_keys;
uint64_t make_plain_backend_keys(c10::DeviceType type, bool inference);
inline c10::DispatchKeySet plain_backend_keys(c10::DeviceType type, bool inference) {
  uint64_t raw =
      g_plain_backend_keys[static_cast<size_t>(type)][inference].load(std::memory_order_relaxed);
  if (C10_UNLIKELY(raw == 0)) raw = make_plain_backend_keys(type, inference);
  return c10::DispatchKeySet(c10::DispatchKeySet::RAW, raw);
}

// Whether a Python dispatch mode may see the tensors of this call. Every
// TorchDispatchMode pushed includes the Python key in this thread's dispatch
// keys while any is set: a cheaper test than asking the mode stack, and never
// false where that would say true. `keys`: this thread's dispatch keys.
inline bool python_modes_may_be_set(
    const c10::impl::PODLocalDispatchKeySet& keys = c10::impl::raw_local_dispatch_key_set) {
  return keys.included().has(c10::DispatchKey::Python);
}

// Whether nothing but `tensor` holds its TensorImpl, not even a weak reference.
inline bool is_unshared(const at::Tensor& tensor) {
  return tensor.defined() && tensor.use_count() == 1 && tensor.weak_use_count() == 1;
}

// Whether no kernel gave `impl` state that a fresh one lacks.
inline bool has_only_fresh_state(c10::TensorImpl& impl) {
  return impl.autograd_meta() == nullptr && impl.get_backend_meta() == nullptr &&
         !impl.is_wrapped_number() && impl.allow_tensor_metadata_change();
}

// Whether `tensor` is a plain CPU or CUDA TensorImpl that nothing else holds and
// no kernel gave state a fresh one lacks: one the fallback may set up anew.
inline bool is_plain_and_unshared(const at::Tensor& tensor) {
  if (!is_unshared(tensor)) return false;
  c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  // The key set tells a plain CPU or CUDA TensorImpl, of either mode, from its
  // subclasses (nested, sparse, ...) and from other devices' tensors.
  const c10::DispatchKeySet keys = impl->key_set() - TensorImplAccess::kLazyBits;
  const PlainKeySets& known = plain_key_sets();
  const bool plain = keys == known[0][0] || keys == known[0][1] || keys == known[1][0] ||
                     keys == known[1][1];
  return plain && has_only_fresh_state(*impl);
}

namespace detail {

// The target tensors of a call are made by the hundred in a training step (a
// _foreach_ op's lists) and dropped when the call ends. Each thread keeps the
// TensorImpls its calls dropped and sets them up again for the next call,
// instead of allocating, constructing and destroying one per tensor. A thread
// has two pools: one for calls in inference mode, whose impls are inference
// tensors (no autograd keys, no version counter), and one for the others; each
// call gets the kind of tensor it would make.
class TargetImplPool {
  using Impl = c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

 public:
  explicit TargetImplPool(bool inference) : inference_(inference) {}

  // This thread's pool for this call's mode, or none where target tensors must
  // be made as usual: where Python dispatch modes may keep them.
  static TargetImplPool* for_this_call();

  // This thread's parked impls: CPU, CPU inference, CUDA, CUDA inference.
  static std::vector<int64_t> parked_counts();

  ~TargetImplPool() {
    // The main thread's pool goes after Python has finalized: an impl that a
    // Python kernel once wrapped must not touch its PyObject then.
    if (std::this_thread::get_id() != g_loading_thread) return;
    for (auto* parked : {&cpu_, &cuda_}) {
      for (auto& impl : *parked) impl.release();
    }
  }

  bool for_inference_mode() const { return inference_; }

  // A CPU or CUDA tensor over `storage` with the geometry of `like` (tensor_over's).
  C10_ALWAYS_INLINE at::Tensor take(c10::Storage storage, c10::Device device,
                                    const at::Tensor& like) {
    auto& parked = device.is_cuda() ? cuda_ : cpu_;
    if (C10_UNLIKELY(parked.empty())) return tensor_over(std::move(storage), device, like);
    Impl impl = std::move(parked.back());
    parked.pop_back();
    TensorImplAccess::set_storage(impl.get(), std::move(storage), device, like.dtype());
    take_geometry(impl.get(), like);
    return at::Tensor(std::move(impl));
  }

  // Keeps `tensor`'s TensorImpl for a later call when nothing else holds it,
  // no kernel gave it state a fresh one lacks and it is of this pool's kind.
  C10_ALWAYS_INLINE void park(at::Tensor&& tensor) {
    if (!is_unshared(tensor)) return;
    c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    // A plain CPU or CUDA impl of this pool's mode (is_plain_and_unshared's test):
    // one of two key sets, lazy bits aside.
    const c10::DispatchKeySet keys = impl->key_set() - TensorImplAccess::kLazyBits;
    const PlainKeySets& known = plain_key_sets();
    const bool cuda = keys == known[1][inference_];
    if ((!cuda && keys != known[0][inference_]) || !has_only_fresh_state(*impl)) return;
    auto& parked = cuda ? cuda_ : cpu_;
    if (parked.size() >= kCapacity) return;
    TensorImplAccess::drop_storage(impl);  // frees no memory late
    parked.push_back(tensor.unsafeReleaseIntrusivePtr());
  }

 private:
  static constexpr size_t kCapacity = 1024;

  struct ThisThread;
  static ThisThread& this_thread();
  C10_NOINLINE static ThisThread& make_this_thread();

  bool inference_;
  std::vector<Impl> cpu_;
  std::vector<Impl> cuda_;
};

// Inline: every call of both engines makes one and records it.
inline CallRecord::CallRecord(const OpRules& rules, bool unboxed)
    : rules_(rules), unboxed_(unboxed), start_ticks_(metrics::ticks()) {}

inline void CallRecord::record(bool failed) const {
  metrics::Call call;
  call.on_cuda = on_cuda_;
  call.unboxed = unboxed_;
  call.failed = failed;
  call.bytes_to_target = bytes_to_target_;
  call.bytes_from_target = bytes_from_target_;
  const uint64_t end_ticks = metrics::ticks();
  // A thread moved to a core whose counter lags would read a negative duration.
  call.ticks = end_ticks > start_ticks_ ? end_ticks - start_ticks_ : 0;
  metrics::record(*rules_.counters, call);
}

// This thread's pools, and where c10 keeps this thread's autograd state and
// dispatch keys (thread-locals of libc10, whose addresses stay for the thread's
// life): a call makes one TLS lookup, where asking c10 made two more, one of them
// through InferenceMode::is_enabled, which is out of line.
struct TargetImplPool::ThisThread {
  std::array<TargetImplPool, 2> pools{TargetImplPool(false), TargetImplPool(true)};
  const c10::AutogradState* autograd = &c10::AutogradState::get_tls_state();
  const c10::impl::PODLocalDispatchKeySet* dispatch_keys = &c10::impl::raw_local_dispatch_key_set;
};

inline TargetImplPool::ThisThread& TargetImplPool::this_thread() {
  // A plain pointer, read with one TLS lookup: the object itself would need a
  // second, for the guard of its construction.
  thread_local ThisThread* thread = nullptr;
  if (C10_UNLIKELY(thread == nullptr)) thread = &make_this_thread();
  return *thread;
}

inline TargetImplPool* TargetImplPool::for_this_call() {
  ThisThread& thread = this_thread();
  if (python_modes_may_be_set(*thread.dispatch_keys)) return nullptr;
  return &thread.pools[thread.autograd->get_inference_mode()];  // InferenceMode::is_enabled()
}

inline std::vector<int64_t> TargetImplPool::parked_counts() {
  const auto& pools = this_thread().pools;
  return {static_cast<int64_t>(pools[0].cpu_.size()), static_cast<int64_t>(pools[1].cpu_.size()),
          static_cast<int64_t>(pools[0].cuda_.size()), static_cast<int64_t>(pools[1].cuda_.size())};
}

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
    const c10::Storage& storage = storage_of(tensor);
    if (!view_.tensor.defined() || backend_storage_ != storage.unsafeGetStorageImpl() ||
        view_.tensor.device() != target || view_.tensor.dtype() != tensor.dtype()) {
      return std::nullopt;
    }
    const c10::Storage& viewed = storage_of(view_.tensor);
    if (viewed.data() != storage.data() || viewed.nbytes() != storage.nbytes() ||
        !same_geometry(view_.tensor, tensor) || view_.tensor.is_conj() != tensor.is_conj() ||
        view_.tensor.is_neg() != tensor.is_neg()) {
      return std::nullopt;
    }
    return view_;
  }

  void keep(const at::Tensor& tensor, View view) {
    std::lock_guard<std::mutex> lock(mutex_);
    backend_storage_ = storage_of(tensor).unsafeGetStorageImpl();
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

using detail::KeptTargetView;
using detail::TargetImplPool;

// One more reference to a storage a call holds already (by its raw pointer).
inline c10::Storage storage_ref(c10::StorageImpl* storage) {
  return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage));
}

// tensor_over's tensor, set up from `pool`'s TensorImpls where there is a pool.
C10_ALWAYS_INLINE at::Tensor pooled_tensor_over(TargetImplPool* pool, c10::Storage storage,
                                                c10::Device device, const at::Tensor& like) {
  return pool != nullptr ? pool->take(std::move(storage), device, like)
                         : tensor_over(std::move(storage), device, like);
}

}  // namespace torch_fallback
