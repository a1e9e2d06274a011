// Loading plug-ins (include/qknorm/plugin.h, issue 17): a shared library's
// entries join the registry every tool iterates (qknorm::all_backends()), so
// qknorm-check, the property suite, sweeps, power and the fuzzers judge them
// like our own. Entries are named "plugin:<plugin>.<entry>:<precision>".
#ifndef QKNORM_PLUGIN_LOADER_H_
#define QKNORM_PLUGIN_LOADER_H_

#include <string>

#include "qknorm/backend.h"

namespace qknorm {

// dlopens `path`, checks its descriptor and adds its entries to
// all_backends(). Loading a path already loaded does nothing. Throws Error
// naming the path on any failure: the library cannot be opened, it exports
// no qknorm_plugin_get, it declares an ABI version this build does not know,
// or its descriptor breaks a rule (a missing required function, a bad name,
// an unknown dtype, a duplicate entry). Call it before anything caches the
// registry's entries (gtest's parameterized instantiation, a fuzzer's first
// input).
void load_plugin(const std::string& path);

// The same, into `r` (all_backends() uses it for QKNORM_PLUGIN).
void load_plugin_into(Registry& r, const std::string& path);

// Every path of the environment variable QKNORM_PLUGIN (':'-separated) into
// `r`; all_backends() calls it once, on first use. With QKNORM_ISOLATE set
// (and not "0") it also turns isolation on (set_plugin_isolation below):
// the fuzzers' way to --isolate.
void load_plugins_from_env(Registry& r);

// --isolate: run every plug-in call in a child process (fork). A crash,
// a signal or an exit in the call is then reported as that entry's Error
// naming the entry, the call and the problem, and the run goes on. Off by
// default: a crash then ends the process, after a message on stderr naming
// the entry, the call and the problem.
void set_plugin_isolation(bool on);
bool plugin_isolation();

}  // namespace qknorm

#endif  // QKNORM_PLUGIN_LOADER_H_
