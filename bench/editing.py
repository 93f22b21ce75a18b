"""What the text editor saves a wake: five lines changed across three 2,000-line files, with
write_file (each whole file read, then sent back) and with Claude's text editor (view_range, str_replace).

One agent per wake, its workspace seeded with the same three Python files (FILES, about
65 KB each), its mandate naming the five lines and the change to each. The model is
orchestrator/testing/fakeapi.py at the wire (the real `anthropic` SDK streaming from
it), scripted each way, and it works from what the tools answered it:

- write_file: per file, `bash cat` the file (the whole of it: it must be sent back),
  then `write_file` it whole with its lines changed (3 reads, 3 writes);
- text editor: per line, `view` with a view_range of 21 lines around it, then
  `str_replace` of the line it read there (5 views, 5 replaces).

The boxes are real (one fresh container per call, runc or `--runtime runsc`), on the
agent's own disk, committed by the wake's transaction. The two ways alternate run by
run (ABBA); the end files of every wake must equal the expected ones, byte for byte,
or the bench fails. Per wake: the prompt tokens sent (input + cache reads + cache
writes, summed over its requests) and output tokens received, as the receipt books them
from the fake's usage; the receipt's USD at today's price of the model
(orchestrator/records/prices.json); the wall time of wake(). The fake counts by one rule
both ways: a request's tools, system and message blocks, each as JSON, 4 characters a token;
a reply, its content's JSON, 4 characters a token. The bench recounts every recorded
request by that rule and checks the receipt books the same, and shows the bytes on the
wire beside them (requests' bodies; replies' content JSON), which need no rule.

    python -m bench.editing [--runs 5] [--runtime runsc]

Not here: the editor itself (wake/editor_tool.py, sandbox/containers/in_box/edit.py), its tests
(tests/test_editor_wake.py), a model's generation time (the fake answers at once).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import TOKEN_CAP, LiveEnv, bench_agent, check_receipt, cleanup, fake_api, own_disks, say, step_of
from orchestrator.policy.agent import Agent
from orchestrator.sandbox.engine import DockerSandbox

RUNS = 5
FILES = ("src/alpha.py", "src/beta.py", "src/gamma.py")
LINES = 2000
# (file, line, what the line's " + " becomes): five lines across the three files
CHANGES = (
    ("src/alpha.py", 136, " - "),
    ("src/alpha.py", 1641, " - "),
    ("src/beta.py", 491, " - "),
    ("src/beta.py", 1906, " - "),
    ("src/gamma.py", 1021, " - "),
)
WINDOW = 10  # lines the editor views either side of a target
MAX_OUTPUT = 64_000  # per reply: a whole file must fit in one write_file call (Sonnet 5.5 allows 128K)
BASH_CHARS = 200_000  # a whole file in one `cat` (the default 20,000 would cut it: more reads, same end)
WAYS = ("write_file", "text editor")
UID = 1000  # the agent's user in the box: the seeded files are its own


def source(path: str) -> str:
    """One of the three files: 2,000 lines of plain code, each line unique (its number in it)."""
    tag = Path(path).stem
    shapes = (
        "def {tag}_step_{i:04d}(value):",
        "    total = value * {a} + {b}  # step {i:04d}",
        "    if total > {c}:  # limit {i:04d}",
        "        total -= {b}  # trim {i:04d}",
        "    return total  # end {i:04d}",
    )
    lines = [
        shapes[i % 5].format(tag=tag, i=i, a=i % 97, b=i % 13, c=i * 7 % 1000) for i in range(1, LINES + 1)
    ]  # line n is i = n: line n % 5 == 1 is a `total = ... + ...` line, which CHANGES change
    return "\n".join(lines) + "\n"


def changed(line: str, new: str) -> str:
    if " + " not in line:
        raise SystemExit(f"bench: {line!r} has no ' + ' to change")
    return line.replace(" + ", new, 1)


def expected() -> dict[str, str]:
    """The three files as the task leaves them."""
    out = {}
    for path in FILES:
        lines = source(path).split("\n")
        for where, n, new in CHANGES:
            if where == path:
                lines[n - 1] = changed(lines[n - 1], new)
        out[path] = "\n".join(lines)
    return out


def mandate() -> str:
    asks = "\n".join(
        f"- {path}, line {n}: the offset is subtracted, not added (its ` + ` becomes `{new.strip()}`)."
        for path, n, new in CHANGES
    )
    return f"# Mandate\n\nFix five lines in /workspace, and change nothing else:\n\n{asks}\n"


# -- the model, scripted each way -------------------------------------------------


def last_result(body: dict) -> str:
    """The text of the tool_result the harness sent last (the model reads what its tool answered)."""
    content = body["messages"][-1]["content"]
    [block] = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    value = block["content"]
    text = value if isinstance(value, str) else "".join(b.get("text", "") for b in value)
    if block.get("is_error"):
        raise SystemExit(f"bench: a tool failed: {text[:300]}")
    return text


@dataclass
class Model:
    """A scripted model: its calls, one a turn (each may read the last tool result), then an end.
    Records the characters of each reply's content, as JSON (what the fake counts output by)."""

    way: str
    reply_chars: list[int] = field(default_factory=list)

    def __call__(self, rec):
        from orchestrator.testing.fakeapi import text, turn

        step = step_of(rec.body)
        calls = self.write_file if self.way == "write_file" else self.editor
        block = calls(step, rec.body) if step < self.steps else text("Done: the five lines are fixed.")
        reply = turn(block)
        self.reply_chars.append(len(json.dumps(reply.content)))
        return reply

    @property
    def steps(self) -> int:
        return 2 * len(FILES) if self.way == "write_file" else 2 * len(CHANGES)

    def write_file(self, step: int, body: dict) -> dict:
        """Even steps: cat a file. Odd: write it back whole, its lines changed, from what cat showed."""
        from orchestrator.testing.fakeapi import tool_use

        path = FILES[step // 2]
        if step % 2 == 0:
            return tool_use("bash", {"command": f"cat /workspace/{path}"})
        status, _, shown = last_result(body).partition("\n")
        if status != "[exit 0]":  # cut or failed: what the model read is not the file
            raise SystemExit(f"bench: cat {path}: {status}")
        lines = shown.split("\n")
        for where, n, new in CHANGES:
            if where == path:
                lines[n - 1] = changed(lines[n - 1], new)
        return tool_use("write_file", {"path": path, "content": "\n".join(lines)})

    def editor(self, step: int, body: dict) -> dict:
        """Even steps: view the lines around a target. Odd: str_replace the target line as viewed."""
        from orchestrator.testing.fakeapi import edit

        path, n, new = CHANGES[step // 2]
        if step % 2 == 0:
            return edit("view", f"/workspace/{path}", view_range=[n - WINDOW, n + WINDOW])
        numbered = dict(
            line.lstrip().split("\t", 1) for line in last_result(body).split("\n") if "\t" in line
        )  # "   136\tthe line" -> {"136": "the line"}
        old = numbered[str(n)]
        return edit("str_replace", f"/workspace/{path}", old_str=old, new_str=changed(old, new))


# -- one wake --------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    way: str
    model: str  # the receipt's
    prompt_tokens: int  # input + cache reads + cache writes, all requests (the receipt)
    output_tokens: int
    cache_read: int  # of prompt_tokens, read from the prompt cache (0.1 of the input price on Sonnet 5.5)
    cache_write: int  # of prompt_tokens, written to it
    usd: float  # the receipt's
    wall_s: float  # wake() start to end
    requests: int
    request_bytes: int  # the request bodies as sent
    reply_chars: int  # the replies' content as JSON
    digest: str  # of the three end files


def new_agent(where: Path, runtime: str) -> Agent:
    no_usd_cap = {"max_usd_per_wake": 100, "max_usd_per_day": 1000, "max_usd_per_month": 10000}
    budget = {"max_steps": 30, "max_tokens_per_wake": TOKEN_CAP, "max_output_tokens": MAX_OUTPUT, **no_usd_cap}
    policy = {"budget": budget, "sandbox": {"runtime": runtime}, "tools": {"bash": {"max_output_chars": BASH_CHARS}}}
    return bench_agent(where, policy, mandate=mandate())


def on_disk(agent: Agent, write: dict[str, str] | None = None) -> dict[str, str]:
    """The workspace's three files, through a box's view of its disk; `write`: put these there first."""
    box = DockerSandbox(agent.workspace, agent.policy.sandbox, agent=agent.name, warm=0)
    try:
        root = box.view
        for path, content in (write or {}).items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            for made in (target.parent, target):
                os.chown(made, UID, UID)
        return {path: (root / path).read_text() for path in FILES}
    finally:
        box.close()


def one_wake(where: Path, way: str, runtime: str) -> Sample:
    from orchestrator.wake.loop import wake

    agent = new_agent(where, runtime)
    on_disk(agent, write={path: source(path) for path in FILES})
    model = Model(way)
    with LiveEnv(fake_api(model, one_at_a_time=True)) as api:
        started = time.perf_counter()
        receipt = wake(agent, live=True)
        wall = time.perf_counter() - started
    check_receipt(receipt, way)
    posts = [r for r in api.requests if r.path.startswith("/v1/messages")]
    sent = check_counts(way, posts, model.reply_chars, receipt)
    ends = on_disk(agent)
    if ends != expected():
        wrong = [p for p in FILES if ends[p] != expected()[p]]
        raise SystemExit(f"bench: {way}: the end files differ from the expected ones: {', '.join(wrong)}")
    digest = hashlib.sha256("".join(ends[p] for p in FILES).encode()).hexdigest()[:12]
    return Sample(
        way,
        receipt.model,
        receipt.usage.prompt_tokens,
        receipt.usage.output_tokens,
        receipt.usage.cache_read_tokens,
        receipt.usage.cache_write_tokens,
        receipt.usd,
        wall,
        len(posts),
        sent,
        sum(model.reply_chars),
        digest,
    )


def check_counts(way: str, posts: list, reply_chars: list[int], receipt) -> int:
    """The bytes the wake's requests sent, once its tokens are checked: no reply past its max_tokens,
    the receipt's tokens the fake's rule applied to what was sent and answered, its USD the model's
    price of them. Any other: the bench fails."""
    from orchestrator.records.ledger import cost_usd, load_prices, price_for
    from orchestrator.testing.fakeapi import CHARS_PER_TOKEN as PER
    from orchestrator.testing.fakeapi import cache_model

    for rec, chars in zip(posts, reply_chars, strict=True):
        if chars // PER > rec.body["max_tokens"]:  # a real model would have been cut off there
            raise SystemExit(f"bench: {way}: a reply of ~{chars // PER:,} tokens past max_tokens")
    usage, sent = receipt.usage, sum(len(r.raw) for r in posts)
    recount = sum(cache_model(r.body, set())[2] for r in posts)
    if recount != usage.prompt_tokens or sum(max(1, c // PER) for c in reply_chars) != usage.output_tokens:
        raise SystemExit(f"bench: {way}: the receipt's tokens are not the fake's: {usage} vs {recount} by the rule")
    if abs(recount * PER - sent) > sent / 10:  # the rule counts what was sent, not a part of it
        raise SystemExit(f"bench: {way}: {recount:,} tokens by the rule for {sent:,} bytes sent")
    # the wake's usage priced as one: right while the model's price has no long-prompt band (Sonnet 5.5's has none)
    price = price_for(receipt.model, load_prices())
    if price is None or receipt.usd is None or abs(cost_usd(price, usage) - receipt.usd) > 1e-4:
        raise SystemExit(f"bench: {way}: the receipt's USD ({receipt.usd}) is not {receipt.model}'s price of its usage")
    return sent


# -- the table -------------------------------------------------------------------


def median(samples: list[Sample], name: str) -> float:
    return statistics.median(getattr(s, name) for s in samples)


def table(by_way: dict[str, list[Sample]], model: str, runtime: str) -> list[str]:
    columns = (
        ("prompt tokens sent", "prompt_tokens", "{:,.0f}"),
        ("output tokens", "output_tokens", "{:,.0f}"),
        ("USD", "usd", "{:.4f}"),
        ("wall s", "wall_s", "{:.2f}"),
        ("requests", "requests", "{:.0f}"),
        ("cache read", "cache_read", "{:,.0f}"),
        ("cache write", "cache_write", "{:,.0f}"),
        ("request KB", "request_bytes", "{:,.0f}"),
        ("reply KB", "reply_chars", "{:,.1f}"),
    )
    first = by_way[WAYS[0]]
    runs = len(first)
    out = [
        f"editing 5 lines in 3 files of {LINES:,} lines, one wake each way; {model} at today's price; "
        f"runtime {runtime}; medians of {runs} runs each, alternated",
        "| way | " + " | ".join(name for name, _, _ in columns) + " | end files |",
        "| --- " * (len(columns) + 2) + "|",
    ]
    for way in WAYS:
        cells = []
        for _, key, form in columns:
            value = median(by_way[way], key)
            cells.append(form.format(value / 1000 if key in ("request_bytes", "reply_chars") else value))
        digests = {s.digest for s in by_way[way]}
        out.append(f"| {way} | " + " | ".join(cells) + f" | {', '.join(sorted(digests))} |")
    ratios = []
    for _, key, _ in columns[:4]:
        a, b = median(by_way[WAYS[0]], key), median(by_way[WAYS[1]], key)
        ratios.append(f"{a / b:,.1f}x" if b else "-")
    out.append("| write_file / editor | " + " | ".join(ratios) + " |" + " |" * (len(columns) - 4 + 1))
    saved = {key: median(by_way[WAYS[0]], key) - median(by_way[WAYS[1]], key) for _, key, _ in columns[:3]}
    out.append(
        f"the text editor saves a wake {saved['prompt_tokens']:,.0f} prompt tokens, "
        f"{saved['output_tokens']:,.0f} output tokens and ${saved['usd']:.4f}; wall time is the harness, "
        "the boxes and the wire (the fake answers at once: no model's generation time is in it)"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.editing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help=f"wakes each way (default {RUNS})")
    parser.add_argument("--runtime", default="runc", help="container runtime: runc (default) or runsc")
    args = parser.parse_args(argv)
    by_way: dict[str, list[Sample]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="wakeloop-bench-editing-") as name:
        tmp = Path(name)
        own_disks(tmp)
        try:
            for run in range(args.runs):
                order = WAYS if run % 2 == 0 else WAYS[::-1]  # ABBA: neither way always goes first
                for way in order:
                    sample = one_wake(tmp / f"{run}-{way.replace(' ', '_')}" / "agent", way, args.runtime)
                    by_way[way].append(sample)
                    say(f"run {run + 1}/{args.runs} {way}: {sample.wall_s:.1f} s, ${sample.usd:.4f}")
        finally:
            left = cleanup(tmp)
    digests = {s.digest for samples in by_way.values() for s in samples}
    if len(digests) != 1:
        raise SystemExit(f"bench: the two ways left different files: {sorted(digests)}")
    models = {s.model for samples in by_way.values() for s in samples}
    print("\n".join(table(by_way, ", ".join(sorted(models)), args.runtime)))
    print(f"containers left behind (removed now): {left}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
