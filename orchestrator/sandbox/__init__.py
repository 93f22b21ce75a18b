"""The box: every tool call in a fresh, hardened, disposable container.

box.py (the Sandbox protocol every backend meets, SandboxResult,
SandboxError), engine.py (the Docker backend: container settings, one call
start to removal, the host-side deadline), pool.py (containers started ahead),
oom.py (a box's count of OOM kills, read on the host),
programs.py (every program of ours that runs inside a box: the seccomp guard,
the pool's launcher, the write script, the netns holder; the Python ones are
files in in_box/), seccomp.py (the
guard's filter: io_uring and set-id modes refused, per syscall ABI, and the
small BPF assembler it is written with), network.py (the
allowlist network and its proxy), output.py (cleaning and capping what a
command prints), images.py (building the sandbox image), explain.py (the
settings of each call as `docker run` flags), policy_check.py (whether the
engine has what a policy asks: image, runtime, cpus).

Imports policy/ and records/ at most; never broker/, wake/ or fleet/.
"""
