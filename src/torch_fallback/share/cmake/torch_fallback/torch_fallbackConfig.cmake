# torch-fallback's public C++ API for a backend built with CMake:
#
#   find_package(torch_fallback REQUIRED)
#   target_link_libraries(my_backend PRIVATE torch_fallback::headers)
#
# with this file's directory on CMAKE_PREFIX_PATH (or in torch_fallback_DIR):
#   python -c "import torch_fallback; print(torch_fallback.get_cmake_dir())"
#
# It defines the target torch_fallback::headers and the variable
# torch_fallback_INCLUDE_DIR (torch_fallback.get_include()); find_package sets
# torch_fallback_VERSION (torch_fallback.__version__, read by
# torch_fallbackConfigVersion.cmake).
#
# torch_fallback::headers carries what torch_fallback.cpp_extension.BackendExtension
# adds to torch's own flags: the include directory, C++20 and the definition
# torch.utils.cpp_extension gives every extension (TORCH_API_INCLUDE_EXTENSION_H).
# BackendExtension builds on CPython's stable ABI by default, and
# <torch_fallback/python_module.h> requires it: with CMake, build the module with
# python_add_library(<name> MODULE USE_SABI 3.10 WITH_SOABI ...), which defines
# Py_LIMITED_API=0x030A0000 and names the file <name>.abi3.so.
#
# The target links nothing: a backend does not link torch-fallback. Its shared
# object leaves torch-fallback's API (and the c10::cuda functions of
# <torch_fallback/cuda_functions.h>) undefined, and `import torch_fallback`, done
# before the backend's extension loads, provides them in the global symbol scope.
# So the module must be allowed undefined symbols: do not link it with
# -Wl,--no-undefined or -Wl,-z,defs.

if(TARGET torch_fallback::headers)
  return()
endif()

# This file lies in <package>/share/cmake/torch_fallback, the headers in <package>/include.
get_filename_component(torch_fallback_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../../../include"
                       ABSOLUTE)

# The headers torch_fallback.cpp_extension.HEADERS lists.
foreach(_torch_fallback_header IN ITEMS api.h fallback.h kernels.h cuda.h cuda_functions.h
                                        python_module.h detail/direct_kernel.h)
  if(NOT EXISTS "${torch_fallback_INCLUDE_DIR}/torch_fallback/${_torch_fallback_header}")
    set(torch_fallback_FOUND FALSE)
    string(CONCAT torch_fallback_NOT_FOUND_MESSAGE
           "torch-fallback's C++ headers are missing from ${torch_fallback_INCLUDE_DIR}: this "
           "installation has no public C++ API. Reinstall torch-fallback from a wheel built "
           "by its setup.py (the wheel ships include/torch_fallback/*.h).")
    unset(_torch_fallback_header)
    return()
  endif()
endforeach()
unset(_torch_fallback_header)

add_library(torch_fallback::headers INTERFACE IMPORTED)
set_target_properties(torch_fallback::headers PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${torch_fallback_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS "TORCH_API_INCLUDE_EXTENSION_H"
  INTERFACE_COMPILE_FEATURES "cxx_std_20")
