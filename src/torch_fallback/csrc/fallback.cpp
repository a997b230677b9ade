#include "fallback.h"

#include <chrono>
#include <optional>
#include <unordered_map>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_copy_from_and_resize.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "cuda_access.h"
#include "metrics.h"
#include "settings.h"

namespace torch_fallback {
namespace {

using Clock = std::chrono::steady_clock;

// A CPU or CUDA tensor over `storage` with the geometry of `like`.
at::Tensor tensor_over(const c10::Storage& storage, c10::Device device, const at::Tensor& like) {
  const auto key = device.is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage),
                                                         c10::DispatchKeySet(key), like.dtype());
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                       like.storage_offset());
  // Lazy conjugation and negation travel as bits, not data.
  tensor._set_conj(like.is_conj());
  tensor._set_neg(like.is_neg());
  return tensor;
}

uint64_t nbytes(const at::Tensor& tensor) {
  return static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
}

bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.storage_offset() == b.storage_offset();
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
        name_(schema_.operator_name().name),
        overload_(schema_.operator_name().overload_name),
        full_name_(overload_.empty() ? name_ : name_ + "." + overload_) {}

  void run() {
    const auto start = Clock::now();
    try {
      refuse_view_returns();
      find_backend_device();
      choose_target();
      std::optional<cuda::DeviceScope> cuda_scope;
      if (target_.is_cuda()) cuda_scope.emplace(target_.index());
      move_arguments_to_target();
      call_op();
      write_back_mutated_arguments();
      move_returns_to_backend();
    } catch (...) {
      call_.failed = true;
      finish(start);
      throw;
    }
    finish(start);
  }

 private:
  // For error messages only (TORCH_CHECK evaluates its message on failure).
  std::string backend_name() const {
    return c10::DeviceTypeName(backend_.device_type, /*lower_case=*/true);
  }

  void finish(Clock::time_point start) {
    call_.on_cuda = target_.is_cuda();
    call_.time_ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    metrics::record(full_name_, call_);
  }

  void refuse_view_returns() const {
    for (const auto& ret : schema_.returns()) {
      const auto* alias = ret.alias_info();
      TORCH_CHECK_NOT_IMPLEMENTED(
          alias == nullptr || alias->isWrite(), "torch_fallback: ", full_name_,
          " returns a view of its input, which a boxed fallback cannot give ", backend_name(),
          ": its result would be a copy that no longer shares memory with the input. Register a "
          "native ",
          backend_name(), " kernel for ", full_name_, " (as relay has for view and as_strided).");
    }
  }

  void check_tensor_device(const at::Tensor& tensor) {
    if (!tensor.defined()) return;
    const c10::Device device = tensor.device();
    if (device.type() == backend_.device_type) {
      if (!backend_index_) {
        backend_index_ = device.index();
        return;
      }
      TORCH_CHECK(*backend_index_ == device.index(), "torch_fallback: ", full_name_,
                  " got tensors on ", backend_name(), ":", static_cast<int>(*backend_index_),
                  " and on ", device, "; move them to one device first.");
      return;
    }
    // TensorIterator takes 0-dim CPU tensors as scalars on any device.
    TORCH_CHECK(device.is_cpu() && tensor.dim() == 0, "torch_fallback: ", full_name_,
                " got a tensor on ", device, " together with ", backend_name(),
                " tensors; all its tensors must be on ", backend_name(),
                " (0-dim CPU tensors excepted). Move it there first, e.g. with .to('",
                backend_name(), "').");
  }

  void find_backend_device() {
    for (const auto& arg : torch::jit::last(*stack_, schema_.arguments().size())) {
      if (arg.isTensor()) {
        check_tensor_device(arg.toTensor());
      } else if (arg.isTensorList()) {
        for (const at::Tensor& tensor : arg.toTensorList()) check_tensor_device(tensor);
      } else if (arg.isOptionalTensorList()) {
        for (const std::optional<at::Tensor>& tensor : arg.toOptionalTensorList()) {
          if (tensor) check_tensor_device(*tensor);
        }
      } else if (arg.isDevice() && arg.toDevice().type() == backend_.device_type &&
                 !backend_index_ && arg.toDevice().has_index()) {
        backend_index_ = arg.toDevice().index();
      }
    }
  }

  c10::DeviceIndex backend_index() const {
    if (backend_index_ && *backend_index_ >= 0) return *backend_index_;
    return c10::impl::getDeviceGuardImpl(backend_.device_type)->getDevice().index();
  }

  void choose_target() {
    Target wanted = forced_to_cpu(name_, full_name_) ? Target::Cpu : target();
    if (wanted == Target::Cpu) {
      target_ = c10::Device(c10::kCPU);
      return;
    }
    // Computed: a composite kernel (convolution's, say) serves CUDA too.
    const bool has_cuda_kernel = op_.hasComputedKernelForDispatchKey(c10::DispatchKey::CUDA);
    if (wanted == Target::Auto) {
      wanted = cuda::device_count() > 0 && has_cuda_kernel ? Target::Cuda : Target::Cpu;
    }
    if (wanted == Target::Cpu) {
      target_ = c10::Device(c10::kCPU);
      return;
    }
    cuda::check_usable("the CUDA fallback target", full_name_);
    TORCH_CHECK_NOT_IMPLEMENTED(
        has_cuda_kernel, "torch_fallback: ", full_name_,
        " has no CUDA kernel in this PyTorch, so the CUDA fallback target cannot serve it. Use "
        "the 'auto' target, which runs such ops on the CPU, or put the op on the CPU op list "
        "(TORCH_FALLBACK_CPU_OPS or torch_fallback.set_cpu_ops).");
    const c10::DeviceIndex index = backend_index();
    TORCH_CHECK(index < cuda::device_count(), "torch_fallback: ", backend_name(), ":",
                static_cast<int>(index), " runs its CUDA fallback on cuda:", static_cast<int>(index),
                ", but only ", static_cast<int>(cuda::device_count()), " GPU(s) are visible.");
    target_ = c10::Device(c10::kCUDA, index);
  }

  // One home storage per backend storage, so that tensors which alias each
  // other on the backend alias each other on the target too.
  const c10::Storage& home_storage(const c10::Storage& storage) {
    auto [it, inserted] = home_storages_.try_emplace(storage.unsafeGetStorageImpl());
    if (inserted) it->second = backend_.home_storage(storage);
    return it->second;
  }

  at::Tensor to_target(const at::Tensor& tensor) {
    if (!tensor.defined() || tensor.device().type() != backend_.device_type) return tensor;
    const c10::Device home = backend_.home_device(tensor.storage());
    at::Tensor on_home = tensor_over(home_storage(tensor.storage()), home, tensor);
    if (home == target_) return on_home;
    call_.bytes_to_target += nbytes(tensor);
    return on_home.to(at::TensorOptions().device(target_), /*non_blocking=*/false,
                      /*copy=*/true);
  }

  at::Tensor to_backend(const at::Tensor& tensor) {
    if (!tensor.defined()) return tensor;
    const c10::DeviceIndex index = backend_index();
    const c10::Device home = backend_.output_home(index);
    if (tensor.device() == home) return backend_.adopt(tensor, index);
    call_.bytes_from_target += nbytes(tensor);
    return backend_.adopt(
        tensor.to(at::TensorOptions().device(home), /*non_blocking=*/false, /*copy=*/true),
        index);
  }

  void move_arguments_to_target() {
    const size_t num_args = schema_.arguments().size();
    const size_t first = stack_->size() - num_args;
    originals_.assign(stack_->begin() + first, stack_->end());
    for (size_t i = 0; i < num_args; ++i) {
      c10::IValue& arg = (*stack_)[first + i];
      if (arg.isTensor()) {
        arg = to_target(arg.toTensor());
      } else if (arg.isTensorList()) {
        c10::List<at::Tensor> moved;
        for (const at::Tensor& tensor : arg.toTensorList()) moved.push_back(to_target(tensor));
        arg = std::move(moved);
      } else if (arg.isOptionalTensorList()) {
        c10::List<std::optional<at::Tensor>> moved;
        for (const std::optional<at::Tensor>& tensor : arg.toOptionalTensorList()) {
          moved.push_back(tensor ? std::optional<at::Tensor>(to_target(*tensor)) : tensor);
        }
        arg = std::move(moved);
      } else if (arg.isDevice() && arg.toDevice().type() == backend_.device_type) {
        arg = target_;
      }
    }
    on_target_.assign(stack_->begin() + first, stack_->end());
  }

  void call_op() {
    try {
      op_.callBoxed(stack_);
    } catch (c10::Error& error) {
      error.add_context("torch_fallback: raised by " + full_name_ + " on the " +
                        c10::DeviceTypeName(target_.type(), /*lower_case=*/true) +
                        " fallback target");
      throw;
    }
    if (target_.is_cuda() && cuda_sync() == CudaSync::Device) cuda::device_synchronize();
  }

  // Makes `original` (a backend tensor) hold what the op wrote into `written`.
  void write_back(const at::Tensor& written, const at::Tensor& original) {
    if (!original.defined() || original.device().type() != backend_.device_type) return;
    const auto it = home_storages_.find(original.storage().unsafeGetStorageImpl());
    const bool shares_memory = it != home_storages_.end() && written.defined() &&
                               written.storage().is_alias_of(it->second) &&
                               written.storage().data() == original.storage().data();
    if (shares_memory) {
      // Written in place; an out= argument may still have been resized within its capacity.
      if (!same_geometry(written, original)) {
        original.unsafeGetTensorImpl()->set_sizes_and_strides(written.sizes(), written.strides(),
                                                              written.storage_offset());
      }
      return;
    }
    if (written.device() != backend_.home_device(original.storage())) {
      call_.bytes_from_target += nbytes(written);
    }
    at::_copy_from_and_resize(written, original);
  }

  void write_back_mutated_arguments() {
    const auto& args = schema_.arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      const auto* alias = args[i].alias_info();
      if (alias == nullptr || !alias->isWrite()) continue;
      const c10::IValue& original = originals_[i];
      const c10::IValue& written = on_target_[i];
      if (original.isTensor()) {
        write_back(written.toTensor(), original.toTensor());
      } else if (original.isTensorList()) {
        const auto originals = original.toTensorList();
        const auto writtens = written.toTensorList();
        for (size_t j = 0; j < originals.size(); ++j) write_back(writtens[j], originals[j]);
      }
    }
  }

  const c10::IValue& mutated_argument_for(const c10::AliasInfo& ret_alias) const {
    const auto& args = schema_.arguments();
    for (size_t i = 0; i < args.size(); ++i) {
      const auto* alias = args[i].alias_info();
      if (alias != nullptr && alias->isWrite() && alias->beforeSets() == ret_alias.beforeSets()) {
        return originals_[i];
      }
    }
    TORCH_INTERNAL_ASSERT(false, "torch_fallback: ", full_name_,
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
        c10::List<at::Tensor> moved;
        for (const at::Tensor& tensor : value.toTensorList()) moved.push_back(to_backend(tensor));
        value = std::move(moved);
      }
    }
  }

  const BackendAdapter& backend_;
  const c10::FunctionSchema& schema_;
  const c10::OperatorHandle& op_;
  torch::jit::Stack* stack_;
  // The schema outlives the call; its names are not copied.
  const std::string& name_;
  const std::string& overload_;
  const std::string full_name_;

  std::optional<c10::DeviceIndex> backend_index_;
  c10::Device target_{c10::kCPU};
  std::unordered_map<c10::StorageImpl*, c10::Storage> home_storages_;
  std::vector<c10::IValue> originals_;
  std::vector<c10::IValue> on_target_;
  metrics::Call call_;
};

}  // namespace

void boxed_fallback(const BackendAdapter& backend, const c10::OperatorHandle& op,
                    torch::jit::Stack* stack) {
  FallbackCall(backend, op, stack).run();
}

at::Tensor home_view(const BackendAdapter& backend, const at::Tensor& tensor) {
  return tensor_over(backend.home_storage(tensor.storage()), backend.home_device(tensor.storage()),
                     tensor);
}

}  // namespace torch_fallback
