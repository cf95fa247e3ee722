"""The stages wired together: the Monitor's poll (follow -> model -> judge -> tell) and post-mortems of a run directory."""
