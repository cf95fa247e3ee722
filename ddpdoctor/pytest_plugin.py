"""pytest plugin: `pytest --ddpdoctor` runs the preflight checks as test items."""
