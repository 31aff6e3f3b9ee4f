"""What Spark's interpreter wrapper runs for a process the node's zygote can fork.

``python -I -S zygote_client.py SOCKET PYTHON ARGS...``: asks the zygote listening at SOCKET
(:mod:`fogshift.runtime.zygote`) to run ``python ARGS`` with this process's environment,
working directory and standard streams, waits for it and exits as it did. If the zygote is
not there or does not take the request, this process becomes ``PYTHON ARGS`` itself.

Standard library only, and run without ``site`` (``-S``): it must start in a few
milliseconds, which is the whole point.
"""

import contextlib
import json
import os
import signal
import socket
import sys
import time


def main() -> None:
    path, python, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    _hand_over(path, args)
    os.execv(python, [python, *args])  # no child was started: be the interpreter


def _hand_over(path: str, args: list[str]) -> None:
    """Have the zygote fork ``python ARGS``; wait for it and exit as it did. Returns only
    if no child was started."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        request = {"args": args, "env": dict(os.environ), "cwd": os.getcwd()}
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        ack = conn.recv(4096)
        if not ack:
            conn.close()
            return  # refused: nothing was started
        pid = int(json.loads(ack)["pid"])
    except (OSError, ValueError, KeyError):
        conn.close()
        return
    # Spark stops this process to stop the worker: the zygote sees the connection close and
    # stops the child.
    try:
        reply = conn.recv(4096)
    except OSError:
        reply = b""
    if not reply:  # the zygote is gone: wait for the child some other way
        while _exists(pid):
            time.sleep(0.2)
        sys.exit(1)
    status = json.loads(reply)
    if "signal" in status:
        number = int(status["signal"])
        with contextlib.suppress(OSError):  # (SIGKILL's handler cannot be set: it needs none)
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    sys.exit(int(status.get("exit", 1)))


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    main()
