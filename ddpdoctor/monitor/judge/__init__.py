"""Judge the run: the verdict rules on a Snapshot, the diagnosis they make, and the verdicts only an ended run gets."""
