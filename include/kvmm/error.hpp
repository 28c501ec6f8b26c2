// kvmm::Error: raised for configuration mistakes and API misuse (unknown request,
// double free, bad layout). Hot paths never throw for lack of memory: they return
// false / std::nullopt instead. A raising call leaves the object's state unchanged.
#pragma once

#include "kvmm/types.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace kvmm {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Formats and throws; kept out of line of the caller's hot path by [[gnu::cold]].
template <typename... Args>
[[noreturn, gnu::cold]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kvmm

// A row formats as its index (messages say "row 3").
template <>
struct fmt::formatter<kvmm::Row> : fmt::formatter<std::uint32_t> {
  auto format(kvmm::Row r, format_context& ctx) const { return fmt::formatter<std::uint32_t>::format(r.index, ctx); }
};
