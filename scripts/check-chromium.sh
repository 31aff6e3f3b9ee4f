#!/usr/bin/env bash
# The dashboard's browser tests drive Debian's chromium through Playwright (Playwright's own
# browser download does not work offline). Use it if present; install it with apt-get if we
# are root; otherwise say exactly what to do.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "chromium not found: installing Debian's chromium with apt-get (for the dashboard's browser tests)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq chromium >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
  command -v chromium >/dev/null 2>&1 && exit 0
fi
cat >&2 <<'MSG'
error: the dashboard's browser tests need Debian's chromium, and none was found.
  expected: `chromium` on the PATH (/usr/bin/chromium)
  hint: sudo apt-get install chromium
MSG
exit 1
