// kvmm::read_hf_config_file against hostile files (issue 29 item 4): files past the size
// limit, files that are not regular (a directory, /dev/zero, a FIFO), empty, truncated at
// every byte and non-UTF-8 files each raise kvmm::Error naming the path (and the size or
// the field), quickly and without reading more than the limit; the real configs read.
#include <kvmm/error.hpp>
#include <kvmm/spec/hf_config.hpp>

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include "support/error_of.hpp"

using namespace kvmm;
using kvmm::test::error_of;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch directory for the test's files, removed at the end.
struct TempDir {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kvmm_hf_config_" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(dir); }
  ~TempDir() { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string path = (dir / name).string();
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return path;
  }
};

bool printable_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

const std::string kLlama8b = std::string(KVMM_TEST_DATA_DIR) + "/llama-3.1-8b.config.json";

}  // namespace

TEST_CASE("hf config file: not regular, too large or empty files are refused naming the path",
          "[spec][hf_config][errors][hostile]") {
  const TempDir tmp;
  CHECK_THAT(error_of([&] { read_hf_config_file(tmp.dir.string()); }),
             Catch::Contains("config file = '" + tmp.dir.string() + "': not a regular file (a directory)"));
  CHECK_THAT(error_of([] { read_hf_config_file("/dev/zero"); }),
             Catch::Contains("config file = '/dev/zero': not a regular file (a character device)"));
  const std::string fifo = (tmp.dir / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // opening it must not wait for a writer
  CHECK_THAT(error_of([&] { read_hf_config_file(fifo); }),
             Catch::Contains("config file = '" + fifo + "': not a regular file (a FIFO)"));
  // One byte past the limit (sparse: no disk used), and far past it.
  const std::string big = tmp.write("big.json", "");
  std::filesystem::resize_file(big, kMaxHfConfigBytes + 1);
  CHECK_THAT(error_of([&] { read_hf_config_file(big); }),
             Catch::Contains(fmt::format("config file = '{}': {} bytes, over the limit of {} bytes", big,
                                         kMaxHfConfigBytes + 1, kMaxHfConfigBytes)));
  std::filesystem::resize_file(big, std::uint64_t{1} << 40);
  CHECK_THAT(error_of([&] { read_hf_config_file(big); }), Catch::Contains("1099511627776 bytes, over the limit"));
  // The same limit for text in memory; a config padded to exactly the limit still reads.
  const std::string good = slurp(kLlama8b);
  std::string padded = good + std::string(kMaxHfConfigBytes - good.size(), ' ');
  CHECK(read_hf_config(padded, "padded.json").layers.size() == 32);
  CHECK(read_hf_config_file(tmp.write("padded.json", padded)).layers.size() == 32);
  padded += ' ';
  CHECK_THAT(error_of([&] { read_hf_config(padded, "padded.json"); }),
             Catch::Contains(fmt::format("padded.json: {} bytes, over the limit of {} bytes", kMaxHfConfigBytes + 1,
                                         kMaxHfConfigBytes)));
  const std::string empty = tmp.write("empty.json", "");
  CHECK_THAT(error_of([&] { read_hf_config_file(empty); }), Catch::StartsWith(empty + ":1:1: malformed JSON"));
  CHECK_THAT(error_of([] { read_hf_config_file("/nonexistent/config.json"); }),
             Catch::Contains("config file = '/nonexistent/config.json': cannot open the file"));
  CHECK(read_hf_config_file(kLlama8b).layers.size() == 32);
}

TEST_CASE("hf config file: a real config truncated at every byte is refused naming the path",
          "[spec][hf_config][errors][hostile]") {
  const TempDir tmp;
  const std::string good = slurp(kLlama8b);
  REQUIRE(good.size() > 500);
  const std::string path = (tmp.dir / "cut.json").string();
  const std::size_t end = good.rfind('}');  // every cut before the closing brace is incomplete
  std::size_t named = 0;
  for (std::size_t cut = 0; cut < end; ++cut) {
    tmp.write("cut.json", good.substr(0, cut));
    INFO("cut at " << cut);
    const std::string e = error_of([&] { read_hf_config_file(path); });
    REQUIRE_THAT(e, Catch::StartsWith(path + ":"));
    REQUIRE_THAT(e, Catch::Contains("malformed JSON"));
    REQUIRE(printable_ascii(e));
    named += e.find("(field '") != std::string::npos;
  }
  CHECK(named > end / 2);  // cuts inside the object name the field being read
}

TEST_CASE("hf config file: non-UTF-8 bytes are refused naming the field, in a printable message",
          "[spec][hf_config][errors][hostile]") {
  const TempDir tmp;
  const std::vector<std::string> bytes{"\xff", "\xc0\xaf", "\x80", "\xed\xa0\x80", "\xf5\x80\x80\x80", "\xe2\x82"};
  for (const std::string& b : bytes) {
    // In a string value of an unchecked field, in model_type, in a key, outside strings.
    const std::vector<std::pair<std::string, std::string>> files{
        {R"({"model_type": "llama", "torch_dtype": "bf)" + b + "\"}", "(field 'torch_dtype')"},
        {R"({"model_type": "lla)" + b + "ma\"}", "(field 'model_type')"},
        {R"({"model_type": "llama", "rope)" + b + "\": 1}", "(field 'rope"},
        {R"({"model_type": "llama", "rope_theta": )" + b + "}", "(field 'rope_theta')"},
        {b + "{}", "malformed JSON"},
    };
    for (const auto& [text, expect] : files) {
      const std::string path = tmp.write("utf8.json", text);
      INFO(text);
      const std::string e = error_of([&] { read_hf_config_file(path); });
      CHECK_THAT(e, Catch::StartsWith(path + ":1:"));
      CHECK_THAT(e, Catch::Contains("malformed JSON"));
      CHECK_THAT(e, Catch::Contains(expect));
      CHECK(printable_ascii(e));
    }
  }
  // Valid UTF-8 beyond ASCII is fine where the reader does not look.
  CHECK(read_hf_config(R"({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 2,
      "hidden_size": 64, "name": "模型 ✓"})",
                       "c.json")
            .layers.size() == 2);
}
