"""Beyond one machine: the doctor across the nodes of a job, and the launchers' environments.

    slurm.py / mpi.py / hostlist.py   SLURM_*, OMPI_* / PMI_* / PMIX_* -> RANK, WORLD_SIZE, MASTER_*
    launch_env.py                     which launcher started this rank, and what it says
    distributed_doctor.py             `ddpdoctor doctor --distributed` (join.py: the bounded join)
    facts.py / consistency.py         what each rank reports, and the cross-rank comparison
    collective_bench.py / links.py    all_reduce correctness and busbw, the pairwise link matrix
    merge.py / outcome.py / render.py rank 0's one report: matrix, JSON "cluster" section, text

Nothing here imports torch at import time; the distributed doctor imports it when it runs.
"""
