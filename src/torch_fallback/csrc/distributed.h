#pragma once
// torch_fallback._C's c10d backend (distributed.cpp), bound without pulling the
// c10d headers into the bindings' translation unit.
#include <pybind11/pybind11.h>

namespace torch_fallback::distributed {
// Adds HomeBackend, a c10d Backend built on the library's adapters, to `m`.
void bind(pybind11::module_& m);
}  // namespace torch_fallback::distributed
