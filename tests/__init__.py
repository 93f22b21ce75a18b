"""wakeloop's test suite: a package, so every test imports the shared helpers as
`from tests.helpers import ...` (pytest puts the checkout on sys.path for it).

Not here: the helpers themselves (tests/helpers/), the fixtures (conftest.py).
"""
