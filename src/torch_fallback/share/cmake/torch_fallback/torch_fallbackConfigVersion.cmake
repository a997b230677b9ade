# The version of the torch_fallback package: torch_fallback.__version__, read from
# the package's __init__.py (<package>/share/cmake/torch_fallback/../../..), the one
# place it is written.
#
# Compatible with a requested version when it is at least that version and has
# the same major version (the same minor version while the major version is 0).

file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../../../__init__.py" _torch_fallback_version
     REGEX "^__version__ = \"[^\"]+\"$" LIMIT_COUNT 1)
string(REGEX REPLACE "^__version__ = \"([^\"]+)\"$" "\\1" PACKAGE_VERSION
       "${_torch_fallback_version}")
unset(_torch_fallback_version)

if(NOT PACKAGE_VERSION MATCHES "^([0-9]+)\\.([0-9]+)")
  set(PACKAGE_VERSION "unknown")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
  return()
endif()
set(_torch_fallback_major "${CMAKE_MATCH_1}")
set(_torch_fallback_minor "${CMAKE_MATCH_2}")

if(PACKAGE_FIND_VERSION_RANGE)
  # find_package(torch_fallback 0.1...<0.3): the range decides alone.
  if(PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION_MIN
     OR (PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL "INCLUDE"
         AND PACKAGE_VERSION VERSION_GREATER PACKAGE_FIND_VERSION_MAX)
     OR (PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL "EXCLUDE"
         AND PACKAGE_VERSION VERSION_GREATER_EQUAL PACKAGE_FIND_VERSION_MAX))
    set(PACKAGE_VERSION_COMPATIBLE FALSE)
  else()
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  endif()
elseif(NOT DEFINED PACKAGE_FIND_VERSION OR PACKAGE_FIND_VERSION STREQUAL "")
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
elseif(PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION
       OR NOT PACKAGE_FIND_VERSION_MAJOR STREQUAL _torch_fallback_major
       OR (_torch_fallback_major STREQUAL "0" AND PACKAGE_FIND_VERSION_COUNT GREATER 1
           AND NOT PACKAGE_FIND_VERSION_MINOR STREQUAL _torch_fallback_minor))
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_VERSION VERSION_EQUAL PACKAGE_FIND_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
unset(_torch_fallback_major)
unset(_torch_fallback_minor)
