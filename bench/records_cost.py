"""What the transcript and the notification queue add to a wake, per step.

    .venv/bin/python -m bench.records_cost [--steps 200]

A step of a wake writes two transcript lines (the model's reply with a
tool_use, then the tool's result as the model saw it: here 2 KB of output,
the size of a typical `ls -la` or test run) with the writes the loop does
(records/transcript.py: one O_APPEND write each, scrubbed). A notification
is queued only on send_message or at a wake's end, not every step: its cost
is one item written atomically (fsync, rename, fsync of the folder), shown
per notification. Both run on this host's state/ filesystem, no engine.

The orchestrator's own overhead per step (wake_cost.orchestrator_overhead)
already includes the transcript since it landed; run.py shows both rows.
Not here: the loop's overhead (wake_cost.py), delivery (network-bound,
off the wake's path by design).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import Stats, stats
from orchestrator.notify import outcomes
from orchestrator.notify.config import Channel
from orchestrator.records.transcript import Transcript

OUTPUT_CHARS = 2000  # a tool result's text, as the model saw it
STEPS = 200


def transcript_per_step(tmp: Path, steps: int = STEPS) -> Stats:
    t = Transcript(tmp, "bench", 1 << 30, ("sk-ant-bench-secret-value",))
    samples = []
    for step in range(1, steps + 1):
        started = time.perf_counter()
        t.add(
            "assistant",
            step=step,
            content=[
                {"type": "text", "text": "Looking at the tests next."},
                {
                    "type": "tool_use",
                    "id": f"toolu_{step}",
                    "name": "bash",
                    "input": {"command": "pytest -q tests/ 2>&1 | tail -40"},
                },
            ],
            stop_reason="tool_use",
            usage={"input_tokens": 1200, "output_tokens": 80},
            usd_so_far=0.01,
        )
        t.add(
            "tool_result",
            step=step,
            id=f"toolu_{step}",
            tool="bash",
            text="x" * OUTPUT_CHARS,
            is_error=False,
            exit_code=0,
            duration_ms=420,
        )
        samples.append((time.perf_counter() - started) * 1000)
    return stats(samples)


def queue_per_notification(tmp: Path, n: int = 50) -> Stats:
    channel = Channel("webhook", "https://hooks.example.com/T000/B000", frozenset({"message"}))
    samples = []
    for i in range(n):
        note = outcomes.payload("bench", "message", f"run/message/{i}", "bench says", "hello " * 50, "run")
        started = time.perf_counter()
        outcomes.emit(tmp, (channel,), note)
        samples.append((time.perf_counter() - started) * 1000)
    return stats(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wakeloop-bench-records-") as tmp:
        per_step = transcript_per_step(Path(tmp) / "t", args.steps)
        per_note = queue_per_notification(Path(tmp) / "q")
    print(f"transcript, per step (2 lines, {OUTPUT_CHARS:,}-char result), median / p90: {per_step.cell()}")
    print(f"queue, per notification queued (send_message, wake end), median / p90: {per_note.cell()}")


if __name__ == "__main__":
    main()
