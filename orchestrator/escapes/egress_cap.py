"""The egress budget against a transfer in flight: `sandbox.max_egress_bytes_per_wake` must stop
a download or an upload while its bytes flow, not only refuse the next request.

Each probe runs three transfers of TRANSFER bytes, each in a wake of its own, against a box
whose wake may move CAP bytes: through a tunnel (an allowed host, not intercepted), as plain
HTTP through the proxy, and through an intercepted host. It counts what moved where it can be
counted whatever the proxy says: a download by the bytes the box received, an upload by the
bytes the server received. Past CAP + SLACK is an escape; so is a cut with no record line.
The servers are credentials.py's two echo servers on the egress bridge: nothing leaves this
machine.

Not here: the budget itself (proxy-image/egress_addon.py), the credential probes that share
the servers (credentials.py).
"""

from __future__ import annotations

import time

from orchestrator.escapes.credentials import BOUND, PLAIN, RULED, RULES, credential_box, routes, seen
from orchestrator.escapes.lab import Probe, Trial, escaped, held
from orchestrator.sandbox.egress import network

CATEGORY = "resources"
CAP = 2**20  # the probes' max_egress_bytes_per_wake: 1 MiB
TRANSFER = 8 * 2**20  # what each transfer tries to move: 8 MiB
SLACK = 128 * 2**10  # past CAP a transfer may move its headers and what was in flight: one 64 KiB read, with room
CURL_S = 60  # one transfer; a cut one ends in milliseconds, a whole one in well under a second here

DOWNLOADS = {
    "tunnelled": ["-k", f"https://{PLAIN}/bytes/{TRANSFER}"],
    "plain http": [f"http://{PLAIN}:443/bytes/{TRANSFER}"],
    "intercepted": [f"https://{RULED}/bytes/{TRANSFER}"],
}
UPLOADS = {
    "tunnelled": ["-k", "--data-binary", "@/tmp/upload", f"https://{PLAIN}/up-tunnelled"],
    "plain http": ["--data-binary", "@/tmp/upload", f"http://{PLAIN}:443/up-plain"],
    "intercepted": ["--data-binary", "@/tmp/upload", f"https://{BOUND}/repos/o/pulls"],
    # four of TRANSFER / 16 at once, each under what is left of the budget, together twice it
    "side by side": ["-Z", "--data-binary", "@/tmp/part", *(f"http://{PLAIN}:443/up-beside-{n}" for n in range(4))],
}


def _curl(args: list[str]) -> str:
    quoted = " ".join("'" + a.replace("'", "'\\''") + "'" for a in args)
    return (
        f"head -c {TRANSFER} /dev/zero | tr '\\0' x > /tmp/upload; head -c {TRANSFER // 16} /tmp/upload > /tmp/part; "
        f"curl -sS -o /dev/null -w 'RESULT %{{http_code}} %{{size_download}}\\n' --max-time {CURL_S} {quoted}; "
        'echo "curl exit $?"'
    )


def _transfers(t: Trial, tries: dict[str, list[str]], upload: bool) -> str:
    what = "an upload" if upload else "a download"
    with credential_box(t, bound_rules=RULES, budget=CAP) as (box, _value, bound, elsewhere):
        if not routes(box):
            return held("the box has no route at all on this runtime: no request reaches the proxy")
        egress, found = box._egress(), []
        for name, args in tries.items():
            since = time.time()
            network.settle(t.lab.client, egress, since)  # a new wake: the budget starts again, and is seen to
            result = box.run(_curl(args), timeout_s=CURL_S + 30, max_output_chars=4000)
            line = next((x for x in result.output.splitlines() if x.startswith("RESULT ")), "RESULT 000 0")
            status, received = line.split()[1], int(line.split()[2])
            path = args[-1].split("/", 3)[-1].rstrip("0123456789")  # side by side: every one of them
            arrived = sum(r.get("body_bytes", 0) for s in (bound, elsewhere) for r in seen(s) if path in r["line"])
            moved = arrived if upload else received
            lines = network.settled_decisions(t.lab.client, egress, since, "probe")
            cut = [d for d in lines if "egress budget" in d["rule"] and d["decision"] == "deny"]
            said = result.output.strip().splitlines()[-2:] if result.output.strip() else []
            found.append((name, moved, status, bool(cut), said))
        over = [f"{n}: {m:,} bytes moved ({st})" for n, m, st, _, _ in found if m > CAP + SLACK]
        if over:
            return escaped(f"{what} past the {CAP:,}-byte budget went on: {'; '.join(over)}")
        unrecorded = [n for n, _, _, recorded, _ in found if not recorded]
        if unrecorded:
            return f"{what} was stopped with no record line for {unrecorded}: {found}"
        return held(
            f"{what} of {TRANSFER:,} bytes stopped within the {CAP:,}-byte budget + {SLACK:,}: "
            + "; ".join(f"{n}: {m:,} bytes, status {st}, the box read {s}" for n, m, st, _, s in found)
        )


def _download(t: Trial) -> str:
    return _transfers(t, DOWNLOADS, upload=False)


def _upload(t: Trial) -> str:
    return _transfers(t, UPLOADS, upload=True)


caps_egress_download_in_flight = Probe(
    "caps_egress_download_in_flight",
    CATEGORY,
    "a download past max_egress_bytes_per_wake stops within the budget (+128 KiB), tunnelled, plain or "
    "intercepted, with an error the box reads and a record line",
    _download,
)

caps_egress_upload_in_flight = Probe(
    "caps_egress_upload_in_flight",
    CATEGORY,
    "an upload past max_egress_bytes_per_wake stops within the budget (+128 KiB), tunnelled, plain or "
    "intercepted, with an error the box reads and a record line",
    _upload,
)

PROBES = [caps_egress_download_in_flight, caps_egress_upload_in_flight]
