"""eBPF probes (bcc): each BPF program is a ``.bpf.c`` file beside the Python that loads it.

- :class:`~scout_sys.probes.ebpf.collectives.CollectiveProbe` (``collectives.bpf.c``): uprobes on
  Gloo and NCCL collective entry points: per rank and group, sequence number and fingerprints;
- :class:`~scout_sys.probes.ebpf.sched.SchedProbe` (``sched.bpf.c``): sched_switch, process exit,
  signal and OOM tracepoints: on/off-CPU time per thread, who died first and who killed it.

Import the submodules; bcc itself is imported only when a probe checks ``available()`` or starts.
"""
