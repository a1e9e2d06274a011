#!/usr/bin/env bash
# expect_exit.sh EXPECTED REGEX... -- COMMAND [ARGS...]
#
# Runs COMMAND (stdout and stderr together) and passes iff both hold:
#   - its exit status is EXPECTED: a number (0, 1, 3, ...), or `signal`: the
#     process died of a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE,
#     SIGABRT; status 128 + signal), or, in a sanitizer build, the
#     sanitizer's report of it ended the process with a non-zero status;
#   - for each REGEX, some line of its output matches it (grep -E); a REGEX
#     written !REGEX: no line matches it.
# The plug-in tests (examples/plugin_c/CMakeLists.txt) assert the exit code
# and the message with it: PASS_REGULAR_EXPRESSION alone ignores the status.
set -u
usage() {
  echo "usage: $0 EXPECTED REGEX... -- COMMAND [ARGS...]" >&2
  exit 2
}
[ $# -ge 3 ] || usage
expected=$1
shift
regexes=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  regexes+=("$1")
  shift
done
[ $# -ge 2 ] && [ ${#regexes[@]} -ge 1 ] || usage
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
echo "--- exit status $rc (expected $expected)"
ok_status=0
if [ "$expected" = signal ]; then
  case $rc in
    132 | 134 | 135 | 136 | 139) ok_status=1 ;;  # SIGILL ABRT BUS FPE SEGV
    0) ;;
    *) printf '%s\n' "$out" | grep -q 'Sanitizer' && ok_status=1 ;;
  esac
elif [ "$rc" = "$expected" ]; then
  ok_status=1
fi
if [ $ok_status -ne 1 ]; then
  echo "FAIL: exit status $rc, expected $expected"
  exit 1
fi
for regex in "${regexes[@]}"; do
  if [ "${regex#!}" != "$regex" ]; then
    if printf '%s\n' "$out" | grep -E -q -- "${regex#!}"; then
      echo "FAIL: a line of the output matches: ${regex#!}"
      exit 1
    fi
    continue
  fi
  if ! printf '%s\n' "$out" | grep -E -q -- "$regex"; then
    echo "FAIL: no line of the output matches: $regex"
    exit 1
  fi
done
echo "PASS: exit status $rc; every message found"
