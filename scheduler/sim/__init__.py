"""Deterministic discrete-event simulator of encoder assignment policies.

Run ``python -m epd.scheduler.sim`` for the table (``--json`` for one JSON object).
"""
