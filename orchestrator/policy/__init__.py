"""The rules, read once from trusted YAML and frozen into dataclasses.

schema.py (the policy's dataclasses: the model), load.py (a policy file or
mapping into them, with `file:line: key: reason` errors), paths.py (the write
path rules and globs, which sandbox/ applies too), agent.py (agent.yaml and
the layout of an agent's folder), schedule_line.py (its `schedule:` line,
one parser for every command and serve), ceiling.py (the most any policy may
ask of the host), fleetbudget.py (ROOT/budget.yaml: what all agents may spend
together). Every file is read by safeio/yamlfile.py.

Imports records/ and the leaf notify/ at most; never sandbox/, broker/, wake/
or fleet/: the rules say what may happen, the layers above make it happen.
Whether the engine can give what a policy asks is sandbox/policy_check.py's.
"""
