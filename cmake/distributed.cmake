# distributed/: the optional transports of include/kvmm/dist. The core of distributed/ (event encoding,
# page descriptors, the KVTier interface and value codec) is plain src/distributed/*.cpp inside
# kvmm::kvmm; the parts that need a library become their own targets, built when the
# Debian package is found:
#   kvmm::events  KvEventPublisher on ZeroMQ   (libzmq3-dev, cppzmq-dev)  KVMM_EVENTS
#   kvmm::redis   RedisTier on hiredis         (libhiredis-dev)           KVMM_REDIS
# AUTO builds a target when its package is found, ON requires it, OFF skips it.
# Included from the top-level CMakeLists.txt after kvmm::kvmm is defined.

set(KVMM_EVENTS AUTO CACHE STRING "Build kvmm::events, the ZeroMQ KV event publisher (AUTO/ON/OFF)")
set_property(CACHE KVMM_EVENTS PROPERTY STRINGS AUTO ON OFF)
set(KVMM_REDIS AUTO CACHE STRING "Build kvmm::redis, the Redis KVTier (AUTO/ON/OFF)")
set_property(CACHE KVMM_REDIS PROPERTY STRINGS AUTO ON OFF)

# The core library globs src/*.cpp; the transports' sources belong to their own targets.
get_target_property(_kvmm_sources kvmm SOURCES)
list(FILTER _kvmm_sources EXCLUDE REGEX "/src/distributed/(events|redis)/")
set_property(TARGET kvmm PROPERTY SOURCES ${_kvmm_sources})

# One optional target: kvmm_<name> from src/distributed/<name>/*.cpp linked to `libs`.
function(kvmm_dist_target name option found libs)
  string(TOUPPER ${name} upper)
  if(NOT found)
    if(option STREQUAL "ON")
      message(FATAL_ERROR "KVMM_${upper}=ON but its library was not found")
    endif()
    message(STATUS "kvmm: kvmm::${name} OFF (library not found or KVMM option OFF)")
    return()
  endif()
  file(GLOB srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/distributed/${name}/*.cpp)
  if(NOT srcs)
    message(STATUS "kvmm: kvmm::${name} OFF (no sources in src/distributed/${name})")
    return()
  endif()
  add_library(kvmm_${name} ${srcs})
  add_library(kvmm::${name} ALIAS kvmm_${name})
  target_link_libraries(kvmm_${name} PUBLIC kvmm PRIVATE ${libs} $<BUILD_INTERFACE:kvmm_warnings>)
  set_target_properties(kvmm_${name} PROPERTIES EXPORT_NAME ${name} POSITION_INDEPENDENT_CODE ON)
  set(KVMM_INSTALL_TARGETS ${KVMM_INSTALL_TARGETS} kvmm_${name} PARENT_SCOPE)
  message(STATUS "kvmm: kvmm::${name} ON")
endfunction()

set(_found OFF)
if(NOT KVMM_EVENTS STREQUAL "OFF")
  find_path(KVMM_ZMQ_INCLUDE_DIR zmq.h)
  find_path(KVMM_CPPZMQ_INCLUDE_DIR zmq.hpp)
  find_library(KVMM_ZMQ_LIBRARY zmq)
  if(KVMM_ZMQ_INCLUDE_DIR AND KVMM_CPPZMQ_INCLUDE_DIR AND KVMM_ZMQ_LIBRARY)
    set(_found ON)
  endif()
endif()
kvmm_dist_target(events "${KVMM_EVENTS}" ${_found} "${KVMM_ZMQ_LIBRARY}")
if(TARGET kvmm_events)
  target_include_directories(kvmm_events PRIVATE ${KVMM_ZMQ_INCLUDE_DIR} ${KVMM_CPPZMQ_INCLUDE_DIR})
endif()

set(_found OFF)
if(NOT KVMM_REDIS STREQUAL "OFF")
  find_path(KVMM_HIREDIS_INCLUDE_DIR hiredis/hiredis.h)
  find_library(KVMM_HIREDIS_LIBRARY hiredis)
  if(KVMM_HIREDIS_INCLUDE_DIR AND KVMM_HIREDIS_LIBRARY)
    set(_found ON)
  endif()
endif()
kvmm_dist_target(redis "${KVMM_REDIS}" ${_found} "${KVMM_HIREDIS_LIBRARY}")
if(TARGET kvmm_redis)
  target_include_directories(kvmm_redis PRIVATE ${KVMM_HIREDIS_INCLUDE_DIR})
endif()
unset(_found)
