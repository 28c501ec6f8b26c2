// The main of a fuzz target built without libFuzzer: runs LLVMFuzzerTestOneInput once on
// each file named on the command line (directories: each regular file in them, sorted),
// so ctest replays the seed corpus and every saved regression input under the build's own
// compiler and sanitizers. Fails when a path is missing or nothing was run.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::size_t runs = 0;
  for (int a = 1; a < argc; ++a) {
    std::vector<fs::path> files;
    const fs::path arg = argv[a];
    if (fs::is_directory(arg)) {
      for (const auto& e : fs::directory_iterator(arg))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    } else if (fs::is_regular_file(arg)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s: no such file or directory\n", argv[a]);
      return 2;
    }
    for (const fs::path& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++runs;
    }
  }
  std::printf("replay: %zu inputs, no finding\n", runs);
  return runs > 0 ? 0 : 2;
}
