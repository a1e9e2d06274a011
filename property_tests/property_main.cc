// main() of qknorm_property_test (issue 17): `--plugin <path>` or
// `--plugin=<path>` (repeatable) loads a plug-in (include/qknorm/plugin.h)
// whose entries then join the registry, and every property runs on them like
// on our own entries; QKNORM_PLUGIN=<path>[:<path>...] does the same
// (all_backends() reads it). The plug-ins load before InitGoogleTest, which
// instantiates the parameterized tests from the registry. Every other
// argument is GoogleTest's (--gtest_filter, --gtest_output=xml:<file>, ...).
// `--isolate` runs every plug-in call in a child process, as qknorm-check's
// --isolate does (include/qknorm/plugin_loader.h): a crash inside the
// plug-in fails that property, named ("crashed with signal 11 (SIGSEGV) in
// attention_backward ..."), and the suite goes on (issue 35).
#include <gtest/gtest.h>

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "qknorm/plugin_loader.h"

int main(int argc, char** argv) {
  constexpr std::string_view kFlag = "--plugin", kFlagEq = "--plugin=";
  std::vector<std::string> plugins;
  std::vector<char*> args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == kFlag) {
      if (i + 1 == argc) {
        std::fprintf(stderr, "%s: --plugin needs a path\n", argv[0]);
        return 2;
      }
      plugins.emplace_back(argv[++i]);
    } else if (a == "--isolate") {
      qknorm::set_plugin_isolation(true);
    } else if (a.starts_with(kFlagEq)) {
      plugins.emplace_back(a.substr(kFlagEq.size()));
    } else {
      args.push_back(argv[i]);
    }
  }
  for (const std::string& path : plugins) {
    if (path.empty()) {
      std::fprintf(stderr, "%s: --plugin needs a path\n", argv[0]);
      return 2;
    }
    try {
      qknorm::load_plugin(path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
      return 2;
    }
  }
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  testing::InitGoogleTest(&n, args.data());
  return RUN_ALL_TESTS();
}
