// A c10d backend for any backend of the library: each collective runs on
// PyTorch's own engine for the memory the tensors live in (their home), on
// zero-copy home views: ProcessGroupGloo for host memory, ProcessGroupNCCL for
// CUDA memory. c10d sends a device's collectives to the Backend registered for
// its device type (ProcessGroup::getBackend), which no boxed fallback sees.
//
// The engines are made in Python (torch_fallback.distributed) and handed in as
// c10d::Backend pointers, so this library links no NCCL and no CUDA.
#include "distributed.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <torch_fallback/fallback.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch_fallback::distributed {

// The process group's backend for one device type (the adapter's).
class HomeBackend : public c10d::Backend {
 public:
  using WorkPtr = c10::intrusive_ptr<c10d::Work>;
  using Tensors = std::vector<at::Tensor>;
  using TensorLists = std::vector<std::vector<at::Tensor>>;

  HomeBackend(c10::DeviceType device_type, int rank, int size, std::string name,
              c10::intrusive_ptr<c10d::Backend> host_engine,
              c10::intrusive_ptr<c10d::Backend> cuda_engine);

  const BackendAdapter& adapter() const { return *adapter_; }
  const c10::intrusive_ptr<c10d::Backend>& host_engine() const { return host_engine_; }
  const c10::intrusive_ptr<c10d::Backend>& cuda_engine() const { return cuda_engine_; }

  const std::string getBackendName() const override;
  WorkPtr broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override;
  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override;
  WorkPtr allreduce_coalesced(Tensors& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override;
  WorkPtr reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override;
  WorkPtr allgather(TensorLists& outputs, Tensors& inputs,
                    const c10d::AllgatherOptions& opts) override;
  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions& opts) override;
  WorkPtr allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                              const c10d::AllgatherOptions& opts) override;
  WorkPtr allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::AllgatherOptions& opts) override;
  WorkPtr gather(TensorLists& outputs, Tensors& inputs, const c10d::GatherOptions& opts) override;
  WorkPtr scatter(Tensors& outputs, TensorLists& inputs,
                  const c10d::ScatterOptions& opts) override;
  WorkPtr reduce_scatter(Tensors& outputs, TensorLists& inputs,
                         const c10d::ReduceScatterOptions& opts) override;
  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::ReduceScatterOptions& opts) override;
  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input,
                        std::vector<int64_t>& output_split_sizes,
                        std::vector<int64_t>& input_split_sizes,
                        const c10d::AllToAllOptions& opts) override;
  WorkPtr alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) override;
  WorkPtr send(Tensors& tensors, int dst_rank, int tag) override;
  WorkPtr recv(Tensors& tensors, int src_rank, int tag) override;
  WorkPtr recvAnysource(Tensors& tensors, int tag) override;
  WorkPtr barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void setGroupUid(const std::string& pg_uid) override;
  void abort() override;
  void shutdown() override;

 private:
  std::string name_;
  const BackendAdapter* adapter_ = nullptr;
  c10::intrusive_ptr<c10d::Backend> host_engine_;
  c10::intrusive_ptr<c10d::Backend> cuda_engine_;
};

namespace {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

// Whether the device's guard records events. A future on devices records one
// per device as it completes, on the thread that completes it (the engine's,
// where nothing would catch a guard's refusal): a backend whose guard has no
// events gets a future on no device, completed on the host, as a CPU tensor's is.
bool records_events(c10::Device device) {
  enum : int8_t { kUnknown, kYes, kNo };
  static std::array<std::atomic<int8_t>, c10::COMPILE_TIME_MAX_DEVICE_TYPES> known{};
  std::atomic<int8_t>& slot = known[static_cast<size_t>(device.type())];
  int8_t state = slot.load(std::memory_order_relaxed);
  if (C10_UNLIKELY(state == kUnknown)) {
    state = kYes;
    try {
      c10::Event event(device.type());
      event.record(c10::impl::getDeviceGuardImpl(device.type())->getStream(device));
    } catch (const c10::Error&) {
      state = kNo;
    }
    slot.store(state, std::memory_order_relaxed);
  }
  return state == kYes;
}

// A collective's Work: the engine's, with the device's tensors as its result and
// as its future's value (DDP's reducer copies that value into the gradients).
class HomeWork : public Work {
 public:
  HomeWork(WorkPtr engine_work, Tensors outputs, Tensors home_views)
      : Work(-1, engine_work->retrieveOpType()),
        engine_work_(std::move(engine_work)),
        outputs_(std::move(outputs)),
        home_views_(std::move(home_views)) {}

  bool isCompleted() override { return engine_work_->isCompleted(); }
  bool isSuccess() const override { return engine_work_->isSuccess(); }
  std::exception_ptr exception() const override { return engine_work_->exception(); }
  int sourceRank() const override { return engine_work_->sourceRank(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override { engine_work_->synchronize(); }
  void blockCurrentStream() override { engine_work_->blockCurrentStream(); }
  bool wait(std::chrono::milliseconds timeout) override { return engine_work_->wait(timeout); }
  void abort() override { engine_work_->abort(); }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (future_) return future_;
    // A future on the device's own devices, so that its value (and what a comm
    // hook's then() makes of it) holds the device's tensors. It completes inside
    // the engine future's callback, where a CUDA engine has made the current
    // streams wait for the collective: the device's events, recorded there,
    // order the consumers after it.
    std::vector<c10::Device> devices;
    std::vector<c10::ivalue::Future::WeakStorage> storages;
    for (const auto& output : outputs_) {
      if (!output.defined() || output.device().is_cpu()) continue;
      if (std::find(devices.begin(), devices.end(), output.device()) == devices.end()) {
        devices.push_back(output.device());
      }
      storages.emplace_back(output.storage().getWeakStorageImpl());
    }
    if (!devices.empty() && !records_events(devices.front())) {
      devices.clear();
      storages.clear();
    }
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), std::move(devices));
    engine_work_->getFuture()->addCallback(
        [future = future_, outputs = outputs_,
         storages = std::move(storages)](c10::ivalue::Future& done) mutable {
          if (done.hasError()) {
            future->setError(done.exception_ptr());
            return;
          }
          future->markCompleted(c10::IValue(outputs), std::move(storages));
        });
    return future_;
  }

 private:
  WorkPtr engine_work_;
  Tensors outputs_;
  Tensors home_views_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The home views of one collective's tensors, and the engine their home needs.
class Call {
 public:
  Call(const HomeBackend& backend, const char* collective)
      : backend_(backend), collective_(collective) {}

  at::Tensor view(const at::Tensor& tensor) {
    if (!tensor.defined()) return tensor;
    const bool ours = tensor.device().type() == backend_.adapter().device_type;
    TORCH_CHECK_VALUE(ours || tensor.device().is_cpu(), "torch_fallback.distributed: ",
                      collective_, " got a tensor on ", tensor.device(),
                      " in a process group for ",
                      c10::DeviceTypeName(backend_.adapter().device_type, /*lower_case=*/true),
                      " and CPU tensors; give that device's collectives a backend of their own "
                      "(init_process_group(\"cpu:gloo,cuda:nccl,...\"))");
    const c10::Device home = ours ? backend_.adapter().home_device(tensor.storage()) : c10::kCPU;
    TORCH_CHECK_VALUE(!home_ || home_->type() == home.type(), "torch_fallback.distributed: ",
                      collective_, " got tensors that live in different homes (",
                      home_->str(), " and ", home.str(),
                      "); a collective runs on one engine: move them to one home first");
    home_ = home;
    at::Tensor view = ours ? home_view(backend_.adapter(), tensor) : tensor;
    views_.push_back(view);
    return view;
  }

  Tensors views(const Tensors& tensors) {
    Tensors result;
    result.reserve(tensors.size());
    for (const auto& tensor : tensors) result.push_back(view(tensor));
    return result;
  }

  TensorLists views(const TensorLists& lists) {
    TensorLists result;
    result.reserve(lists.size());
    for (const auto& list : lists) result.push_back(views(list));
    return result;
  }

  c10d::Backend& engine() const {
    const bool cuda = home_ && home_->is_cuda();
    const auto& engine = cuda ? backend_.cuda_engine() : backend_.host_engine();
    TORCH_CHECK(engine, "torch_fallback.distributed: ", collective_, " on tensors in ",
                cuda ? "CUDA" : "host", " memory needs ", cuda ? "NCCL" : "gloo",
                ", which this process group has none of (",
                cuda ? "a torch built with CUDA and NCCL, and a visible GPU"
                     : "a torch built with gloo",
                "): use a home whose engine is there");
    return *engine;
  }

  // The engine's work for the call, its result the device's `outputs`. An engine
  // may return no work for a synchronous call (ProcessGroupNCCL does, where
  // async_op=False: the collective is already ordered on the caller's stream),
  // and then there is none to wrap either.
  WorkPtr done(WorkPtr engine_work, Tensors outputs) {
    if (!engine_work) return engine_work;
    return c10::make_intrusive<HomeWork>(std::move(engine_work), std::move(outputs),
                                         std::move(views_));
  }

 private:
  const HomeBackend& backend_;
  const char* collective_;
  std::optional<c10::Device> home_;
  Tensors views_;
};

// The whole tensor of an all_gather_into_tensor or a reduce_scatter_tensor, of
// `world` ranks' parts, as the ranks' parts one after another along dimension 0.
// NCCL reads it as a flat buffer, whatever its shape: SyncBatchNorm gathers into a
// (1, world * n) one on every engine it does not know as gloo. Gloo splits it along
// dimension 0 instead; given so, both engines read it alike.
at::Tensor as_parts_along_rows(const at::Tensor& whole, const at::Tensor& part, int world) {
  if (!whole.is_contiguous() || whole.numel() != part.numel() * world) return whole;
  std::vector<int64_t> shape = part.sizes().vec();
  if (shape.empty()) shape.push_back(1);
  shape[0] *= world;
  return whole.view(shape);
}

Tensors as_parts_along_rows(const Tensors& wholes, const Tensors& parts, int world) {
  if (wholes.size() != parts.size()) return wholes;
  Tensors result;
  result.reserve(wholes.size());
  for (size_t i = 0; i < wholes.size(); ++i) {
    result.push_back(as_parts_along_rows(wholes[i], parts[i], world));
  }
  return result;
}

Tensors flat(const TensorLists& lists) {
  Tensors result;
  for (const auto& list : lists) result.insert(result.end(), list.begin(), list.end());
  return result;
}

}  // namespace

HomeBackend::HomeBackend(c10::DeviceType device_type, int rank, int size, std::string name,
                         c10::intrusive_ptr<c10d::Backend> host_engine,
                         c10::intrusive_ptr<c10d::Backend> cuda_engine)
    : c10d::Backend(rank, size),
      name_(std::move(name)),
      host_engine_(std::move(host_engine)),
      cuda_engine_(std::move(cuda_engine)) {
  adapter_ = adapter_for(device_type);
  TORCH_CHECK_VALUE(adapter_ != nullptr, "torch_fallback.distributed: no backend of the library "
                    "serves device type ", c10::DeviceTypeName(device_type),
                    "; import the backend (e.g. torch_fallback.relay) first");
  TORCH_CHECK_VALUE(host_engine_ || cuda_engine_,
                    "torch_fallback.distributed: a process group needs gloo or NCCL");
}

const std::string HomeBackend::getBackendName() const { return name_; }

WorkPtr HomeBackend::broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) {
  Call call(*this, "broadcast");
  Tensors views = call.views(tensors);
  return call.done(call.engine().broadcast(views, opts), tensors);
}

WorkPtr HomeBackend::allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) {
  Call call(*this, "all_reduce");
  Tensors views = call.views(tensors);
  return call.done(call.engine().allreduce(views, opts), tensors);
}

WorkPtr HomeBackend::allreduce_coalesced(Tensors& tensors,
                                         const c10d::AllreduceCoalescedOptions& opts) {
  Call call(*this, "all_reduce_coalesced");
  Tensors views = call.views(tensors);
  return call.done(call.engine().allreduce_coalesced(views, opts), tensors);
}

WorkPtr HomeBackend::reduce(Tensors& tensors, const c10d::ReduceOptions& opts) {
  Call call(*this, "reduce");
  Tensors views = call.views(tensors);
  return call.done(call.engine().reduce(views, opts), tensors);
}

WorkPtr HomeBackend::allgather(TensorLists& outputs, Tensors& inputs,
                               const c10d::AllgatherOptions& opts) {
  Call call(*this, "all_gather");
  TensorLists output_views = call.views(outputs);
  Tensors input_views = call.views(inputs);
  return call.done(call.engine().allgather(output_views, input_views, opts), flat(outputs));
}

WorkPtr HomeBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                     const c10d::AllgatherOptions& opts) {
  Call call(*this, "all_gather_into_tensor");
  at::Tensor input_view = call.view(input);
  at::Tensor output_view = as_parts_along_rows(call.view(output), input_view, getSize());
  return call.done(call.engine()._allgather_base(output_view, input_view, opts), {output});
}

WorkPtr HomeBackend::allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                                         const c10d::AllgatherOptions& opts) {
  Call call(*this, "all_gather_coalesced");
  TensorLists output_views = call.views(outputs);
  Tensors input_views = call.views(inputs);
  return call.done(call.engine().allgather_coalesced(output_views, input_views, opts),
                   flat(outputs));
}

WorkPtr HomeBackend::allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  Call call(*this, "all_gather_into_tensor_coalesced");
  Tensors input_views = call.views(inputs);
  Tensors output_views = as_parts_along_rows(call.views(outputs), input_views, getSize());
  return call.done(
      call.engine().allgather_into_tensor_coalesced(output_views, input_views, opts), outputs);
}

WorkPtr HomeBackend::gather(TensorLists& outputs, Tensors& inputs,
                            const c10d::GatherOptions& opts) {
  Call call(*this, "gather");
  TensorLists output_views = call.views(outputs);
  Tensors input_views = call.views(inputs);
  return call.done(call.engine().gather(output_views, input_views, opts), flat(outputs));
}

WorkPtr HomeBackend::scatter(Tensors& outputs, TensorLists& inputs,
                             const c10d::ScatterOptions& opts) {
  Call call(*this, "scatter");
  Tensors output_views = call.views(outputs);
  TensorLists input_views = call.views(inputs);
  return call.done(call.engine().scatter(output_views, input_views, opts), outputs);
}

WorkPtr HomeBackend::reduce_scatter(Tensors& outputs, TensorLists& inputs,
                                    const c10d::ReduceScatterOptions& opts) {
  Call call(*this, "reduce_scatter");
  Tensors output_views = call.views(outputs);
  TensorLists input_views = call.views(inputs);
  return call.done(call.engine().reduce_scatter(output_views, input_views, opts), outputs);
}

WorkPtr HomeBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                          const c10d::ReduceScatterOptions& opts) {
  Call call(*this, "reduce_scatter_tensor");
  at::Tensor output_view = call.view(output);
  at::Tensor input_view = as_parts_along_rows(call.view(input), output_view, getSize());
  return call.done(call.engine()._reduce_scatter_base(output_view, input_view, opts), {output});
}

WorkPtr HomeBackend::reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                                     const c10d::ReduceScatterOptions& opts) {
  Call call(*this, "reduce_scatter_tensor_coalesced");
  Tensors output_views = call.views(outputs);
  Tensors input_views = as_parts_along_rows(call.views(inputs), output_views, getSize());
  return call.done(
      call.engine().reduce_scatter_tensor_coalesced(output_views, input_views, opts), outputs);
}

WorkPtr HomeBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                   std::vector<int64_t>& output_split_sizes,
                                   std::vector<int64_t>& input_split_sizes,
                                   const c10d::AllToAllOptions& opts) {
  Call call(*this, "all_to_all_single");
  at::Tensor output_view = call.view(output);
  at::Tensor input_view = call.view(input);
  return call.done(call.engine().alltoall_base(output_view, input_view, output_split_sizes,
                                               input_split_sizes, opts),
                   {output});
}

WorkPtr HomeBackend::alltoall(Tensors& outputs, Tensors& inputs,
                              const c10d::AllToAllOptions& opts) {
  Call call(*this, "all_to_all");
  Tensors output_views = call.views(outputs);
  Tensors input_views = call.views(inputs);
  return call.done(call.engine().alltoall(output_views, input_views, opts), outputs);
}

WorkPtr HomeBackend::send(Tensors& tensors, int dst_rank, int tag) {
  Call call(*this, "send");
  Tensors views = call.views(tensors);
  return call.done(call.engine().send(views, dst_rank, tag), tensors);
}

WorkPtr HomeBackend::recv(Tensors& tensors, int src_rank, int tag) {
  Call call(*this, "recv");
  Tensors views = call.views(tensors);
  return call.done(call.engine().recv(views, src_rank, tag), tensors);
}

WorkPtr HomeBackend::recvAnysource(Tensors& tensors, int tag) {
  Call call(*this, "recv (any source)");
  Tensors views = call.views(tensors);
  return call.done(call.engine().recvAnysource(views, tag), tensors);
}

WorkPtr HomeBackend::barrier(const c10d::BarrierOptions& opts) {
  // A barrier has no tensors: gloo's (host) where there is one, else NCCL's
  // on the GPU this process uses.
  if (host_engine_) return host_engine_->barrier(opts);
  c10d::BarrierOptions cuda_opts = opts;
  cuda_opts.device = std::nullopt;
  return cuda_engine_->barrier(cuda_opts);
}

void HomeBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  // Only gloo monitors a barrier; NCCL's engine says so where there is no gloo.
  (host_engine_ ? host_engine_ : cuda_engine_)->monitoredBarrier(opts, wait_all_ranks);
}

void HomeBackend::setSequenceNumberForGroup() {
  if (host_engine_) host_engine_->setSequenceNumberForGroup();
  if (cuda_engine_) cuda_engine_->setSequenceNumberForGroup();
}

uint64_t HomeBackend::getSequenceNumberForGroup() {
  return (host_engine_ ? host_engine_ : cuda_engine_)->getSequenceNumberForGroup();
}

void HomeBackend::setTimeout(std::chrono::milliseconds timeout) {
  if (host_engine_) host_engine_->setTimeout(timeout);
  if (cuda_engine_) cuda_engine_->setTimeout(timeout);
}

void HomeBackend::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  // The engines name their communicators and traces by it (NCCL needs one).
  if (host_engine_) host_engine_->setGroupUid(pg_uid);
  if (cuda_engine_) cuda_engine_->setGroupUid(pg_uid);
}

void HomeBackend::abort() {
  if (host_engine_) host_engine_->abort();
  if (cuda_engine_) cuda_engine_->abort();
}

void HomeBackend::shutdown() {
  if (host_engine_) host_engine_->shutdown();
  if (cuda_engine_) cuda_engine_->shutdown();
}

// torch.ops.torch_fallback.serve_home(group, device_type, name, host, cuda):
// makes `group` run the collectives of `device_type` and of CPU tensors on a
// HomeBackend, and makes that its default backend. The engines come as process
// groups that carry them (ProcessGroupGloo for CPU, ProcessGroupNCCL for CUDA):
// a process group crosses torch.ops as a TorchBind object, a c10d Backend does not.
void serve_home(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& device_type,
                const std::string& name,
                const std::optional<c10::intrusive_ptr<c10d::ProcessGroup>>& host_carrier,
                const std::optional<c10::intrusive_ptr<c10d::ProcessGroup>>& cuda_carrier) {
  auto engine = [](const std::optional<c10::intrusive_ptr<c10d::ProcessGroup>>& carrier,
                   c10::DeviceType type) -> c10::intrusive_ptr<c10d::Backend> {
    // A carrier holds its engine for `type` (torch_fallback.distributed registers it).
    return carrier ? (*carrier)->getBackend(type) : nullptr;
  };
  auto backend = c10::make_intrusive<HomeBackend>(
      c10::Device(device_type).type(), static_cast<int>(group->getRank()),
      static_cast<int>(group->getSize()), name, engine(host_carrier, c10::DeviceType::CPU),
      engine(cuda_carrier, c10::DeviceType::CUDA));
  const auto custom = c10d::ProcessGroup::BackendType::CUSTOM;
  for (c10::DeviceType served : {c10::Device(device_type).type(), c10::DeviceType::CPU}) {
    group->setBackend(served, custom, backend);
  }
  group->setDefaultBackend(custom);
}

void define_ops(torch::Library& m) { m.def("serve_home", &serve_home); }

}  // namespace torch_fallback::distributed
