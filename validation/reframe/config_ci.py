"""ReFrame configuration for the local Slurm test cluster (scripts/slurm-cluster.sh): one system,
one partition. A site copies it and names its own partition, access options (account, QOS) and
environment; keep the `local` launcher (validation/run starts srun itself)."""
site_configuration = {
    "systems": [{
        "name": "ci",
        "descr": "local Slurm test cluster (scripts/slurm-cluster.sh), CPU backend",
        "hostnames": [".*"],
        "modules_system": "nomod",
        "partitions": [{
            "name": "default",
            "scheduler": "squeue",  # Slurm without accounting
            "launcher": "local",
            "environs": ["dtrain"],
            "max_jobs": 1,
        }],
    }],
    "environments": [{"name": "dtrain"}],
    # ReFrame's own log in the directory it runs from (not a temporary file per run)
    "logging": [{
        "level": "debug",
        "handlers": [{"type": "file", "name": "reframe.log", "level": "debug",
                      "format": "[%(asctime)s] %(levelname)s: %(message)s", "append": False}],
    }],
}
