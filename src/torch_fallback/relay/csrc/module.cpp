// torch_fallback.relay._C: relay's Python face. Kept free of tensor code so
// that this translation unit stays cheap.
#include <pybind11/pybind11.h>
#include <torch/csrc/Generator.h>

#include "relay.h"

namespace py = pybind11;
namespace relay = torch_fallback::relay;

namespace {

c10::DeviceIndex checked_index(int64_t index) {
  if (index < 0) return relay::current_device();
  relay::check_device_index(index);
  return static_cast<c10::DeviceIndex>(index);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "relay: a PrivateUse1 device served by torch-fallback";
  relay::add_autograd_device_threads();
  m.def("set_home", [](const std::string& name) { relay::set_current_home(relay::parse_home(name)); });
  m.def("get_home", [] { return relay::home_name(relay::current_home()); });
  m.def("device_count", [] { return static_cast<int>(relay::device_count()); });
  m.def("current_device", [] { return static_cast<int>(relay::current_device()); });
  m.def("set_device", [](int64_t index) {
    relay::check_device_index(index);
    relay::set_device(static_cast<c10::DeviceIndex>(index));
  });
  m.def("check_device_index", &relay::check_device_index);
  m.def("synchronize", [](int64_t index) { relay::synchronize(checked_index(index)); },
        py::arg("index") = -1);
  m.def("default_generator", [](int64_t index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(relay::default_generator(checked_index(index))));
  });
  m.def("memory_allocated", [](int64_t index) {
    return relay::memory_figures(checked_index(index)).allocated;
  });
  m.def("max_memory_allocated", [](int64_t index) {
    return relay::memory_figures(checked_index(index)).peak;
  });
  m.def("reset_peak_memory_stats", [](int64_t index) { relay::reset_peak(checked_index(index)); });
  m.def("is_page_locked", [](uintptr_t address) {
    return relay::is_pinned(reinterpret_cast<const void*>(address));
  });
  m.def("finish_autograd_work", [] {
    py::gil_scoped_release no_gil;  // the device threads may need it to drop Python objects
    relay::finish_autograd_work();
  });
}
