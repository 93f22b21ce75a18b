"""The life of one wake: context in, model turns, tool calls, journal check.

loop.py (the wake, top to bottom, and its receipt), stop_reasons.py (what a
model turn's stop reason leads to; the wrap-up turn's note), tool_step.py (one
tool call, run and recorded), tally.py (what a wake counts), changes.py (the
wake's transaction on the workspace, as the wake sees it), journal_stub.py (the
journal trace, appended from inside a box), progress.py (the progress lines),
model.py (the Messages API and the dry-run script), context.py (system prompt
and first message), tools.py (the registry the model is offered and each tool's
handler), task_tools.py (complete_task), approval_gate.py (calls that wait for
a person), ratelimit.py (the key's rate-limit gate), one_call.py (a call
outside any wake). The host reads workspace files through sandbox/disks/workspace_reads.py only.

Imports broker/client.py, sandbox/, policy/ and records/; never fleet/.
"""
