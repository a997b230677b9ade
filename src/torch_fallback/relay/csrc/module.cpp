// torch_fallback.relay._C's Python face: operators in torch.ops.relay, and an
// empty module built on the CPython stable ABI. Kept free of tensor code so
// that this translation unit stays cheap.
#include <torch/library.h>

#include <torch_fallback/python_module.h>

#include "relay.h"

namespace relay = torch_fallback::relay;

namespace {

// A device index from Python: negative means the current device.
c10::DeviceIndex checked_index(int64_t index) {
  if (index < 0) return relay::current_device();
  relay::check_device_index(index);
  return static_cast<c10::DeviceIndex>(index);
}

}  // namespace

TORCH_LIBRARY(relay, m) {
  m.def("add_autograd_device_threads", &relay::add_autograd_device_threads);
  m.def("set_home", [](const std::string& name) { relay::set_current_home(relay::parse_home(name)); });
  m.def("get_home", []() { return relay::home_name(relay::current_home()); });
  m.def("device_count", []() { return static_cast<int64_t>(relay::device_count()); });
  m.def("current_device", []() { return static_cast<int64_t>(relay::current_device()); });
  m.def("set_device", [](int64_t index) {
    relay::check_device_index(index);
    relay::set_device(static_cast<c10::DeviceIndex>(index));
  });
  m.def("check_device_index", &relay::check_device_index);
  m.def("synchronize", [](int64_t index) { relay::synchronize(checked_index(index)); });
  m.def("default_generator",
        [](int64_t index) { return relay::default_generator(checked_index(index)); });
  m.def("memory_allocated",
        [](int64_t index) { return relay::memory_figures(checked_index(index)).allocated; });
  m.def("max_memory_allocated",
        [](int64_t index) { return relay::memory_figures(checked_index(index)).peak; });
  m.def("reset_peak_memory_stats", [](int64_t index) { relay::reset_peak(checked_index(index)); });
  m.def("is_page_locked", [](int64_t address) {
    return relay::is_pinned(reinterpret_cast<const void*>(static_cast<uintptr_t>(address)));
  });
  // Sending relay tensors to other processes (torch_fallback.relay._sharing).
  m.def("home_view(Tensor self) -> Tensor",
        [](const at::Tensor& self) { return torch_fallback::home_view(relay::backend(), self); });
  m.def("rehome(Tensor self, Tensor home) -> ()", [](const at::Tensor& self, const at::Tensor& home) {
    relay::rehome(self.storage(), home.storage());
  });
  m.def("adopt_home(Tensor home, int index) -> Tensor", [](const at::Tensor& home, int64_t index) {
    at::Tensor adopted = relay::adopt(home, checked_index(index));
    // The writes `home` has counted are the relay tensor's: torch's rebuild of a
    // tensor sent to another process counts its set_() (version 1), as eager's does.
    c10::TensorImpl* impl = adopted.unsafeGetTensorImpl();
    const c10::TensorImpl* home_impl = home.unsafeGetTensorImpl();
    if (impl->version_counter().enabled() && home_impl->version_counter().enabled()) {
      for (uint32_t i = adopted._version(); i < home._version(); ++i) impl->bump_version();
    }
    return adopted;
  });
  // torch.ops calls run without the GIL: the device threads may need it to drop Python objects.
  m.def("finish_autograd_work", &relay::finish_autograd_work);
}

TORCH_FALLBACK_PYTHON_MODULE(_C, "relay, a PrivateUse1 device served by torch-fallback; its Python face is torch.ops.relay")
