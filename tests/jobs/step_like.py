"""One node's share of a job started the way `srun python train.py` or `mpirun python train.py` start
it (no torchrun): this process stands for the node's step daemon and forks one plain Python rank per
task, with the launcher's variables set as that launcher sets them, then waits for them.

``step_like.py FAMILY NODE NNODES PER_NODE PORT JOBID MASTER -- TRAINER ARGS``; FAMILY ``slurm``
(block distribution: node k holds ranks k*PER_NODE ...) or ``ompi`` (``--map-by node``: rank r lives
on node r % NNODES). RANK / WORLD_SIZE are set too, as the usual sbatch or mpirun wrapper exports them
from the launcher's own (torch's env:// init reads them); LOCAL_RANK / LOCAL_WORLD_SIZE are not.
"""

import os
import subprocess
import sys

if __name__ == "__main__":
    sep = sys.argv.index("--")
    family, node, nnodes, per_node, port, jobid, master = sys.argv[1:sep]
    node, nnodes, per_node = int(node), int(nnodes), int(per_node)
    world = nnodes * per_node
    procs = []
    for local in range(per_node):
        env = dict(os.environ, MASTER_ADDR=master, MASTER_PORT=port, WORLD_SIZE=str(world))
        if family == "slurm":
            rank = node * per_node + local
            env.update(SLURM_JOB_ID=jobid, SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_LOCALID=str(local),
                       SLURM_NODEID=str(node), SLURM_NNODES=str(nnodes), SLURM_NTASKS=str(world),
                       SLURM_NTASKS_PER_NODE=str(per_node), SLURM_TASKS_PER_NODE=f"{per_node}(x{nnodes})",
                       SLURM_JOB_NODELIST=master.rsplit("-", 1)[0] + f"-[0-{nnodes - 1}]")
        else:
            rank = local * nnodes + node
            env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(world),
                       OMPI_COMM_WORLD_LOCAL_RANK=str(local), OMPI_COMM_WORLD_LOCAL_SIZE=str(per_node),
                       OMPI_COMM_WORLD_NODE_RANK=str(local), SCOUT_TEST_MPI_JOB=jobid)
        env["RANK"] = str(rank)
        procs.append(subprocess.Popen([sys.executable, *sys.argv[sep + 1:]], env=env))
    sys.exit(max(p.wait() for p in procs))
