// What the fuzz targets assert: FUZZ_CHECK(cond) prints the condition and aborts, so that
// libFuzzer (and the replayer under ctest) report the input as a finding. error_message_ok
// is the rule for every kvmm::Error a hostile input raises: short, printable ASCII.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (false)

namespace kvmm::test {

inline bool error_message_ok(std::string_view m) {
  if (m.empty() || m.size() > 2048) return false;
  for (const char c : m)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

}  // namespace kvmm::test
