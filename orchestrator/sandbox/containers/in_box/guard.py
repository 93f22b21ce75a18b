# In the box, after install_filter.py in the same program (programs.GUARD): becomes, or waits for, the call's
# program. Runs as /usr/bin/python3 -I of the sandbox image (3.11); the host fills in the marked names.
import json
import os
import stat
import sys

os.dup2(1, 2)
ca = os.environ.pop("__CA_ENV__", None)
if ca:  # the allowlist proxy's CA: Debian's store plus it, where the command's CA variables point
    try:
        with open("/etc/ssl/certs/ca-certificates.crt", "rb") as store:
            trusted = store.read()
    except OSError:
        trusted = b""
    fd = os.open("__CA_FILE__", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    os.write(fd, trusted + b"\n" + ca.encode())
    os.close(fd)
env = os.environ.pop("__COMMAND_ENV__", None)
if not sys.argv[1].startswith("/"):
    sys.stderr.write(f"wakeloop: not an absolute path: {sys.argv[1]}\n")
    os._exit(127)
if env is None and sys.argv[1:] == ["__LAUNCH_ARGV__"]:
    # The pool's launcher: run here, in this interpreter, not a second one (programs.GUARD says why).
    exec(os.environ.pop("__LAUNCHER_ENV__"), {"__name__": "__main__"})
    os._exit(0)
if env is None:
    os.execv(sys.argv[1], sys.argv[1:])
held = stat.S_ISFIFO(os.fstat(0).st_mode)
pid = os.fork()
if pid == 0:
    try:
        if held:
            os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        os.execve(sys.argv[1], [os.path.basename(sys.argv[1]), *sys.argv[2:]], json.loads(env))
    finally:
        os._exit(127)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
code = 128 - code if code < 0 else code
try:
    os.kill(-1, 9)  # as the launcher: nothing the command started outlives the call
except ProcessLookupError:
    pass
if held:
    os.set_blocking(1, True)  # the command may have left the shared pipe non-blocking
    os.write(1, b"\0wakeloop:__HELD__:%03d:?\n" % code)
    while os.read(0, 4096):
        pass
os._exit(code)
