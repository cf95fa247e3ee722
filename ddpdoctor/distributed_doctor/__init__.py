"""`ddpdoctor doctor --distributed`: the doctor across the nodes of a job, one process per rank.

    doctor.py                         each rank's run: join, local checks, bench, rank 0 reports
    join.py                           the bounded join through the rendezvous store
    facts.py / consistency.py         what each rank reports, and the cross-rank comparison
    collective_bench.py / links.py    all_reduce correctness and busbw, the pairwise link matrix
    merge.py / verdict.py / render.py rank 0's one report: matrix, JSON "cluster" section, text
    nodes.py / results.py / bench_model.py   the node map, result helpers, benchmark records

May import: the checks, the launchers' environments, the integrations (JUnit) and the shared
vocabulary. Nothing here imports torch at import time; the distributed doctor imports it when it
runs.
"""
