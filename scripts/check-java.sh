#!/usr/bin/env bash
# PySpark 4.3 needs Java 17. Use it if present; install it with apt-get if we are root;
# otherwise say exactly what to do.
set -euo pipefail
java_major() {
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
if command -v java >/dev/null 2>&1 && [ "$(java_major)" -ge 17 ] 2>/dev/null; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Java 17 not found: installing openjdk-17-jre-headless with apt-get" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  command -v java >/dev/null 2>&1 && [ "$(java_major)" -ge 17 ] && exit 0
fi
cat >&2 <<'MSG'
error: fogshift needs Java 17 (PySpark 4.3 runs on it), and none was found.
  expected: `java -version` reporting 17 or newer
  hint: sudo apt-get install openjdk-17-jre-headless   (or set JAVA_HOME to a JDK 17)
MSG
exit 1
