// The seed-corpus generators' shared command line and file handling:
//   GENERATOR OUT_DIR        writes every seed below OUT_DIR
//   GENERATOR --check DIR    exits 1 unless every seed is in DIR byte for byte
#ifndef QKNORM_FUZZ_SEED_FILES_H_
#define QKNORM_FUZZ_SEED_FILES_H_

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

namespace qknorm::fuzz {

struct SeedCommand {
  bool check = false;
  std::filesystem::path dir;
};

// The command line, or nullopt (after the usage line on stderr).
inline std::optional<SeedCommand> parse_seed_command(int argc, char** argv) {
  const bool check = argc == 3 && std::string(argv[1]) == "--check";
  if (argc != 2 && !check) {
    std::fprintf(stderr, "usage: %s OUT_DIR | --check DIR\n", argv[0]);
    return std::nullopt;
  }
  return SeedCommand{check, argv[argc - 1]};
}

// Writes `bytes` to `path`, creating its folder; with `check`, compares
// them with the file instead. False (said on stderr) if the check finds the
// file missing or different.
inline bool write_or_check_seed(const std::filesystem::path& path,
                                std::string_view bytes, bool check) {
  if (check) {
    std::ifstream in(path, std::ios::binary);
    const std::string have{std::istreambuf_iterator<char>(in),
                           std::istreambuf_iterator<char>()};
    if (!in.is_open() || have != bytes) {
      std::fprintf(stderr, "out of date: %s\n", path.c_str());
      return false;
    }
    return true;
  }
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return true;
}

}  // namespace qknorm::fuzz

#endif  // QKNORM_FUZZ_SEED_FILES_H_
