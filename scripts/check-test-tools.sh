#!/usr/bin/env bash
# Debian tools the tests drive: chromium (the dashboard's browser tests, through Playwright,
# whose own browser download does not work offline), strace (the broker's durability
# test watches its fsyncs) and iproute2 (the isolated nodes' namespaces and links). Use each if present; install it with apt-get if we are root;
# otherwise say exactly what to do.
set -euo pipefail
missing=0
check() {  # command, Debian package, what it is for
  local command=$1 package=$2 why=$3
  command -v "$command" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "$command not found: installing Debian's $package with apt-get (for $why)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "$package" >/dev/null 2>&1 \
      || { apt-get update -qq && apt-get install -y -qq "$package" >/dev/null; }
    command -v "$command" >/dev/null 2>&1 && return 0
  fi
  cat >&2 <<MSG
error: Debian's $package is needed (for $why), and none was found.
  expected: \`$command\` on the PATH
  hint: sudo apt-get install $package
MSG
  missing=1
}
check chromium chromium "the dashboard's browser tests"
check strace strace "the broker's durability test"
# (Without them the tests of isolated nodes skipped themselves: not every test ran.)
check ip iproute2 "the isolated nodes' network namespaces"
check tc iproute2 "the isolated nodes' bandwidth limits"
exit "$missing"
