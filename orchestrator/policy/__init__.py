"""The rules, read once from trusted YAML and frozen into dataclasses.

schema.py (the policy's dataclasses and the one YAML-to-dataclass engine,
with `file:line: key: reason` errors), agent.py (agent.yaml and the layout of
an agent's folder), ceiling.py (the most any policy may ask of the host),
fleetbudget.py (ROOT/budget.yaml: what all agents may spend together).

Imports records/ at most; never sandbox/, broker/, wake/ or fleet/: the rules
say what may happen, the layers above make it happen.
"""
