// torch_fallback._C: the Python face of the extension. Tensor-free on purpose:
// pybind11 and standard types only, so this translation unit stays cheap.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <torch_fallback/cuda.h>
#include <torch_fallback/cuda_functions.h>

#include "distributed.h"
#include "metrics.h"
#include "settings.h"

namespace py = pybind11;
namespace tf = torch_fallback;

#ifndef TORCH_FALLBACK_BUILT_TORCH
#error "setup.py passes TORCH_FALLBACK_BUILT_TORCH (torch.__version__ at build time)"
#endif
#ifndef TORCH_FALLBACK_BUILT_CUDA
#error "setup.py passes TORCH_FALLBACK_BUILT_CUDA (torch.version.cuda at build time, or empty)"
#endif

namespace {

void translate_c10_errors() {
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
}

py::dict metrics_snapshot() {
  py::dict result;
  for (const auto& [op, stats] : tf::metrics::snapshot()) {
    py::dict entry;
    entry["calls_cpu"] = stats.calls_cpu;
    entry["calls_cuda"] = stats.calls_cuda;
    entry["errors"] = stats.errors;
    entry["time_ns"] = stats.time_ns;
    entry["bytes_to_target"] = stats.bytes_to_target;
    entry["bytes_from_target"] = stats.bytes_from_target;
    entry["calls_unboxed"] = stats.calls_unboxed;
    result[py::str(op)] = entry;
  }
  return result;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-fallback: a generalized boxed fallback for out-of-tree backends";
  translate_c10_errors();
  torch_fallback::distributed::bind(m);

  m.attr("built_torch_version") = TORCH_FALLBACK_BUILT_TORCH;
  m.attr("built_cuda_version") = TORCH_FALLBACK_BUILT_CUDA;
  m.attr("set_device_has_force") = static_cast<bool>(TORCH_FALLBACK_SET_DEVICE_HAS_FORCE);

  m.def("cuda_built", &tf::cuda::built, "Whether libc10_cuda.so is loaded (torch built with CUDA).");
  m.def("cuda_device_count", [] { return static_cast<int>(tf::cuda::device_count()); });
  m.def("cuda_current_device", [] { return static_cast<int>(tf::cuda::current_device()); },
        "c10::cuda::current_device(), after checking that CUDA and a GPU are there.");
  m.def("cuda_set_device", [](int index) { tf::cuda::set_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("cuda_device_synchronize", &tf::cuda::device_synchronize);
  m.def("cuda_current_device_unchecked", [] { return static_cast<int>(tf::cuda::current_device_unchecked()); },
        "c10::cuda::current_device() with no checks: reaches the stub on a CPU-only PyTorch.");
  m.def("cuda_symbol_names", &tf::cuda::symbol_names);
  m.def("cuda_symbol_provider", &tf::cuda::symbol_provider, py::arg("symbol"),
        "Path of the shared object that defines the given c10::cuda symbol for _C.");

  m.def("set_target", [](const std::string& name) { tf::set_target(tf::parse_target(name)); });
  m.def("get_target", [] { return tf::target_name(tf::target()); });
  m.def("set_cuda_sync", [](const std::string& name) { tf::set_cuda_sync(tf::parse_cuda_sync(name)); });
  m.def("get_cuda_sync", [] { return tf::cuda_sync_name(tf::cuda_sync()); });
  m.def("set_cpu_ops", &tf::set_cpu_ops);
  m.def("get_cpu_ops", &tf::cpu_ops);

  m.def("metrics", &metrics_snapshot);
  m.def("reset_metrics", &tf::metrics::reset);

}
