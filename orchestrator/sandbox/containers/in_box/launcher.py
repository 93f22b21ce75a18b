# In a pooled box, idling in place of the command until the host hands one over (programs.LAUNCHER).
# Runs as /usr/bin/python3 -I of the sandbox image (3.11), under the guard.
import ctypes
import json
import os
import subprocess

if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
    os._exit(125)


def read_exact(n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            os._exit(125)
        data += chunk
    return data


def ooms() -> str:
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return "1" if int(line.split()[1]) else "0"
        except (OSError, ValueError):
            pass
    return "?"


def ours(source: str, args: list[str]) -> int:
    # One of our Python programs (env None: write_file's script), run here: one
    # interpreter start fewer on the call's path. Its exit is a subprocess's would be.
    import sys
    import traceback

    sys.argv = ["-c", *args]
    try:
        exec(compile(source, "<string>", "exec"), {"__name__": "__main__"})
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code & 0xFF


os.write(1, b"\0wakeloop:ready\n")
spec = json.loads(read_exact(int.from_bytes(read_exact(8), "big")))
os.chdir(spec["cwd"])
argv, env = spec["argv"], spec["env"]
if env is None and argv[:3] == ["/usr/bin/python3", "-I", "-c"] and len(argv) > 3:
    code = ours(argv[3], argv[4:])
elif argv[0].startswith("/"):
    try:
        code = subprocess.Popen(
            [argv[0] if env is None else os.path.basename(argv[0]), *argv[1:]],
            executable=argv[0],
            env=env,
            stdin=None if spec["stdin"] else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            close_fds=True,
            restore_signals=False,
        ).wait()
    except OSError:
        code = 127
    code = 128 - code if code < 0 else code
else:
    os.write(1, b"wakeloop: not an absolute path: %s\n" % argv[0].encode())
    code = 127
try:
    os.kill(-1, 9)  # what the command left running ends before the caller hears it is done
except ProcessLookupError:
    pass
os.set_blocking(1, True)  # the command may have left the shared pipe non-blocking
os.write(1, b"\0wakeloop:%s:%03d:%s\n" % (spec["end"].encode(), code, ooms().encode()))
