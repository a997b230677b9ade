// The boxed fallback: generalized from at::native::cpu_fallback to a target
// device (CPU or CUDA), zero-copy wherever a backend tensor's memory already
// lives on the target. One class, FallbackCall, walks a call as steps (run());
// it is kept whole so that the walk reads top to bottom, hence the length.
#include "call_support.h"

#include <ATen/ops/_copy_from_and_resize.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <sstream>

#include "decompositions.h"
#include "metrics.h"
#include "small_map.h"

namespace torch_fallback {
namespace {

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
    try {
      refuse_unservable();
      find_backend_device();
      choose_target();
      record_.enter(target_);
      find_resizable_storages();
      move_arguments_to_target();
      call_op();
      written_versions_.pass_on();
      write_back_mutated_arguments();
      move_returns_to_backend();
      wait_for_queued_copies();
    } catch (...) {
      try {
        wait_for_queued_copies();
      } catch (...) {
        // The op's own error is the one to report.
      }
      record_.record(/*failed=*/true);
      throw;
    }
    record_.record(/*failed=*/false);
  }

 private:
  const std::string& full_name() const { return rules_.full_name; }

  // For error messages only (TORCH_CHECK evaluates its message on failure).
  std::string backend_name() const { return device_type_name(backend_.device_type); }

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
                                  " tensors cannot be. Quantize CPU or CUDA tensors instead, "
                                  "and dequantize one before moving it here (x.dequantize()).");
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

  // How a tensor came: as a Tensor argument (one the op writes: in place or
  // out=), in the first Tensor[] (a _foreach_ op's results follow it), in a later
  // Tensor[], in a Tensor?[], or as an argument that CUDA's kernel reads on the host.
  enum class Passed { Alone, Written, InFirstList, InLaterList, InOptionalList, ReadOnHost };

  // Eager's words for tensors on two devices, which code that catches the error matches.
  std::string two_devices(c10::Device other) const {
    std::ostringstream message;
    message << "Expected all tensors to be on the same device, but found at least two devices, "
            << backend_name() << ":" << static_cast<int>(backend_index()) << " and " << other
            << "!";
    return message.str();
  }

  void check_tensor_device(const at::Tensor& tensor, Passed passed) {
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
      TORCH_CHECK(*backend_index_ == device.index(), "torch_fallback: ", full_name(), ": ",
                  two_devices(device), " It got tensors on ", backend_name(), ":",
                  static_cast<int>(*backend_index_), " and on ", device,
                  "; move them to one device first.");
      return;
    }
    const bool in_list = passed == Passed::InFirstList || passed == Passed::InLaterList;
    if (rules_.is_foreach && in_list && !rules_.copies_between_devices) {
      // A _foreach_ op gives one result per tensor of its first list: a CPU tensor
      // there would get a backend result (CUDA gives each result on its input's
      // device, and refuses to write across devices). Its other lists may hold
      // 0-dim CPU tensors, as scalars.
      TORCH_CHECK(device.is_cpu() && tensor.dim() == 0 && passed == Passed::InLaterList,
                  "torch_fallback: ", full_name(), ": ", two_devices(device),
                  " It got a tensor on ", device,
                  " in a list together with ", backend_name(), " tensors; the tensors of its ",
                  "lists must be on ", backend_name(),
                  " (0-dim CPU tensors excepted after the first list). Move them there first "
                  "(an optimizer's state stays on the device it was made on: move the model "
                  "before the optimizer's first step, or load the optimizer's state_dict after "
                  "the move).");
      return;
    }
    // A 0-dim CPU tensor is a scalar the op reads, never one it writes: CUDA
    // refuses to write a result to the CPU.
    TORCH_CHECK(passed != Passed::Written, "torch_fallback: ", full_name(), ": ",
                two_devices(device), " It would write its result into a tensor on ", device,
                " from ", backend_name(),
                " tensors; the tensors an op writes (in place or out=) must be on ",
                backend_name(), ". Write into a ", backend_name(),
                " tensor, then copy it to the CPU.");
    // TensorIterator takes 0-dim CPU tensors as scalars on any device, unless the
    // op's CUDA kernel checks that all its tensors share one device; as on CUDA,
    // indexing takes its indices, _foreach_ ops their scalars and _foreach_copy_
    // its lists on the CPU.
    const bool cpu_allowed =
        (tensor.dim() == 0 && !rules_.takes_no_cpu_scalars) || passed == Passed::ReadOnHost ||
        (passed == Passed::InOptionalList && rules_.takes_cpu_indices) ||
        (rules_.is_foreach && (passed == Passed::Alone || rules_.copies_between_devices));
    TORCH_CHECK(device.is_cpu() && cpu_allowed, "torch_fallback: ", full_name(), ": ",
                two_devices(device), " It got a tensor on ", device, " together with ",
                backend_name(), " tensors; all its tensors must be on ", backend_name(),
                rules_.takes_cpu_indices      ? " (indices may be on the CPU)"
                : rules_.takes_no_cpu_scalars ? " (0-dim CPU tensors too: CUDA's kernel takes none)"
                                              : " (0-dim CPU tensors excepted)",
                ". Move it there first, e.g. with .to('", backend_name(), "').");
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

  // The arguments as the caller passed them.
  c10::ArrayRef<c10::IValue> arguments_as_passed() const {
    return originals_.empty() ? torch::jit::last(*stack_, schema_.arguments().size())
                              : c10::ArrayRef<c10::IValue>(originals_);
  }

  template <typename Visit>
  void for_each_tensor_argument(Visit&& visit) {
    for (const auto& arg : arguments_as_passed()) for_each_tensor_in(arg, visit);
  }

  // A generator draws for tensors of its own device, as eager checks
  // (at::check_generator): a CPU generator for backend tensors would draw on
  // the CPU, and a backend generator sends an op on CPU tensors here.
  void check_generator_devices() {
    const auto args = arguments_as_passed();
    for (size_t i : rules_.generator_arguments) {
      if (!args[i].isGenerator()) continue;
      const c10::DeviceType generator_type = args[i].toGenerator().device().type();
      // The op's device: the backend's if it has a tensor (or device argument)
      // there, else that of its other tensors.
      std::optional<c10::DeviceType> backend_type;
      std::optional<c10::DeviceType> other_type;
      for_each_tensor_argument([&](const at::Tensor& tensor) {
        if (!tensor.defined()) return;
        (tensor.device().type() == backend_.device_type ? backend_type : other_type) =
            tensor.device().type();
      });
      for (const auto& arg : args) {
        if (arg.isDevice() && arg.toDevice().type() == backend_.device_type) {
          backend_type = backend_.device_type;
        }
      }
      const c10::DeviceType expected = backend_type.value_or(other_type.value_or(c10::kCPU));
      TORCH_CHECK(generator_type == expected, "Expected a '", c10::DeviceTypeName(expected, true),
                  "' device type for generator but found '",
                  c10::DeviceTypeName(generator_type, true), "' (", full_name(), ")");
    }
  }

  void find_backend_device() {
    if (!rules_.generator_arguments.empty()) check_generator_devices();
    bool first_list = true;
    size_t index = 0;
    const auto listed = [](const std::vector<size_t>& indices, size_t i) {
      return std::find(indices.begin(), indices.end(), i) != indices.end();
    };
    for (const auto& arg : arguments_as_passed()) {
      Passed passed = Passed::Alone;
      if (listed(rules_.host_read_arguments, index)) {
        passed = Passed::ReadOnHost;
      } else if (arg.isTensor() && listed(rules_.written_arguments, index)) {
        passed = Passed::Written;
      } else if (arg.isTensorList()) {
        passed = first_list ? Passed::InFirstList : Passed::InLaterList;
        first_list = false;
      } else if (arg.isOptionalTensorList()) {
        passed = Passed::InOptionalList;
      }
      ++index;
      for_each_tensor_in(arg, [this, passed](const at::Tensor& tensor) {
        check_tensor_device(tensor, passed);
        nested_ = nested_ || (tensor.defined() && tensor.is_nested());
      });
    }
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
      record_.count_on_cuda();
      // Computed: a composite kernel (convolution's, say) serves CUDA too.
      const bool has_cuda_kernel = nested_ ? rules_.has_nested_cuda_kernel : rules_.has_cuda_kernel;
      cuda::check_usable("the CUDA fallback target", full_name());
      // Read by the message only, which TORCH_CHECK builds on failure.
      const auto on_cpu = [this] {
        return (nested_ ? rules_.has_nested_cpu_kernel : rules_.has_cpu_kernel) ||
               (!nested_ && rules_.cpu_decomposition != nullptr);
      };
      TORCH_CHECK_NOT_IMPLEMENTED(
          has_cuda_kernel, "torch_fallback: ", full_name(), " has no CUDA kernel",
          nested_ ? " for nested tensors" : "",
          " in this PyTorch, so the CUDA fallback target cannot serve it. ",
          on_cpu() ? "Use the 'auto' target, which runs such ops on the CPU, or put the op on the "
                   "CPU op list (TORCH_FALLBACK_CPU_OPS or torch_fallback.set_cpu_ops)."
                 : "PyTorch has no CPU kernel for it either: eager refuses it on CPU and CUDA "
                   "tensors too.");
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
    if (nested_ ? rules_.has_nested_cpu_kernel : rules_.has_cpu_kernel) {
      decomposition_ = nested_ ? nullptr : rules_.cpu_runner;
      return;
    }
    decomposition_ = rules_.cpu_decomposition;
    const auto nor_cuda = [this] {
      return cuda::built() && !(nested_ ? rules_.has_nested_cuda_kernel : rules_.has_cuda_kernel);
    };
    TORCH_CHECK_NOT_IMPLEMENTED(
        decomposition_ != nullptr, "torch_fallback: ", full_name(), " has no CPU kernel",
        nested_ ? " for nested tensors" : "",
        " in this PyTorch and torch_fallback has no decomposition for it, so the CPU fallback "
        "target cannot serve it.",
        nor_cuda()                 ? " PyTorch has no CUDA kernel for it either: eager refuses it "
                                     "on CPU and CUDA tensors too."
        : cuda::device_count() > 0 ? " Use the CUDA target (TORCH_FALLBACK_TARGET=cuda or auto)."
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
    c10::Storage home = home_storage_of(backend_, storage);
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
    record_.add_bytes_to_target(static_cast<uint64_t>(end - first));
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
    record_.add_bytes_to_target(nbytes(tensor));
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
        // The buffer is a tensor made for this lookup: held for the call, so that
        // another nested argument's buffer cannot reuse its address, the key of targets_.
        nested_buffers_.push_back(buffer);
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
    record_.add_bytes_from_target(nbytes(tensor));
    return adopt_home_tensor(backend_, copied_to_home(tensor, home), index);
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
      counted_above_ = layers_above_run_again() ? 1 : 0;
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
    written_versions_.watch(original, on_target, counted_above_);
  }

  // Whether the op's ADInplaceOrView kernel, which counted its write on the
  // backend's tensor, will run again for the target's. An aten op's autograd
  // kernel runs the backend's kernel below that layer; a custom op's layers
  // (torch.library) redispatch past it instead, so the call the fallback makes
  // from the top passes it again.
  bool layers_above_run_again() const {
    return !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView) &&
           op_.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView);
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
    if (written.device() != home_device) record_.add_bytes_from_target(nbytes(written));
    if (written.sizes() != original.sizes() && !written.is_contiguous() &&
        written.is_non_overlapping_and_dense()) {
      // The kernel resized its out= argument to a layout of its own (nonzero's
      // transposed one): the backend's takes that layout too, as in eager.
      original.resize_(written.sizes());
      original.unsafeGetTensorImpl()->set_sizes_and_strides(written.sizes(), written.strides(),
                                                            original.storage_offset());
      original.copy_(written);
    } else if (written.sizes() != original.sizes() && !written.is_contiguous() &&
               written.dtype() == original.dtype() &&
               written.storage().nbytes() % written.dtype().itemsize() == 0) {
      // A view into a buffer of the kernel's (linalg_lstsq's solution, a slice of a
      // column-major one): the backend's tensor views a copy of the whole buffer,
      // with the same geometry, as eager's views the buffer itself.
      const int64_t elements = static_cast<int64_t>(written.storage().nbytes() /
                                                    written.dtype().itemsize());
      at::Tensor copy = at::empty({elements}, original.options());
      copy.copy_(written.as_strided({elements}, {1}, 0));
      original.set_(copy.storage(), written.storage_offset(), written.sizes(), written.strides());
    } else {
      at::_copy_from_and_resize(written, original);
    }
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
  std::vector<at::Tensor> nested_buffers_;  // the nested arguments' buffers, keys of targets_
  c10::SmallVector<c10::IValue, 8> originals_;
  c10::SmallVector<c10::IValue, 8> on_target_;
  detail::WrittenVersions written_versions_;
  uint32_t counted_above_ = 0;  // layers_above_run_again(), for each written tensor
  SmallMap<c10::TensorImpl*, bool> watched_;
  detail::CallRecord record_{rules_, /*unboxed=*/false};
};

}  // namespace

void boxed_fallback(const BackendAdapter& backend, const c10::OperatorHandle& op,
                    torch::jit::Stack* stack) {
  FallbackCall(backend, op, stack).run();
}

}  // namespace torch_fallback
