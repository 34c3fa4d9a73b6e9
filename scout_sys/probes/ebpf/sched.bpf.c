// scout-sys: scheduling and lifecycle of the job's processes, from tracepoints.
//   sched:sched_switch        per-thread on/off-CPU time, switches, state at switch-out
//   sched:sched_process_exit  who ended, when, with which exit status (task_struct->exit_code)
//   signal:signal_generate    signals for the job's processes: number, sender, code, result
//   oom:mark_victim           the OOM killer's choice (when the tracepoint exists)
// Filled in by sched.py before compile:
//   MAX_PIDS MAX_THREADS MAX_SIGNALS  map bounds
//   EXIT_CODE_OFF   offset of task_struct.exit_code from the kernel's BTF (-1: unknown)
//   GROUP_DEAD      expression true when the exiting thread ends its process
//   HAS_OOM HAS_EXIT_GROUP  1 when oom:mark_victim / syscalls:sys_enter_exit_group exist
//   OOM_TOTAL_VM OOM_ANON_RSS  expressions for those fields (0 when the kernel has none)
#include "scout_common.bpf.h"


struct tstat {
    u64 on_ns;
    u64 off_ns;
    u64 last_in;   // ktime when switched in (0: off CPU)
    u64 last_out;  // ktime when switched out
    u64 switches;
    u64 invol;     // switched out while runnable
    s64 state;     // prev_state at the last switch-out
    u32 tgid;
    u32 pad;
    char comm[16];
};
BPF_HASH(threads, u32, struct tstat, MAX_THREADS);

struct exitrec {
    u64 ns;
    s32 code;    // task_struct.exit_code: (status << 8) | signal (0x80: core dumped); -1 unknown
    s32 group_code;  // exit_group() argument, -1 when the process did not call it
    u32 tid;
    u32 pad;
    char comm[16];
};
BPF_HASH(exits, u32, struct exitrec, MAX_PIDS);      // tgid -> its end
BPF_HASH(exit_group, u32, s32, MAX_PIDS);            // tgid -> exit_group(code)

struct sigkey {
    u32 target;   // tgid of the target
    s32 sig;
    u32 sender;   // tgid of the sender
    u32 pad;
};
struct sigval {
    u64 first_ns;
    u64 last_ns;
    u64 count;
    u32 target_tid;
    s32 code;
    s32 result;
    u32 pad;
    char comm[16];  // sender
};
BPF_HASH(signals, struct sigkey, struct sigval, MAX_SIGNALS);

struct oomrec {
    u64 ns;
    u64 total_vm;
    u64 anon_rss;
};
BPF_HASH(ooms, u32, struct oomrec, MAX_PIDS);

#if HAS_SWITCH
TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 prev = args->prev_pid;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;  // current is still prev here
    if (prev && pids.lookup(&tgid)) {
        struct tstat zero = {};
        zero.tgid = tgid;
        struct tstat *t = threads.lookup_or_try_init(&prev, &zero);
        if (t) {
            if (t->last_in) t->on_ns += now - t->last_in;
            t->last_in = 0;
            t->last_out = now;
            t->switches += 1;
            // Preempted: TASK_RUNNING, or TASK_REPORT_MAX (0x100) as newer kernels report it.
            if (args->prev_state == 0 || (args->prev_state & 0x100)) t->invol += 1;
            t->state = args->prev_state;
            bpf_probe_read_kernel(&t->comm, sizeof(t->comm), args->prev_comm);
        } else {
            count_lost();
        }
    }
    u32 next = args->next_pid;
    struct tstat *n = threads.lookup(&next);  // only threads we saw leave a CPU before
    if (n) {
        if (n->last_out) n->off_ns += now - n->last_out;
        n->last_in = now;
    }
    return 0;
}
#endif

#if HAS_EXIT_GROUP
TRACEPOINT_PROBE(syscalls, sys_enter_exit_group) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!pids.lookup(&tgid)) return 0;
    s32 code = args->error_code;
    exit_group.update(&tgid, &code);
    return 0;
}
#endif

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!pids.lookup(&tgid)) return 0;
    if (!(GROUP_DEAD)) return 0;  // a thread ending is not the process ending
    struct exitrec e = {};
    e.ns = bpf_ktime_get_ns();
    e.tid = tid;
    e.code = -1;
    if (EXIT_CODE_OFF >= 0) {
        void *task = (void *)bpf_get_current_task();
        s32 code = 0;
        if (bpf_probe_read_kernel(&code, sizeof(code), task + EXIT_CODE_OFF) == 0) e.code = code;
    }
    s32 *g = exit_group.lookup(&tgid);
    e.group_code = g ? *g : -1;
    bpf_probe_read_kernel(&e.comm, sizeof(e.comm), args->comm);
    exits.update(&tgid, &e);
    return 0;
}

TRACEPOINT_PROBE(signal, signal_generate) {
    u32 target = args->pid;
    u32 tgid = target;
    if (!pids.lookup(&tgid)) {
        struct tstat *t = threads.lookup(&target);  // a thread of a job process
        if (!t) return 0;
        tgid = t->tgid;
    }
    struct sigkey k = {};
    k.target = tgid;
    k.sig = args->sig;
    k.sender = bpf_get_current_pid_tgid() >> 32;
    u64 now = bpf_ktime_get_ns();
    struct sigval zero = {};
    zero.first_ns = now;
    struct sigval *v = signals.lookup_or_try_init(&k, &zero);
    if (!v) {
        count_lost();
        return 0;
    }
    v->last_ns = now;
    v->count += 1;
    v->target_tid = target;
    v->code = args->code;
    v->result = args->result;
    bpf_get_current_comm(&v->comm, sizeof(v->comm));
    return 0;
}

#if HAS_OOM
TRACEPOINT_PROBE(oom, mark_victim) {
    u32 tgid = args->pid;
    if (!pids.lookup(&tgid)) return 0;
    struct oomrec o = {};
    o.ns = bpf_ktime_get_ns();
    o.total_vm = OOM_TOTAL_VM;
    o.anon_rss = OOM_ANON_RSS;
    ooms.update(&tgid, &o);
    return 0;
}
#endif
