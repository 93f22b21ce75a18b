"""The safe-I/O base: how wakeloop reads and writes a file another may have planted.

folder.py (the one walk of an agent folder: every host-side read, write and
delete there, no link followed, never a FIFO or device, capped), atomic.py
(a whole file replaced or not at all; advisory locks), jsontext.py (JSON read
back, a nesting bomb refused), yamlfile.py (every config file read as
untrusted YAML, with each key's line), secrets.py (the one list of secret
variables: never written, never expanded, never handed on), shown.py
(another's text as a person reads it, every hidden character written out).

The bottom layer: imports nothing of wakeloop's but errors.py. Every layer
above stands on it: records/ (what each file holds), policy/ and notify/
(their YAML), the leaves.

Not here: what any file holds (records/), what a key means (policy/, notify/).
"""
