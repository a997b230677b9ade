// torch_fallback._C's Python face: operators in torch.ops.torch_fallback, and an
// empty module built on the CPython stable ABI (one wheel for every Python).
// Tensor-free on purpose, so that this translation unit stays cheap.
#include <torch/library.h>
#include <torch/version.h>

#include <torch_fallback/cuda.h>
#include <torch_fallback/cuda_functions.h>
#include <torch_fallback/python_module.h>

#include "distributed.h"
#include "metrics.h"
#include "op_rules.h"
#include "settings.h"

namespace tf = torch_fallback;

#ifndef TORCH_FALLBACK_BUILT_TORCH
#error "setup.py passes TORCH_FALLBACK_BUILT_TORCH (torch.__version__ at build time)"
#endif

namespace {

// The counters of every op with a call, as parallel lists: op names, and per op
// the values of metrics_fields() in that order.
std::tuple<std::vector<std::string>, std::vector<int64_t>> metrics_snapshot() {
  std::vector<std::string> ops;
  std::vector<int64_t> values;
  for (const auto& [op, stats] : tf::metrics::snapshot()) {
    ops.push_back(op);
    for (uint64_t value : {stats.calls_cpu, stats.calls_cuda, stats.errors, stats.time_ns,
                           stats.bytes_to_target, stats.bytes_from_target, stats.calls_unboxed}) {
      values.push_back(static_cast<int64_t>(value));
    }
  }
  return {std::move(ops), std::move(values)};
}

std::vector<std::string> metrics_fields() {
  return {"calls_cpu",       "calls_cuda",        "errors",       "time_ns",
          "bytes_to_target", "bytes_from_target", "calls_unboxed"};
}

}  // namespace

TORCH_LIBRARY(torch_fallback, m) {
  m.def("built_torch_version", []() -> std::string { return TORCH_FALLBACK_BUILT_TORCH; });
  m.def("set_device_has_force",
        []() { return static_cast<bool>(TORCH_FALLBACK_SET_DEVICE_HAS_FORCE); });

  m.def("cuda_built", &tf::cuda::built);
  m.def("cuda_device_count", []() { return static_cast<int64_t>(tf::cuda::device_count()); });
  m.def("cuda_current_device", []() { return static_cast<int64_t>(tf::cuda::current_device()); });
  m.def("cuda_set_device",
        [](int64_t index) { tf::cuda::set_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("cuda_device_synchronize", &tf::cuda::device_synchronize);
  // c10::cuda::current_device() with no checks: reaches the stub on a CPU-only PyTorch.
  m.def("cuda_current_device_unchecked",
        []() { return static_cast<int64_t>(tf::cuda::current_device_unchecked()); });
  m.def("cuda_symbol_names", &tf::cuda::symbol_names);
  // Path of the shared object that defines the given c10::cuda symbol for _C.
  m.def("cuda_symbol_provider", &tf::cuda::symbol_provider);

  m.def("set_target", [](const std::string& name) { tf::set_target(tf::parse_target(name)); });
  m.def("get_target", []() { return tf::target_name(tf::target()); });
  m.def("set_cuda_sync",
        [](const std::string& name) { tf::set_cuda_sync(tf::parse_cuda_sync(name)); });
  m.def("get_cuda_sync", []() { return tf::cuda_sync_name(tf::cuda_sync()); });
  m.def("set_cuda_device_checked_ops", &tf::set_cuda_device_checked_ops);
  m.def("set_cpu_ops", &tf::set_cpu_ops);
  m.def("get_cpu_ops", &tf::cpu_ops);

  m.def("metrics_fields", &metrics_fields);
  m.def("metrics", &metrics_snapshot);
  m.def("reset_metrics", &tf::metrics::reset);
  m.def("parked_target_impls", &tf::metrics::parked_target_impls);

  tf::distributed::define_ops(m);
}

TORCH_FALLBACK_PYTHON_MODULE(_C, "torch-fallback's library; its Python face is torch.ops.torch_fallback")
