"""A symlink swapped in and out by the box while the host makes file calls on the path, run so
that its verdict does not hang on timing: first the box holds the link in place for each of a few
calls (a hand-off through files in the workspace), then it swaps as fast as it can while calls go
on until enough of them provably overlapped a whole file → link → file flip (a counter it writes).
A harness that follows the link is caught by the first part whatever the machine's load; the
second is the race against a check made before the open.

Not here: the probes that run it (editor_probes.py, workspace_probes.py) and their verdicts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.escapes.lab import Trial, held, wait_for
from orchestrator.sandbox.containers.deadline import KILL_GRACE_S

LINK_CALLS = 4  # calls made while the box holds the symlink in place
RACED_CALLS = 4  # calls that must overlap a whole file/link flip of the box's fastest swaps
MAX_RACE_CALLS = 16  # calls tried at most to get those
HANDOFF_S = 60  # the box's turn in the hand-off (a new container on a loaded engine), at most
SWAP_LIMIT_S = 300  # the swapper's own end, should the host's side never say stop


@dataclass
class SwapRace:
    on_link: list[int] = field(default_factory=list)  # exit codes of the calls that met the link
    racing: list[int] = field(default_factory=list)  # exit codes of the calls made during the swaps
    raced: int = 0  # of those, the calls that overlapped a whole flip
    stuck: str = ""  # why the swap did not run its course ("" when it did)


def race_swaps(t: Trial, rel: str, text: str, call: Callable[[int], int]) -> SwapRace:
    """Swap `rel` (a file in a folder the box makes) between a file holding `text` and a symlink
    to the host canary, while `call(i)` makes the host's i-th call on it and gives its exit code."""
    swap_out: list = []
    worker = threading.Thread(
        target=lambda: swap_out.append(t.new_box().run(_swapper(t, rel, text), SWAP_LIMIT_S + 10, 2000)),
        daemon=True,
    )
    worker.start()
    race = SwapRace()
    try:
        race.stuck = _calls_on_the_link(t, rel, call, race)
        if not race.stuck:
            _calls_in_the_race(t, rel, call, race)
    finally:
        (t.workspace / "swap-stop").touch()
        worker.join(SWAP_LIMIT_S + 10 + KILL_GRACE_S)
    if not race.stuck and (not swap_out or "swapped" not in swap_out[0].output):
        race.stuck = f"the swapper said: {swap_out[0].output[-200:] if swap_out else 'no result'}"
    return race


def _swapper(t: Trial, rel: str, text: str) -> str:
    """The box's side. For each of LINK_CALLS rounds it puts the link in place, says so in
    <folder>/swap-state and holds it until the host's swap-ack.N; then it flips file and link as
    fast as it can, counting whole flips in <folder>/swap-flips, until swap-stop, which also ends
    a hold (a probe that gave up). The host's markers are at the workspace's top: the folder is
    the box's, which the host must not make (the box could not write in it)."""
    folder = rel.rsplit("/", 1)[0]
    return (
        f"end=$((SECONDS+{SWAP_LIMIT_S})); mkdir -p {folder}; "
        f"link() {{ ln -sfn {t.lab.canary_path} {rel}.tmp && mv -fT {rel}.tmp {rel}; }}; "
        f"file() {{ echo {text} > {rel}.tmp2 && mv -fT {rel}.tmp2 {rel}; }}; "
        f"put() {{ echo $2 > {folder}/$1.tmp && mv -fT {folder}/$1.tmp {folder}/$1; }}; "
        'late() { [ $SECONDS -ge $end ] && echo "swapper out of time" && exit 3; }; '
        f"for i in $(seq 1 {LINK_CALLS}); do link; put swap-state link-$i; "
        "until [ -e swap-ack.$i ] || [ -e swap-stop ]; do late; sleep 0.02; done; file; done; "
        "n=0; until [ -e swap-stop ]; do late; link; file; n=$((n+1)); put swap-flips $n; done; echo swapped $n"
    )


def _calls_on_the_link(t: Trial, rel: str, call: Callable[[int], int], race: SwapRace) -> str:
    """One call per round while the swapper provably holds the link in place (it waits for our
    ack): whatever the timing, each of these calls meets the symlink."""
    folder = rel.rsplit("/", 1)[0]
    for i in range(1, LINK_CALLS + 1):
        placed = f"link-{i}"
        if not wait_for(lambda: _marker(t, f"{folder}/swap-state") == placed, HANDOFF_S):  # noqa: B023 (called here)
            return f"the swapper never put the link in place for round {i}"
        if not (t.workspace / rel).is_symlink():
            return f"round {i}: {rel} is not the link the swapper said it placed"
        race.on_link.append(call(i))
        (t.workspace / f"swap-ack.{i}").touch()
    return ""


def _calls_in_the_race(t: Trial, rel: str, call: Callable[[int], int], race: SwapRace) -> None:
    """Calls while the swapper flips, until RACED_CALLS of them saw the flip counter move by two
    or more (so a whole file → link → file flip happened during the call), MAX_RACE_CALLS at most."""
    flips = f"{rel.rsplit('/', 1)[0]}/swap-flips"
    while race.raced < RACED_CALLS and len(race.racing) < MAX_RACE_CALLS:
        before = _count(_marker(t, flips))
        race.racing.append(call(len(race.racing)))
        race.raced += _count(_marker(t, flips)) - before >= 2


def judged(race: SwapRace, calls: str) -> str:
    """Why a race cannot be judged, or its HELD verdict: for the probe to give once it found the
    canary intact and every call that met the link refused."""
    if race.stuck:
        return f"the swapper did not run its course: {race.stuck}"
    if race.raced < RACED_CALLS:
        return f"too little raced to judge: {race.raced} of {len(race.racing)} {calls} overlapped a whole flip"
    landed = sum(code == 0 for code in race.racing)
    return held(
        f"{len(race.on_link)} {calls} met the link in place, all refused; {race.raced} of {len(race.racing)} "
        f"{calls} raced whole flips: {landed} landed in the regular file, {len(race.racing) - landed} refused; "
        "canary intact"
    )


def _marker(t: Trial, rel: str) -> str:
    try:
        return (t.workspace / rel).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _count(text: str) -> int:
    return int(text) if text.isdigit() else 0
