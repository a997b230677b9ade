#pragma once
// The Python module of an extension whose Python face is torch.ops.
//
// Such an extension registers its functions as operators (TORCH_LIBRARY) and
// needs from Python only that importing it loads the shared object. This
// header defines that import with the CPython stable ABI alone, so the wheel
// is tagged abi3 and serves every CPython from 3.10 on:
//
//   // my_backend/csrc/module.cpp, built with Py_LIMITED_API=0x030A0000
//   #include <torch_fallback/python_module.h>
//   TORCH_FALLBACK_PYTHON_MODULE(_C, "my_backend's operators: torch.ops.my_backend")
//
// Include it in a translation unit that includes no torch/csrc (Python) header:
// those use CPython's full API.
#ifndef Py_LIMITED_API
#error "build with Py_LIMITED_API (torch_fallback.cpp_extension.BackendExtension sets it)"
#endif
#include <Python.h>

#define TORCH_FALLBACK_PYTHON_MODULE(name, doc)                                  \
  PyMODINIT_FUNC PyInit_##name() {                                               \
    static PyModuleDef definition = {PyModuleDef_HEAD_INIT, #name, doc, -1, nullptr}; \
    return PyModule_Create(&definition);                                          \
  }
