"""The web console of `wakeloop serve ROOT --http ADDR`: the fleet, each agent, the escape report.

Server-rendered HTML on Starlette under uvicorn, in a thread of serve's own
process; no script at all (the Content-Security-Policy forbids every one),
so a live wake is followed by a page that reloads itself, framed inside the
agent's page. Charts are SVG drawn here.

app.py (routes, headers, the listener), hosts.py (which Host names are
answered: DNS rebinding), auth.py (the token, sessions, CSRF, who may read
and act), pages.py (what each page shows, gathered from the CLI's own
readers: views/, fleet/wake_history.py, records/), charts.py (SVG),
escapes.py (the escape suite run in the background), templates/ and static/.

Everything an agent or a model wrote is untrusted: it is only ever put into
a page through Jinja2's autoescaping. The console reads state/ and the
trusted agent.yaml and mandate.md; it never reads the workspace (the disk's
use comes from views.disk_status, as `status` has it).

Under escapes/ and cli/: may import anything below it. It runs the escape
suite as a child process (escapes.py) and reads its reports from
records/escape_reports.py, so it imports nothing of escapes/, which attacks
a real console.

Not here: what a page shows is decided by views/ (agent_status.py, fleet_table.py), the same code as
`wakeloop status`; the metrics are metrics.py's.
"""
