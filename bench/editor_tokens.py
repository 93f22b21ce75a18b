"""What Claude's text editor saves over write_file: one scripted editing task done both ways.

The task: change five lines across three 2,000-line files (two in the
first, two in the second, one in the third: FILES, CHANGES). The model is scripted at the wire (the real loop and
SDK against testing/fakeapi.py; its usage from its own token estimate, 4
characters a token, and its prompt-cache model), the tools run in real boxes:

- write_file: each file read whole (`bash cat`), then written whole with its
  lines changed: 3 reads and 3 writes;
- text editor: one `bash grep -n` finds the five lines, then five
  `str_replace` calls, each naming its one line (text_editor_20250728).

Both end with the same files (checked). Per wake: tokens sent (input, cache
reads and writes: everything the model is sent), tokens received (output:
what the model writes), wall time; medians of --wakes wakes each, side by
side, then what the editor saves.

    .venv/bin/python -m bench.editor_tokens [--wakes 5] [--runtime runc]

Not here: the tools (wake/editor_tool.py), the per-call cost of a box (per_call.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.common import LiveEnv, bench_agent, check_receipt, cleanup, fake_api, own_disks, say, stats, step_of

LINES = 2000  # lines in each file
FILES = ("a.py", "b.py", "c.py")
CHANGES = (("a.py", 120), ("a.py", 1710), ("b.py", 333), ("b.py", 1999), ("c.py", 1000))  # (file, line), 1-based
BASH_CHARS = 400_000  # the write_file way reads whole files through bash: its output cap must hold one


def line_text(name: str, n: int) -> str:
    return f"    value_{name[0]}_{n:04d} = compute({n}, scale=0.5)  # step {n}"


def original(name: str) -> str:
    return "".join(line_text(name, n) + "\n" for n in range(1, LINES + 1))


def changed(line: str) -> str:
    return line.replace("scale=0.5", "scale=0.75")


def edited(name: str) -> str:
    rows = original(name).splitlines(keepends=True)
    for file, n in CHANGES:
        if file == name:
            rows[n - 1] = changed(rows[n - 1])
    return "".join(rows)


def with_write_file(step: int):
    """Read a file whole, then write it whole: two steps a file."""
    name = FILES[step // 2]
    if step % 2 == 0:
        return "bash", {"command": f"cat {name}"}
    return "write_file", {"path": name, "content": edited(name)}


def with_editor(step: int):
    """Find the five lines, then one str_replace each."""
    if step == 0:
        pattern = "|".join(f"_{n:04d} " for _, n in CHANGES)
        return "bash", {"command": f"grep -nE '{pattern}' {' '.join(FILES)}"}
    name, n = CHANGES[step - 1]
    old = line_text(name, n)
    return "str_replace_based_edit_tool", {
        "command": "str_replace",
        "path": f"/workspace/{name}",
        "old_str": old,
        "new_str": changed(old),
    }


WAYS = {"write_file": (with_write_file, 6), "text editor": (with_editor, 6)}


def one_wake(tmp: Path, way: str, runtime: str, n: int) -> dict:
    from orchestrator.testing.fakeapi import text, tool_use, turn
    from orchestrator.wake.loop import wake

    tools, calls = WAYS[way]
    agent = bench_agent(
        tmp / f"{way.replace(' ', '_')}-{n}",
        {
            "budget": {"max_steps": calls + 3, "max_tokens_per_wake": 10**7, "max_usd_per_wake": 100},
            "tools": {"bash": {"max_output_chars": BASH_CHARS}},
            "sandbox": {"runtime": runtime},
        },
    )
    st = agent.workspace.stat()
    for name in FILES:
        path = agent.workspace / name
        path.write_text(original(name))
        os.chown(path, st.st_uid, st.st_gid)

    def script(rec):
        step = step_of(rec.body)
        if step >= calls:
            return turn(text("Done: five lines changed."))
        name, args = tools(step)
        return turn(tool_use(name, args))

    with LiveEnv(fake_api(script, one_at_a_time=True)):
        started = time.perf_counter()
        receipt = wake(agent, live=True)
        seconds = time.perf_counter() - started
    check_receipt(receipt, way)
    if receipt.tool_calls != calls:
        raise SystemExit(f"bench: {way}: {receipt.tool_calls} tool calls, expected {calls}")
    _check_files(agent, way)
    u = receipt.usage
    return {
        "sent": u.input_tokens + u.cache_read_tokens + u.cache_write_tokens,
        "received": u.output_tokens,
        "seconds": seconds,
        "steps": receipt.steps,
    }


def _check_files(agent, way: str) -> None:
    """The files as the wake committed them, read back through a box (the disk is the broker's or ours)."""
    from orchestrator.sandbox.engine import DockerSandbox

    with DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name) as box:
        for name in FILES:
            got = box.run(f"cat {name}", timeout_s=60, max_output_chars=BASH_CHARS).output
            if got != edited(name):
                raise SystemExit(f"bench: {way}: {name} is not as the task wants it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wakes", type=int, default=5)
    parser.add_argument("--runtime", default="runc")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="wakeloop-bench-editor-") as tmp:
        own_disks(Path(tmp))
        try:
            for n in range(args.wakes):  # the two ways alternate, so load on the host falls on both alike
                for way in WAYS:
                    say(f"{way}: wake {n + 1} of {args.wakes}")
                    results[way].append(one_wake(Path(tmp), way, args.runtime, n))
        finally:
            cleanup(Path(tmp))
    medians = {way: {k: stats([r[k] for r in rows]).median for k in rows[0]} for way, rows in results.items()}
    print(f"change 5 lines across 3 files of {LINES:,} lines; medians of {args.wakes} wakes each, {args.runtime}")
    print(f"{'per wake':<32}{'write_file':>14}{'text editor':>14}{'editor saves':>14}")
    w, e = medians["write_file"], medians["text editor"]
    for label, key, fmt in (
        ("tokens sent (input + cache)", "sent", "{:>14,.0f}"),
        ("tokens received (output)", "received", "{:>14,.0f}"),
        ("wall time (s)", "seconds", "{:>14.2f}"),
        ("model steps", "steps", "{:>14.0f}"),
    ):
        saved = f"{1 - e[key] / w[key]:>14.1%}" if w[key] else f"{'-':>14}"
        print(f"{label:<32}" + fmt.format(w[key]) + fmt.format(e[key]) + saved)


if __name__ == "__main__":
    main()
