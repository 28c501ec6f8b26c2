# The docs' marked C++ blocks (```cpp snippet=NAME) compiled against kvmm and run, one
# ctest entry each (snippet_NAME): scripts/doc_snippets.py extracts them at build time into
# <build>/tests/snippets/NAME.cpp, after tests/snippets/NAME.hpp (their harness). A doc edit
# that breaks a snippet fails the build, at the doc's line. Cost: one small program each.
find_package(Python3 COMPONENTS Interpreter REQUIRED)
set(KVMM_SNIPPET_SCRIPT ${PROJECT_SOURCE_DIR}/scripts/doc_snippets.py)
file(GLOB KVMM_SNIPPET_DOCS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
list(PREPEND KVMM_SNIPPET_DOCS ${PROJECT_SOURCE_DIR}/README.md)
# The names decide the targets, so a doc edit re-runs this listing (a configure step).
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${KVMM_SNIPPET_DOCS} ${KVMM_SNIPPET_SCRIPT})
execute_process(
  COMMAND ${Python3_EXECUTABLE} ${KVMM_SNIPPET_SCRIPT} --list ${KVMM_SNIPPET_DOCS}
  OUTPUT_VARIABLE names
  RESULT_VARIABLE rc
  ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "scripts/doc_snippets.py --list failed: ${err}")
endif()
string(REGEX MATCHALL "[A-Za-z0-9_]+" names "${names}")
set(dir ${CMAKE_CURRENT_BINARY_DIR}/snippets)
set(outs "")
foreach(n ${names})
  list(APPEND outs ${dir}/${n}.cpp)
endforeach()
add_custom_command(
  OUTPUT ${outs}
  COMMAND ${Python3_EXECUTABLE} ${KVMM_SNIPPET_SCRIPT} --out ${dir} ${KVMM_SNIPPET_DOCS}
  DEPENDS ${KVMM_SNIPPET_DOCS} ${KVMM_SNIPPET_SCRIPT}
  COMMENT "extracting the docs' C++ snippets"
  VERBATIM)
foreach(n ${names})
  add_executable(kvmm_snippet_${n} ${dir}/${n}.cpp)
  target_include_directories(kvmm_snippet_${n} PRIVATE ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(kvmm_snippet_${n} PRIVATE kvmm::kvmm kvmm_warnings)
  # A doc's block may end by naming a result it does not use (`RequestId r = ...`).
  target_compile_options(kvmm_snippet_${n} PRIVATE -Wno-unused-variable)
  add_test(NAME snippet_${n} COMMAND kvmm_snippet_${n})
endforeach()
