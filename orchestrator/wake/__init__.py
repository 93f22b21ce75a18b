"""The life of one wake: context in, model turns, tool calls, journal check.

loop.py (the wake, top to bottom, and its receipt), model.py (the Messages
API and the dry-run script), context.py (system prompt and first message),
tools.py (the registry the model is offered and each tool's handler),
task_tools.py (complete_task), journal_stub.py (the journal stub, appended from
inside a box). The host reads workspace files through sandbox/disks/workspace_reads.py only.

Imports broker/client.py, sandbox/, policy/ and records/; never fleet/.
"""
