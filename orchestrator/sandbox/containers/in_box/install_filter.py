# In the box, first thing in every call (programs.INSTALL, then the guard): no_new_privs, then seccomp.py's
# filter, as bytes the host fills in at import. Runs as /usr/bin/python3 -I of the sandbox image (3.11).
import ctypes
import struct

_prog = bytes.fromhex("__FILTER_HEX__")
_buf = ctypes.create_string_buffer(_prog, len(_prog))
_fprog = struct.pack("HxxxxxxP", len(_prog) // 8, ctypes.addressof(_buf))
_libc = ctypes.CDLL(None, use_errno=True)
if _libc.prctl(38, 1, 0, 0, 0) != 0 or _libc.prctl(22, 2, ctypes.c_char_p(_fprog), 0, 0) != 0:
    import os
    import sys

    sys.stderr.write(f"wakeloop: cannot install the seccomp filter: {os.strerror(ctypes.get_errno())}\n")
    os._exit(126)
