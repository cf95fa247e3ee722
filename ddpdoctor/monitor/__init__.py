"""The model of a run: tail the run directory -> events -> RunState -> frozen Snapshot; diagnosis
rules; log explainers; py-spy stacks. Never imports textual: everything here works without a terminal."""
