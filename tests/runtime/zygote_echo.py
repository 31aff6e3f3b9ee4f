"""A module a test zygote serves: reports what it was given, then does what argv says."""

import json
import os
import signal
import sys
import time

if __name__ == "__main__":
    mode = sys.argv[1]
    line = sys.stdin.readline().strip() if mode == "echo" else ""
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(),
                      "marker": os.environ.get("ZYGOTE_TEST_MARKER"), "stdin": line}),
          flush=True)  # fmt: skip
    print("to stderr", file=sys.stderr, flush=True)
    if mode == "signal":
        os.kill(os.getpid(), signal.SIGTERM)
    if mode == "sleep":
        time.sleep(600)
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
