# include/kvmm/version.hpp is a plain header (so the one-header-per-TU check and an
# install see it like any other); this check keeps it equal to project(kvmm VERSION ...):
# configuring fails, naming both, when a number or the string differs. Costs one file read.
set(_kvmm_header ${PROJECT_SOURCE_DIR}/include/kvmm/version.hpp)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_kvmm_header})
file(STRINGS ${_kvmm_header} _kvmm_lines REGEX "^#define KVMM_VERSION")
foreach(_kvmm_expect
    "#define KVMM_VERSION_MAJOR ${PROJECT_VERSION_MAJOR}"
    "#define KVMM_VERSION_MINOR ${PROJECT_VERSION_MINOR}"
    "#define KVMM_VERSION_PATCH ${PROJECT_VERSION_PATCH}"
    "#define KVMM_VERSION \"${PROJECT_VERSION}\"")
  if(NOT _kvmm_expect IN_LIST _kvmm_lines)
    message(FATAL_ERROR "kvmm: ${_kvmm_header} lacks the line '${_kvmm_expect}' that "
      "project(kvmm VERSION ${PROJECT_VERSION}) implies; its version lines: ${_kvmm_lines}")
  endif()
endforeach()
unset(_kvmm_lines)
unset(_kvmm_header)
