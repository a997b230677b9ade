// torch_fallback.relay._C: relay's Python face. Tensor-free on purpose:
// pybind11 and standard types only, so this translation unit stays cheap.
#include <pybind11/pybind11.h>

#include "relay.h"

namespace py = pybind11;
namespace relay = torch_fallback::relay;

PYBIND11_MODULE(_C, m) {
  m.doc() = "relay: a PrivateUse1 device served by torch-fallback";
  m.def("set_home", [](const std::string& name) { relay::set_current_home(relay::parse_home(name)); });
  m.def("get_home", [] { return relay::home_name(relay::current_home()); });
  m.def("device_count", [] { return static_cast<int>(relay::device_count()); });
  m.def("current_device", [] { return static_cast<int>(relay::current_device()); });
  m.def("set_device", [](int index) { relay::set_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("synchronize", [](int index) { relay::synchronize(static_cast<c10::DeviceIndex>(index)); },
        py::arg("index") = -1);
}
