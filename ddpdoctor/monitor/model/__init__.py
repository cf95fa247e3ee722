"""The model of a run: per-rank records folded from events and rows (RunState) and the frozen Snapshot every later stage reads."""
