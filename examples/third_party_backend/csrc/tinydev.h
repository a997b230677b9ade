#pragma once
// What tinydev's two translation units share. Tensor-free on purpose, so that
// module.cpp (pybind11 and c10 headers only) compiles quickly.
#include <cstdint>

namespace tinydev {

// Storages tinydev's allocator made that are still alive.
int64_t live_allocations();

}  // namespace tinydev
