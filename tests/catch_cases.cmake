# kvmm_catch_cases(<target> <prefix>): registers every Catch2 test case of <target> as its
# own ctest entry "<prefix>/<case name>" (label <prefix>), so ctest reports which case
# failed, runs the cases of one binary in parallel, and `ctest -R` / `-L` pick cases or a
# layer. The case list is read from the built binary (--list-test-names-only) after each
# link by tests/catch_list.cmake, so adding a TEST_CASE needs no re-configure. Cost: one
# process start per case (~350 cases; see scripts/test.sh for the stage times).
#
# Written for kvmm rather than Catch2's catch_discover_tests: Catch2 2.13's list parsing
# splits a case name at ';' (several of ours have one) and registers a case that matches
# nothing as passed. Here every case runs with --warn NoTests, so a name that fails to
# round-trip fails its entry.
set(KVMM_CATCH_LIST_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/catch_list.cmake)

function(kvmm_catch_cases target prefix)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${target}_cases.cmake)
  add_custom_command(
    TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D EXE=$<TARGET_FILE:${target}> -D PREFIX=${prefix} -D OUT=${out}
            -D WORKDIR=${CMAKE_CURRENT_BINARY_DIR} -P ${KVMM_CATCH_LIST_SCRIPT}
    BYPRODUCTS ${out}
    VERBATIM)
  # ctest reads the list when it runs; before the first build it names the missing binary.
  set(inc ${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake)
  file(WRITE ${inc}
       "if(EXISTS \"${out}\")\n  include(\"${out}\")\nelse()\n"
       "  add_test(${prefix}_NOT_BUILT ${prefix}_NOT_BUILT)\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${inc})
endfunction()
