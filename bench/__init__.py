"""The benches: measurements too long for the suite, each printing its own table.

Run from the checkout as modules, `.venv/bin/python -m bench.run` (and
bench.fleet, bench.soak, ...): the checkout is then on sys.path, so they
import each other as `bench.*` and the tests' helpers as `tests.helpers`.

Not here: the tests (tests/), of which test_bench.py and test_soak.py run
the smallest of these.
"""
