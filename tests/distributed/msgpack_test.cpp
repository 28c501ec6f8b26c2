// MsgpackWriter: every type in its shortest form against bytes written by hand from the
// msgpack spec, the format boundaries (fix/8/16/32-bit), no allocation into a grown
// buffer, and a mixed value decoded by python3-msgpack (an independent implementation).
#include "kvmm/distributed/detail/msgpack.hpp"
#include "dist_test_util.hpp"

#include <catch2/catch.hpp>

#include <unistd.h>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

using namespace kvmm;
using kvmm::test::hex;

namespace {

template <class F>
std::string encoded(F&& write) {
  std::vector<std::uint8_t> out;
  MsgpackWriter w(out);
  write(w);
  return hex(out);
}

}  // namespace

TEST_CASE("msgpack: scalars in their shortest form") {
  CHECK(encoded([](MsgpackWriter& w) { w.nil(); }) == "c0");
  CHECK(encoded([](MsgpackWriter& w) {
          w.boolean(false);
          w.boolean(true);
        }) == "c2c3");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(0); }) == "00");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(127); }) == "7f");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(128); }) == "cc80");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(255); }) == "ccff");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(256); }) == "cd0100");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(65535); }) == "cdffff");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(65536); }) == "ce00010000");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(0xffffffffULL); }) == "ceffffffff");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(0x100000000ULL); }) == "cf0000000100000000");
  CHECK(encoded([](MsgpackWriter& w) { w.uint(~0ULL); }) == "cfffffffffffffffff");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(5); }) == "05");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(-1); }) == "ff");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(-32); }) == "e0");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(-33); }) == "d0df");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(-128); }) == "d080");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(-129); }) == "d1ff7f");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(-32768); }) == "d18000");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(-32769); }) == "d2ffff7fff");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(std::numeric_limits<std::int32_t>::min()); }) == "d280000000");
  CHECK(encoded([](MsgpackWriter& w) { w.integer(std::int64_t{std::numeric_limits<std::int32_t>::min()} - 1); }) ==
        "d3ffffffff7fffffff");
  CHECK(encoded([](MsgpackWriter& w) { w.float64(1.5); }) == "cb3ff8000000000000");
  CHECK(encoded([](MsgpackWriter& w) { w.float64(-0.0); }) == "cb8000000000000000");
}

TEST_CASE("msgpack: str, bin, array and map length boundaries") {
  CHECK(encoded([](MsgpackWriter& w) { w.str(""); }) == "a0");
  CHECK(encoded([](MsgpackWriter& w) { w.str("abc"); }) == "a3616263");
  const std::string s31(31, 'x'), s32(32, 'x'), s256(256, 'x');
  CHECK(encoded([&](MsgpackWriter& w) { w.str(s31); }).substr(0, 2) == "bf");
  CHECK(encoded([&](MsgpackWriter& w) { w.str(s32); }).substr(0, 4) == "d920");
  CHECK(encoded([&](MsgpackWriter& w) { w.str(s256); }).substr(0, 6) == "da0100");
  CHECK(encoded([&](MsgpackWriter& w) { w.str(s256); }).size() == 2 * (3 + 256));
  const std::vector<std::byte> b3{std::byte{1}, std::byte{2}, std::byte{3}}, b256(256), b65536(65536);
  CHECK(encoded([&](MsgpackWriter& w) { w.bin(b3); }) == "c403010203");
  CHECK(encoded([&](MsgpackWriter& w) { w.bin(b256); }).substr(0, 6) == "c50100");
  CHECK(encoded([&](MsgpackWriter& w) { w.bin(b65536); }).substr(0, 10) == "c600010000");
  CHECK(encoded([](MsgpackWriter& w) { w.array_header(0); }) == "90");
  CHECK(encoded([](MsgpackWriter& w) { w.array_header(15); }) == "9f");
  CHECK(encoded([](MsgpackWriter& w) { w.array_header(16); }) == "dc0010");
  CHECK(encoded([](MsgpackWriter& w) { w.array_header(65536); }) == "dd00010000");
  CHECK(encoded([](MsgpackWriter& w) { w.map_header(15); }) == "8f");
  CHECK(encoded([](MsgpackWriter& w) { w.map_header(16); }) == "de0010");
  CHECK(encoded([](MsgpackWriter& w) { w.map_header(70000); }) == "df00011170");
  const std::vector<std::uint32_t> tokens{0, 127, 128, 65536};
  CHECK(encoded([&](MsgpackWriter& w) { w.uint_array(tokens); }) == "94007fcc80ce00010000");
}

TEST_CASE("msgpack: a reused buffer makes no reallocation once grown") {
  std::vector<std::uint8_t> out;
  out.reserve(4096);
  const auto* data = out.data();
  const std::vector<std::uint32_t> tokens(100, 70000);
  for (int round = 0; round < 100; ++round) {
    out.clear();
    MsgpackWriter w(out);
    w.map_header(2);
    w.str("tokens");
    w.uint_array(tokens);
    w.str("x");
    w.float64(round);
  }
  CHECK(out.data() == data);
  CHECK(out.size() == 1 + 7 + 3 + 100 * 5 + 2 + 9);
}

TEST_CASE("msgpack: python3-msgpack decodes a mixed value to what was written") {
  if (!kvmm::test::python_has("msgpack")) {
    WARN("SKIPPED: /usr/bin/python3 lacks msgpack (apt-get install python3-msgpack)");
    return;
  }
  std::vector<std::uint8_t> out;
  MsgpackWriter w(out);
  w.array_header(17);
  w.nil();
  w.boolean(true);
  w.uint(200);
  w.uint(70000);
  w.uint(~0ULL);
  w.integer(-5);
  w.integer(-200);
  w.integer(-3000000000LL);
  w.float64(0.25);
  w.str("BlockStored");
  w.str(std::string(40, 'k'));
  const std::vector<std::byte> b{std::byte{0}, std::byte{0xff}};
  w.bin(b);
  w.map_header(1);
  w.str("a");
  w.array_header(0);
  w.uint_array(std::vector<std::uint32_t>{1, 300});
  w.array_header(16);
  for (int i = 0; i < 16; ++i) w.uint(static_cast<std::uint64_t>(i));
  w.map_header(0);
  w.str("");
  const auto dir = std::filesystem::temp_directory_path() / ("kvmm_msgpack_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "mixed.msgpack").string();
  kvmm::test::write_file(file, out);
  int status = 0;
  const std::string got = kvmm::test::run_capture(
      std::string(kvmm::test::kPython) + " " + kvmm::test::dist_script("msgpack_check.py") + " " + file, status);
  std::filesystem::remove_all(dir);
  REQUIRE(status == 0);
  CHECK(got ==
        "[None, True, 200, 70000, 18446744073709551615, -5, -200, -3000000000, 0.25, 'BlockStored', '" +
            std::string(40, 'k') +
            "', b'\\x00\\xff', {'a': []}, [1, 300], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], {}, '']\n");
}
