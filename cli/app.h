// qknorm-check's command line: the CLI11 app and its dispatch, callable from
// tests with an argument vector and output streams.
#ifndef QKNORM_CLI_APP_H_
#define QKNORM_CLI_APP_H_

#include <ostream>
#include <string>
#include <vector>

namespace qknorm::cli {

// Exit codes.
inline constexpr int kExitPass = 0;
inline constexpr int kExitFail = 1;   // some entry / the compared output FAILs
inline constexpr int kExitUsage = 2;  // bad option or option value
inline constexpr int kExitInput = 3;  // unreadable or malformed input file
inline constexpr int kExitTool = 4;   // gnuplot missing or failed (sweep)

// args[0] is the program name. Report on `out`, diagnostics on `err`;
// progress goes to stderr only when `progress` is set (main: isatty(2)).
int run_cli(const std::vector<std::string>& args, std::ostream& out,
            std::ostream& err, bool progress = false);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_APP_H_
