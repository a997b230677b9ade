#pragma once
// What tinydev's translation units share. Tensor-free on purpose, so that
// module.cpp and memory.cpp compile quickly.
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tinydev {

constexpr c10::DeviceIndex kDeviceCount = 2;

// ---- memory.cpp: pages locked (PROT_NONE) outside an open access ----------
void* allocate_locked(size_t nbytes, c10::DeviceIndex device);
void free_locked(void* base);
// Accesses nest: the pages are readable and writable while any is open.
void open_access(const void* data);
void close_access(const void* data) noexcept;
// The device of the allocation holding `address`, if tinydev allocated it.
std::optional<c10::DeviceIndex> device_of(const void* address);
// Allocations alive, and accesses open over all of them.
int64_t live_allocations();
int64_t open_accesses();

// ---- tinydev.cpp ------------------------------------------------------------
// Calls of one of tinydev's kernels that torch-fallback also offers (view,
// as_strided, _reshape_alias, _copy_from, _fused_sdp_choice): it must leave
// them in place.
int64_t own_kernel_calls(const std::string& name);

}  // namespace tinydev
