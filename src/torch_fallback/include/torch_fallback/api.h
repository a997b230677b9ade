#pragma once
// Symbols of torch-fallback's public C++ API.
//
// torch_fallback/_C exports them and `import torch_fallback` loads it with
// RTLD_GLOBAL, so a backend's extension, loaded after that import, resolves
// them at load time without linking against the library: it needs only these
// headers (torch_fallback.get_include()).
#define TORCH_FALLBACK_API __attribute__((visibility("default")))

// The version of the stable C++ API (see fallback.h): raised whenever a stable
// declaration changes, so a backend can check what it builds against. A
// backend is built against the headers of the torch-fallback it runs with (the
// adapter's layout is part of the API).
//   1  the first.
//   2  BackendAdapter: begin_access and end_access (memory locked outside
//      access), lend_backend_meta (the library keeps no per-tensor state in
//      BackendMeta unless lent), adopt may be null (results copied into memory
//      the backend allocates); register_kernels leaves the backend's own
//      _fused_sdp_choice.
#define TORCH_FALLBACK_API_VERSION 2
