#!/usr/bin/env bash
# PySpark 4.3 needs Java 17. Use it if present; install it with apt-get if we are root;
# otherwise say exactly what to do.
set -euo pipefail
# The java Spark runs: $JAVA_HOME's when it is set (the one on the PATH was checked, another
# started).
java=java
if [ -n "${JAVA_HOME:-}" ]; then java="$JAVA_HOME/bin/java"; fi
java_major() {
  "$java" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
have_javac() {
  command -v javac >/dev/null 2>&1 || [ -x "${JAVA_HOME:-/nonexistent}/bin/javac" ]
}
if command -v "$java" >/dev/null 2>&1 && [ "$(java_major)" -ge 17 ] 2>/dev/null; then
  # The JDK's javac compiles fogshift's few JVM classes (fogshift/runtime/jvm_classes.py);
  # without it sessions run, only with more CPU per micro-batch.
  if ! have_javac && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "javac not found: installing openjdk-17-jdk-headless with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq openjdk-17-jdk-headless >/dev/null 2>&1 \
      || { apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless >/dev/null; } \
      || echo "warning: could not install openjdk-17-jdk-headless; fogshift runs without its JVM classes" >&2
  fi
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Java 17 not found: installing openjdk-17-jdk-headless with apt-get" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless >/dev/null
  command -v "$java" >/dev/null 2>&1 && [ "$(java_major)" -ge 17 ] && exit 0
fi
if command -v "$java" >/dev/null 2>&1; then
  seen=$("$java" -version 2>&1 | head -n 1)
else
  seen="no $java"
fi
cat >&2 <<MSG
error: fogshift needs Java 17 (PySpark 4.3 runs on it), and none was found.
  expected: \`$java -version\` reporting 17 or newer
  received: $seen
  hint: sudo apt-get install openjdk-17-jdk-headless   (or set JAVA_HOME to a JDK 17)
MSG
exit 1
