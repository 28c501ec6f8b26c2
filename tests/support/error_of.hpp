// error_of(f): the kvmm::Error message f raises, or "no error": tests compare messages of
// calls that must fail.
#pragma once

#include "kvmm/error.hpp"

#include <string>

namespace kvmm::test {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace kvmm::test
