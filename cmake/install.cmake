# Install rules (KVMM_INSTALL): libraries, headers, the CMake package (kvmmConfig.cmake,
# kvmmTargets.cmake, and kvmmCudaTargets.cmake when kvmm::cuda was built) and kvmm.pc.
# Two install components: `kvmm` (everything a CPU consumer needs) and `kvmm_cuda`
# (kvmm::cuda's library and targets), so `cmake --install <dir> --component kvmm` gives
# a CPU-only install of a CUDA build. Included from the top-level CMakeLists.txt.

set(_kvmm_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kvmm)

# Shared builds: an installed libkvmm_cuda.so (or a dist library) finds the libkvmm.so
# beside it. A consumer's RUNPATH does not serve its libraries' own dependencies, and a
# linker with --as-needed drops libkvmm from a program that calls only kvmm::cuda.
if(APPLE)
  set(_kvmm_origin "@loader_path")
else()
  set(_kvmm_origin "$ORIGIN")
endif()
foreach(_kvmm_target ${KVMM_INSTALL_TARGETS} kvmm_cuda)
  if(TARGET ${_kvmm_target})
    set_target_properties(${_kvmm_target} PROPERTIES INSTALL_RPATH "${_kvmm_origin}")
  endif()
endforeach()

install(TARGETS ${KVMM_INSTALL_TARGETS} EXPORT kvmmTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT kvmm
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT kvmm
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT kvmm)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvmm DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT kvmm)
install(EXPORT kvmmTargets NAMESPACE kvmm:: DESTINATION ${_kvmm_cmake_dir} COMPONENT kvmm)

# kvmm::cuda in its own export file: kvmmConfig.cmake loads it (and finds CUDAToolkit)
# only for find_package(kvmm COMPONENTS cuda), so CPU consumers never look for CUDA.
if(TARGET kvmm_cuda)
  install(TARGETS kvmm_cuda EXPORT kvmmCudaTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT kvmm_cuda
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT kvmm_cuda
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT kvmm_cuda)
  install(EXPORT kvmmCudaTargets NAMESPACE kvmm:: DESTINATION ${_kvmm_cmake_dir}
    COMPONENT kvmm_cuda)
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvmmConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvmmConfig.cmake INSTALL_DESTINATION ${_kvmm_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvmmConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvmmConfig.cmake ${PROJECT_BINARY_DIR}/kvmmConfigVersion.cmake
  DESTINATION ${_kvmm_cmake_dir} COMPONENT kvmm)

# kvmm.pc. Its prefix is found from the .pc file's own place (${pcfiledir}), so the
# install stays valid under `cmake --install --prefix` and when moved. The public
# compile definitions of kvmm::kvmm go into Cflags: they change inline code in headers.
set(_kvmm_pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(KVMM_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _kvmm_up /p/${_kvmm_pc_dir} /p)
  string(REGEX REPLACE "/$" "" _kvmm_up "${_kvmm_up}")
  set(KVMM_PC_PREFIX "\${pcfiledir}/${_kvmm_up}")
endif()
set(KVMM_PC_CFLAGS "")
get_target_property(_kvmm_defs kvmm INTERFACE_COMPILE_DEFINITIONS)
if(_kvmm_defs)
  foreach(_kvmm_def ${_kvmm_defs})
    string(APPEND KVMM_PC_CFLAGS " -D${_kvmm_def}")
  endforeach()
endif()
set(KVMM_PC_LIBS_EXTRA "")
foreach(_kvmm_lib ${CMAKE_DL_LIBS})
  string(APPEND KVMM_PC_LIBS_EXTRA " -l${_kvmm_lib}")
endforeach()
get_target_property(_kvmm_type kvmm TYPE)
if(_kvmm_type STREQUAL "STATIC_LIBRARY")
  string(APPEND KVMM_PC_LIBS_EXTRA " -lsodium")  # block_hasher.cpp's private dependency
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvmm.pc.in ${PROJECT_BINARY_DIR}/kvmm.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvmm.pc DESTINATION ${_kvmm_pc_dir} COMPONENT kvmm)
