"""Placement policies: pure functions of the scheduler's view, shared by server and simulator."""
