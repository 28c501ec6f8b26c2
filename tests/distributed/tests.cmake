# tests/dist: kvmm_test_distributed (core distributed/ parts, made by tests/CMakeLists.txt's per-directory
# glob) needs the path of its Python scripts; the transports' tests are their own binaries,
# built when their targets are: kvmm_test_distributed_events (tests/distributed/events, ZeroMQ + Python
# consumer) and kvmm_test_distributed_redis (tests/distributed/redis, a real redis-server).
if(TARGET kvmm_test_distributed)
  target_compile_definitions(kvmm_test_distributed PRIVATE KVMM_DIST_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}")
endif()
foreach(name events redis)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/${name}/*.cpp)
  if(NOT TARGET kvmm_${name} OR NOT srcs)
    continue()
  endif()
  add_executable(kvmm_test_distributed_${name} ${srcs} ${CMAKE_CURRENT_LIST_DIR}/../support/count_new.cpp)
  target_include_directories(kvmm_test_distributed_${name} PRIVATE ${CMAKE_CURRENT_LIST_DIR}/.. ${CMAKE_CURRENT_LIST_DIR})
  target_compile_definitions(kvmm_test_distributed_${name} PRIVATE KVMM_DIST_TEST_DIR="${CMAKE_CURRENT_LIST_DIR}")
  target_link_libraries(kvmm_test_distributed_${name} PRIVATE kvmm::${name} kvmm_catch_main kvmm_warnings)
  kvmm_catch_cases(kvmm_test_distributed_${name} distributed_${name})
endforeach()
# The Redis tier's tests drive a real redis-server and inspect it with hiredis's own client.
# engine_tier_test.cpp runs two mini engines (examples/mini_engine) sharing one server.
if(TARGET kvmm_test_distributed_redis)
  target_include_directories(kvmm_test_distributed_redis PRIVATE ${KVMM_HIREDIS_INCLUDE_DIR})
  target_link_libraries(kvmm_test_distributed_redis PRIVATE ${KVMM_HIREDIS_LIBRARY})
  include(${PROJECT_SOURCE_DIR}/examples/mini_engine/engine.cmake)
  target_link_libraries(kvmm_test_distributed_redis PRIVATE mini_engine_lib)
endif()
