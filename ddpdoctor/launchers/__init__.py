"""The launchers' environments: the variables torchrun, srun and mpirun set, which launcher
started this process, and this process's rank, world size and master from them.

    variables.py   the variable lists (torch, torchrun, Slurm, MPI) and their integer parsing
    detect.py      which launcher started this process (torchrun, srun, mpirun, by hand)
    identity.py    rank, world size, node, master from whichever launcher it was
    slurm.py / mpi.py / hostlist.py   SLURM_*, OMPI_* / PMI_* / PMIX_* -> RANK, WORLD_SIZE, MASTER_*
    proc_tree.py   the processes a launcher started, from /proc (without scanning the whole host)

May import: the shared vocabulary at the top of ddpdoctor only (used by the checks, the runtime
and the distributed doctor alike).
"""
