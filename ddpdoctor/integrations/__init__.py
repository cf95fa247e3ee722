"""ddpdoctor inside other tools: the pytest plugin (`pytest --ddpdoctor`) and JUnit XML reports.

May import: the checks and the shared vocabulary.
"""
