"""The script checkup: a static read of a training script for the DDP pitfalls of the tutorials.

`check_scripts(paths)` parses each script, and the local modules it imports, with `ast` (the script
is never executed) and returns ScriptFindings: rule id, severity, file:line, why it bites at run time
and the fix. `script_results(paths)` turns them into the doctor's CheckResults (group "script").

Modules, one job each:
  finding   the ScriptFinding result and its Finding/JSON form
  source    loading, parsing, `# ddpdoctor: ignore[...]` comments, local-import resolution
  scopes    names, imports, parents, enclosing functions: what a call or a name refers to
  guards    rank provenance and `if rank == 0:` guards that really enclose a statement
  rules_*   the rules, one module per family (data, collectives, devices, setup, io)
  check     the entry point: load, run every rule, drop ignored lines, sort
  doctor    the conversion into the doctor's CheckResults

Import rule: this package may import only the shared vocabulary modules `ddpdoctor.findings`,
`ddpdoctor.errors` and `ddpdoctor.checks.model` (plus the standard library), so it stays usable on
its own and cheap to load.
"""

from __future__ import annotations

from ddpdoctor.checks.scriptcheck.check import check_scripts
from ddpdoctor.checks.scriptcheck.doctor import script_results
from ddpdoctor.checks.scriptcheck.finding import ScriptFinding

__all__ = ["ScriptFinding", "check_scripts", "script_results"]
