#pragma once
// torch_fallback._C's c10d backend (distributed.cpp), offered as an operator
// without pulling the c10d headers into the bindings' translation unit.
#include <torch/library.h>

namespace torch_fallback::distributed {
// Defines serve_home: a process group whose collectives run on HomeBackend, a
// c10d Backend built on the library's adapters.
void define_ops(torch::Library& m);
}  // namespace torch_fallback::distributed
