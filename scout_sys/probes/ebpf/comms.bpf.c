// scout-sys: NCCL communicator creation (libnccl.so*), seen by uprobes, and the collectives called
// on the communicators it saw made. Filled in by comms.py:
//   MAX_PIDS MAX_CREATIONS MAX_THREADS  map bounds
//
// One record per creation call, keyed by (tgid, tid, when): what the
// entry arguments say (the 128-byte ncclUniqueId, nranks and rank; or the parent communicator,
// color and key of a split) and, from the uretprobe, the return code and the communicator handle
// NCCL stored in *newcomm. Not filtered by pid in the kernel: the probe attaches before the ranks
// exist (uprobes on the library's inode fire for processes that map it later); creation calls are
// a handful per process, and the maps are bounded (drops are counted in `lost`).
// NCCL's C API returns codes and never unwinds: a uretprobe is safe on it.
#include "scout_common.bpf.h"

#define K_INIT 1         // ncclCommInitRank(comm*, nranks, ncclUniqueId id (by value), rank)
#define K_INIT_CONFIG 2  // ncclCommInitRankConfig(comm*, nranks, id (by value), rank, config*)
#define K_SCALABLE 3     // ncclCommInitRankScalable(comm*, nranks, myrank, nId, ncclUniqueId* ids, config*)
#define K_SPLIT 4        // ncclCommSplit(comm, color, key, newcomm*, config*)

struct ckey {
    u32 tgid;
    u32 tid;
    u64 ns;  // when it was called: user space orders a process's calls by it
};

struct creation {
    u64 ns;
    u64 ret_ns;
    u64 out;     // ncclComm_t* where NCCL stores the new communicator
    u64 comm;    // *out when the call returned (0: unknown)
    u64 parent;  // split: the parent communicator
    s32 nranks;  // init: communicator size
    s32 rank;    // init: rank in the communicator; split: key
    s32 color;   // split: color (-1: NCCL_SPLIT_NOCOLOR)
    s32 ret;     // ncclResult_t
    u32 kind;
    u32 returned;
    u8 id[128];  // init: the ncclUniqueId (scalable: the first of the ids)
};

struct destroyed {
    u32 tgid;
    u32 pad;
    u64 comm;
};

BPF_HASH(creations, struct ckey, struct creation, MAX_CREATIONS);
BPF_HASH(pending, u32, struct ckey, MAX_THREADS);  // tid -> the record its call returns to
BPF_HASH(gone, struct destroyed, u64, MAX_CREATIONS);  // destroyed / aborted communicators

// Collectives per communicator made while attached (so counted from its first call: the same
// sequence on every member). Only those communicators: a process we did not see make one costs a
// lookup per call.
struct cstate {
    u64 calls;    // collectives entered (send / recv not counted: they pair two ranks, not the group)
    u64 last_ns;  // the latest one's entry
    u32 last_op;  // its op id (comms.py COLL_OPS)
    u32 pad;
};
BPF_HASH(known, struct destroyed, struct cstate, MAX_CREATIONS);  // (tgid, handle) -> its collectives

static inline struct creation *begin(u32 kind, u64 out) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tid = (u32)pt;
    struct ckey k = {};
    k.tgid = pt >> 32;
    k.tid = tid;
    k.ns = bpf_ktime_get_ns();
    struct creation c = {};
    c.ns = k.ns;
    c.kind = kind;
    c.out = out;
    c.color = -1;
    if (creations.update(&k, &c)) {
        count_lost();
        return 0;
    }
    pending.update(&tid, &k);
    return creations.lookup(&k);
}

static inline int init_common(u32 kind, u64 out, s32 nranks, s32 rank, const void *id) {
    struct creation *c = begin(kind, out);
    if (!c) return 0;
    c->nranks = nranks;
    c->rank = rank;
    bpf_probe_read_user(c->id, sizeof(c->id), id);
    return 0;
}

// The 128-byte ncclUniqueId is a struct passed by value: class MEMORY, so it lies on the stack at
// sp+8 (above the return address) and takes no register: rank is the third integer argument.
int comm_init_rank(struct pt_regs *ctx) {
    return init_common(K_INIT, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
                       (void *)(PT_REGS_SP(ctx) + 8));
}

int comm_init_rank_config(struct pt_regs *ctx) {
    return init_common(K_INIT_CONFIG, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
                       (void *)(PT_REGS_SP(ctx) + 8));
}

int comm_init_rank_scalable(struct pt_regs *ctx) {
    return init_common(K_SCALABLE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
                       (void *)PT_REGS_PARM5(ctx));
}

int comm_split(struct pt_regs *ctx) {
    struct creation *c = begin(K_SPLIT, PT_REGS_PARM4(ctx));
    if (!c) return 0;
    c->parent = PT_REGS_PARM1(ctx);
    c->color = (s32)PT_REGS_PARM2(ctx);
    c->rank = (s32)PT_REGS_PARM3(ctx);
    return 0;
}

int comm_return(struct pt_regs *ctx) {
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct ckey *k = pending.lookup(&tid);
    if (!k) return 0;
    struct ckey key = *k;
    pending.delete(&tid);
    struct creation *c = creations.lookup(&key);
    if (!c) return 0;
    c->ret = (s32)PT_REGS_RC(ctx);
    c->ret_ns = bpf_ktime_get_ns();
    c->returned = 1;
    u64 comm = 0;
    if (c->out) bpf_probe_read_user(&comm, 8, (void *)c->out);
    c->comm = comm;
    if (comm) {
        struct destroyed d = {};
        d.tgid = key.tgid;
        d.comm = comm;
        struct cstate z = {};
        if (known.update(&d, &z)) count_lost();
    }
    return 0;
}

// ncclCommDestroy(comm) / ncclCommAbort(comm): the handle may be reused by a later communicator.
int comm_destroy(struct pt_regs *ctx) {
    struct destroyed d = {};
    d.tgid = bpf_get_current_pid_tgid() >> 32;
    d.comm = PT_REGS_PARM1(ctx);
    u64 now = bpf_ktime_get_ns();
    if (gone.update(&d, &now)) count_lost();
    return 0;
}

static inline int coll(u32 op, u64 comm) {
    struct destroyed d = {};
    d.tgid = bpf_get_current_pid_tgid() >> 32;
    d.comm = comm;
    struct cstate *s = known.lookup(&d);
    if (!s) return 0;
    __sync_fetch_and_add(&s->calls, 1);
    s->last_ns = bpf_ktime_get_ns();
    s->last_op = op;
    return 0;
}

static inline u64 stack_arg7(struct pt_regs *ctx) {
    u64 v = 0;  // at entry [sp] is the return address, the 7th argument at sp+8
    bpf_probe_read_user(&v, 8, (void *)(PT_REGS_SP(ctx) + 8));
    return v;
}

// op ids: keep in step with comms.py COLL_OPS. The communicator is the argument before the stream.
int coll_allreduce(struct pt_regs *ctx) { return coll(1, PT_REGS_PARM6(ctx)); }      // (s, r, n, type, op, comm, stream)
int coll_broadcast(struct pt_regs *ctx) { return coll(2, PT_REGS_PARM6(ctx)); }      // (s, r, n, type, root, comm, stream)
int coll_reduce(struct pt_regs *ctx) { return coll(3, stack_arg7(ctx)); }            // (s, r, n, type, op, root, comm, stream)
int coll_allgather(struct pt_regs *ctx) { return coll(4, PT_REGS_PARM5(ctx)); }      // (s, r, n, type, comm, stream)
int coll_reduce_scatter(struct pt_regs *ctx) { return coll(5, PT_REGS_PARM6(ctx)); } // (s, r, n, type, op, comm, stream)
int coll_alltoall(struct pt_regs *ctx) { return coll(6, PT_REGS_PARM5(ctx)); }       // (s, r, n, type, comm, stream)
int coll_gather(struct pt_regs *ctx) { return coll(7, PT_REGS_PARM6(ctx)); }         // (s, r, n, type, root, comm, stream)
int coll_scatter(struct pt_regs *ctx) { return coll(8, PT_REGS_PARM6(ctx)); }        // (s, r, n, type, root, comm, stream)
