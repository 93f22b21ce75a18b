"""Stand-ins for what wakeloop talks to, for the tests and the benches; no runtime module imports them.

fakeapi.py (a local Messages API the real `anthropic` SDK talks to over HTTP:
scripted replies, streaming, usage and prompt caching as the API counts them).

Shipped in the wheel beside the rest, so a test or a bench run against an
installed wakeloop finds it. May import anything below it; nothing imports it
but tests/ and bench/.
"""
