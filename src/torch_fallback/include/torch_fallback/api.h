#pragma once
// Symbols of torch-fallback's public C++ API.
//
// torch_fallback/_C exports them and `import torch_fallback` loads it with
// RTLD_GLOBAL, so a backend's extension, loaded after that import, resolves
// them at load time without linking against the library: it needs only these
// headers (torch_fallback.get_include()).
#define TORCH_FALLBACK_API __attribute__((visibility("default")))

// The version of the stable C++ API (see fallback.h): raised whenever a stable
// declaration changes, so a backend can check what it builds against.
#define TORCH_FALLBACK_API_VERSION 1
