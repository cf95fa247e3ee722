"""Tell the run: a diagnosed Snapshot as text, as the headless live view, and as diagnosis.json."""
