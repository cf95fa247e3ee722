"""Follow the run: tail the run directory, the launchers' node summaries and records, and the facts only a rank's host can see."""
