"""A real Slurm cluster on one machine: munged, MariaDB, slurmdbd, slurmctld and two slurmd.

``python -m cluster up|down|status``. Everything lives in one state directory
(:func:`cluster.local.paths.state_dir`), and every Slurm command finds it through ``SLURM_CONF``.
"""
