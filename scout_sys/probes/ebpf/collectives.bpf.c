// scout-sys: collective entry points of Gloo (c10d::ProcessGroupGloo in libtorch_cpu.so) and NCCL
// (libnccl.so*), seen by uprobes. Filled in by collectives.py before compile:
//   MAX_PIDS MAX_GROUPS MAX_THREADS HIST  map bounds (HIST a power of two)
//   TI_OFF TI_LEN                         window of c10::TensorImpl read for sizes (dim..dtype)
//   REDOP_OFF REDUCE_ROOT_OFF             offsets of ReduceOp::op_ and ReduceOptions::rootRank
//   TAG_OFF                               ProcessGroupGloo's collective counter (-1: count here)
//
// Everything is aggregated here; user space reads the maps when it samples.
// Gloo entry points get no uretprobes: they may throw C++ exceptions, and an unwinder that meets
// the uretprobe trampoline terminates the process. Completion is seen at
// AsyncWork::finishWorkGloo / finishWorkGlooError entry instead. NCCL's C API returns codes and
// never unwinds, so its calls get uretprobes.
#include "scout_common.bpf.h"

#define LIB_GLOO 1
#define LIB_NCCL 2

// Argument kinds for the tensor of a Gloo call.
#define T_NONE 0
#define T_VEC 1     // std::vector<at::Tensor>&
#define T_TENSOR 2  // at::Tensor&


struct gkey {
    u32 tgid;
    u32 lib;
    u64 group;  // ProcessGroupGloo* / ncclComm_t
};

struct fp {
    u64 seq;
    u64 ns;
    u64 count;      // elements; ~0 when unknown
    u32 op;
    s32 dtype;      // at::ScalarType or ncclDataType_t; -1 unknown
    s32 redop;      // -1 unknown / none
    s32 root;       // -1 none
    u32 ntensors;
    u32 valid;      // gloo: the TensorImpl window passed the layout check in user space
    u8 ti[TI_LEN];  // raw TensorImpl window, checked in user space
};

struct gstate {
    u64 seq;        // sequence position of the last collective entered
    u64 calls;      // collectives entered since attach
    u64 first_ns;
    u64 enter_ns;
    u64 exit_ns;    // nccl: last return
    u64 p2p;        // send / recv calls
    u32 inside;     // nccl: inside the host call now
    s32 ret;        // nccl: last return code
    u32 depth;      // nccl: group nesting at last call
    u32 pad;
};

struct hkey {
    struct gkey g;
    u64 slot;
};

// Per process: Gloo work execution (worker threads run the algorithm behind the enqueue).
struct wstate {
    u64 started;
    u64 done;
    u64 errors;
    u64 start_ns;
    u64 done_ns;
    u64 last_sent;  // bytes sent by the last finished work
    u64 last_recv;
    u32 group_depth;  // nccl group nesting
    u32 pad;
};

// Per Gloo worker thread: the work it runs now.
struct tstate {
    u64 start_ns;
    u64 sent;
    u64 recvd;
    u64 event_ns;   // last transport event
    s32 recv_peer;  // last recv posted (group rank)
    s32 send_peer;
    u32 tgid;
    u32 busy;
};

struct call {
    struct gkey g;
};

BPF_HASH(groups, struct gkey, struct gstate, MAX_GROUPS);
BPF_HASH(hist, struct hkey, struct fp, MAX_GROUPS * HIST);
BPF_HASH(works, u32, struct wstate, MAX_PIDS);
BPF_HASH(workers, u32, struct tstate, MAX_THREADS);
BPF_HASH(calls, u32, struct call, MAX_THREADS);  // nccl: tid -> call in flight
BPF_ARRAY(scratch, struct fp, 1);                  // fp is too large for the BPF stack

static inline u32 *job_rank(u32 *tgid_out) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    *tgid_out = tgid;
    return pids.lookup(&tgid);
}

// Read the first tensor's TensorImpl window. vec: &std::vector<at::Tensor> (begin, end, cap);
// at::Tensor is one pointer to its TensorImpl.
static inline void read_tensor(struct fp *f, u64 arg, int kind) {
    u64 impl = 0;
    f->ntensors = 0;
    if (!arg) return;
    if (kind == T_VEC) {
        u64 be[2] = {};
        if (bpf_probe_read_user(&be, sizeof(be), (void *)arg)) return;
        if (be[1] <= be[0]) return;
        f->ntensors = (be[1] - be[0]) / 8;
        if (bpf_probe_read_user(&impl, sizeof(impl), (void *)be[0])) return;
    } else if (kind == T_TENSOR) {
        f->ntensors = 1;
        if (bpf_probe_read_user(&impl, sizeof(impl), (void *)arg)) return;
    }
    if (!impl) return;
    if (bpf_probe_read_user(&f->ti, TI_LEN, (void *)(impl + TI_OFF)) == 0) f->valid = 1;
}

static inline struct fp *new_fp(u32 op) {
    int z = 0;
    struct fp *f = scratch.lookup(&z);
    if (!f) return 0;
    __builtin_memset(f, 0, sizeof(*f));
    f->op = op;
    f->count = ~0ULL;
    f->dtype = -1;
    f->redop = -1;
    f->root = -1;
    f->ns = bpf_ktime_get_ns();
    return f;
}

// Count one collective on (tgid, lib, group) and keep its fingerprint in the history ring.
static inline int record(u32 tgid, u32 lib, u64 group, struct fp *f, int p2p) {
    struct gkey k = {};
    k.tgid = tgid;
    k.lib = lib;
    k.group = group;
    struct gstate zero = {};
    zero.first_ns = f->ns;
    struct gstate *g = groups.lookup_or_try_init(&k, &zero);
    if (!g) {
        count_lost();
        return 0;
    }
    g->enter_ns = f->ns;
    if (p2p) {
        __sync_fetch_and_add(&g->p2p, 1);
        return 0;
    }
    u64 seq = __sync_fetch_and_add(&g->calls, 1) + 1;
    if (lib == LIB_GLOO && TAG_OFF >= 0) {
        // The group's own collective counter (the tag nextTag() will hand out): equal on every
        // rank at the same position, however late we attached.
        // A read can fail (a page not resident at that instant): then the position after the
        // last one this group had, not the calls since attach, which a late attach undercounts.
        u32 tag = 0;
        if (bpf_probe_read_user(&tag, 4, (void *)(group + TAG_OFF)) == 0) seq = (u64)tag + 1;
        else if (g->seq) seq = g->seq + 1;
    }
    g->seq = seq;
    f->seq = seq;
    struct hkey h = {};
    h.g = k;
    h.slot = seq & (HIST - 1);
    hist.update(&h, f);
    return 0;
}

// ---------------------------------------------------------------- Gloo (c10d::ProcessGroupGloo)
// Itanium C++ ABI: these members return c10::intrusive_ptr<Work> by value through a hidden pointer
// in the first register, so `this` is PARM2 and the declared arguments start at PARM3.

static inline int gloo_enter(struct pt_regs *ctx, u32 op, u64 targ, int tkind, u64 opts, int has_redop,
                             int root_kind, u64 peer, int p2p) {
    u32 tgid;
    if (!job_rank(&tgid)) return 0;
    struct fp *f = new_fp(op);
    if (!f) return 0;
    read_tensor(f, targ, tkind);
    if (has_redop && opts) {
        u8 r = 0;
        if (bpf_probe_read_user(&r, 1, (void *)(opts + REDOP_OFF)) == 0) f->redop = r;
    }
    if (root_kind == 1 && opts) {  // BroadcastOptions: int64 rootRank first
        s64 root = -1;
        if (bpf_probe_read_user(&root, 8, (void *)opts) == 0) f->root = root;
    } else if (root_kind == 2 && opts) {  // ReduceOptions: ReduceOp, then int64 rootRank
        s64 root = -1;
        if (bpf_probe_read_user(&root, 8, (void *)(opts + REDUCE_ROOT_OFF)) == 0) f->root = root;
    } else if (root_kind == 3) {  // send / recv: the peer is an int argument
        f->root = (s32)peer;
    }
    return record(tgid, LIB_GLOO, PT_REGS_PARM2(ctx), f, p2p);
}

// op ids: keep in step with collectives.py OPS
int gloo_allreduce(struct pt_regs *ctx) { return gloo_enter(ctx, 1, PT_REGS_PARM3(ctx), T_VEC, PT_REGS_PARM4(ctx), 1, 0, 0, 0); }
int gloo_allreduce_coalesced(struct pt_regs *ctx) { return gloo_enter(ctx, 2, PT_REGS_PARM3(ctx), T_VEC, PT_REGS_PARM4(ctx), 1, 0, 0, 0); }
int gloo_broadcast(struct pt_regs *ctx) { return gloo_enter(ctx, 3, PT_REGS_PARM3(ctx), T_VEC, PT_REGS_PARM4(ctx), 0, 1, 0, 0); }
int gloo_reduce(struct pt_regs *ctx) { return gloo_enter(ctx, 4, PT_REGS_PARM3(ctx), T_VEC, PT_REGS_PARM4(ctx), 1, 2, 0, 0); }
int gloo_allgather(struct pt_regs *ctx) { return gloo_enter(ctx, 5, PT_REGS_PARM4(ctx), T_VEC, 0, 0, 0, 0, 0); }
int gloo_allgather_base(struct pt_regs *ctx) { return gloo_enter(ctx, 6, PT_REGS_PARM4(ctx), T_TENSOR, 0, 0, 0, 0, 0); }
int gloo_allgather_coalesced(struct pt_regs *ctx) { return gloo_enter(ctx, 7, PT_REGS_PARM4(ctx), T_VEC, 0, 0, 0, 0, 0); }
int gloo_allgather_into_tensor_coalesced(struct pt_regs *ctx) { return gloo_enter(ctx, 8, PT_REGS_PARM4(ctx), T_VEC, 0, 0, 0, 0, 0); }
int gloo_gather(struct pt_regs *ctx) { return gloo_enter(ctx, 9, PT_REGS_PARM4(ctx), T_VEC, 0, 0, 0, 0, 0); }
int gloo_scatter(struct pt_regs *ctx) { return gloo_enter(ctx, 10, PT_REGS_PARM3(ctx), T_VEC, 0, 0, 0, 0, 0); }
int gloo_reduce_scatter(struct pt_regs *ctx) { return gloo_enter(ctx, 11, PT_REGS_PARM3(ctx), T_VEC, PT_REGS_PARM5(ctx), 1, 0, 0, 0); }
int gloo_reduce_scatter_base(struct pt_regs *ctx) { return gloo_enter(ctx, 12, PT_REGS_PARM3(ctx), T_TENSOR, PT_REGS_PARM5(ctx), 1, 0, 0, 0); }
int gloo_reduce_scatter_tensor_coalesced(struct pt_regs *ctx) { return gloo_enter(ctx, 13, PT_REGS_PARM3(ctx), T_VEC, PT_REGS_PARM5(ctx), 1, 0, 0, 0); }
int gloo_alltoall_base(struct pt_regs *ctx) { return gloo_enter(ctx, 14, PT_REGS_PARM4(ctx), T_TENSOR, 0, 0, 0, 0, 0); }
int gloo_alltoall(struct pt_regs *ctx) { return gloo_enter(ctx, 15, PT_REGS_PARM4(ctx), T_VEC, 0, 0, 0, 0, 0); }
int gloo_barrier(struct pt_regs *ctx) { return gloo_enter(ctx, 16, 0, T_NONE, 0, 0, 0, 0, 0); }
int gloo_monitored_barrier(struct pt_regs *ctx) { return gloo_enter(ctx, 17, 0, T_NONE, 0, 0, 0, 0, 0); }
int gloo_send(struct pt_regs *ctx) { return gloo_enter(ctx, 18, PT_REGS_PARM3(ctx), T_VEC, 0, 0, 3, PT_REGS_PARM4(ctx), 1); }
int gloo_recv(struct pt_regs *ctx) { return gloo_enter(ctx, 19, PT_REGS_PARM3(ctx), T_VEC, 0, 0, 3, PT_REGS_PARM4(ctx), 1); }
int gloo_recv_anysource(struct pt_regs *ctx) { return gloo_enter(ctx, 20, PT_REGS_PARM3(ctx), T_VEC, 0, 0, 0, 0, 1); }

// AsyncWork::execute(work): a worker thread starts running one enqueued collective.
int gloo_work_start(struct pt_regs *ctx) {
    u32 tgid;
    if (!job_rank(&tgid)) return 0;
    u64 now = bpf_ktime_get_ns();
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct wstate wz = {};
    struct wstate *w = works.lookup_or_try_init(&tgid, &wz);
    if (w) {
        __sync_fetch_and_add(&w->started, 1);
        w->start_ns = now;
    }
    struct tstate t = {};
    t.start_ns = now;
    t.event_ns = now;
    t.recv_peer = -1;
    t.send_peer = -1;
    t.tgid = tgid;
    t.busy = 1;
    if (workers.update(&tid, &t)) count_lost();
    return 0;
}

static inline int work_end(int error) {
    u32 tgid;
    if (!job_rank(&tgid)) return 0;
    u64 now = bpf_ktime_get_ns();
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct tstate *t = workers.lookup(&tid);
    struct wstate wz = {};
    struct wstate *w = works.lookup_or_try_init(&tgid, &wz);
    if (w) {
        __sync_fetch_and_add(&w->done, 1);
        if (error) __sync_fetch_and_add(&w->errors, 1);
        w->done_ns = now;
        if (t) {
            w->last_sent = t->sent;
            w->last_recv = t->recvd;
        }
    }
    if (t) {
        t->busy = 0;
        t->event_ns = now;
    }
    return 0;
}

int gloo_work_done(struct pt_regs *ctx) { return work_end(0); }
int gloo_work_error(struct pt_regs *ctx) { return work_end(1); }

// gloo::transport::tcp::UnboundBuffer::{send,recv}(this, int peer, u64 slot, size_t offset, size_t nbytes)
// nbytes == ~0 means "the rest of the buffer": UnboundBuffer keeps {vptr, ptr, size}.
static inline int transport(struct pt_regs *ctx, int is_send) {
    u32 tgid;
    if (!job_rank(&tgid)) return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct tstate *t = workers.lookup(&tid);
    if (!t) return 0;  // not inside a collective we saw start (p2p, or attached mid-work)
    u64 nbytes = PT_REGS_PARM5(ctx);
    if (nbytes == ~0ULL) {
        u64 size = 0;
        bpf_probe_read_user(&size, 8, (void *)(PT_REGS_PARM1(ctx) + 16));
        u64 off = PT_REGS_PARM4(ctx);
        nbytes = size > off ? size - off : 0;
    }
    s32 peer = (s32)PT_REGS_PARM2(ctx);
    t->event_ns = bpf_ktime_get_ns();
    if (is_send) {
        t->sent += nbytes;
        t->send_peer = peer;
    } else {
        t->recvd += nbytes;
        t->recv_peer = peer;
    }
    return 0;
}

int gloo_tcp_send(struct pt_regs *ctx) { return transport(ctx, 1); }
int gloo_tcp_recv(struct pt_regs *ctx) { return transport(ctx, 0); }

// ---------------------------------------------------------------- NCCL (C API, x86-64 SysV)

static inline int nccl_enter(struct pt_regs *ctx, u32 op, u64 count, s32 dtype, s32 redop, s32 root,
                             u64 comm, int p2p) {
    u32 tgid;
    if (!job_rank(&tgid)) return 0;
    struct fp *f = new_fp(op);
    if (!f) return 0;
    f->count = count;
    f->dtype = dtype;
    f->redop = redop;
    f->root = root;
    f->ntensors = 1;
    record(tgid, LIB_NCCL, comm, f, p2p);
    struct gkey k = {};
    k.tgid = tgid;
    k.lib = LIB_NCCL;
    k.group = comm;
    struct gstate *g = groups.lookup(&k);
    struct wstate wz = {};
    struct wstate *w = works.lookup_or_try_init(&tgid, &wz);
    if (g) {
        g->inside = 1;
        g->depth = w ? w->group_depth : 0;
    }
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct call c = {};
    c.g = k;
    calls.update(&tid, &c);
    return 0;
}

static inline u64 stack_arg(struct pt_regs *ctx, int n) {
    // At function entry [sp] is the return address; the 7th argument is at sp+8, the 8th at sp+16.
    u64 v = 0;
    bpf_probe_read_user(&v, 8, (void *)(PT_REGS_SP(ctx) + 8 * n));
    return v;
}

// ncclAllReduce(send, recv, count, datatype, op, comm, stream)
int nccl_allreduce(struct pt_regs *ctx) { return nccl_enter(ctx, 1, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), -1, PT_REGS_PARM6(ctx), 0); }
// ncclBroadcast(send, recv, count, datatype, root, comm, stream)
int nccl_broadcast(struct pt_regs *ctx) { return nccl_enter(ctx, 3, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), -1, PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), 0); }
// ncclReduce(send, recv, count, datatype, op, root, comm, stream)
int nccl_reduce(struct pt_regs *ctx) { return nccl_enter(ctx, 4, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), stack_arg(ctx, 1), 0); }
// ncclAllGather(send, recv, sendcount, datatype, comm, stream)
int nccl_allgather(struct pt_regs *ctx) { return nccl_enter(ctx, 5, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), -1, -1, PT_REGS_PARM5(ctx), 0); }
// ncclGather(send, recv, count, datatype, root, comm, stream)
int nccl_gather(struct pt_regs *ctx) { return nccl_enter(ctx, 9, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), -1, PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), 0); }
// ncclScatter(send, recv, count, datatype, root, comm, stream)
int nccl_scatter(struct pt_regs *ctx) { return nccl_enter(ctx, 10, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), -1, PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), 0); }
// ncclReduceScatter(send, recv, recvcount, datatype, op, comm, stream)
int nccl_reduce_scatter(struct pt_regs *ctx) { return nccl_enter(ctx, 11, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), -1, PT_REGS_PARM6(ctx), 0); }
// ncclAlltoAll(send, recv, count, datatype, comm, stream)
int nccl_alltoall(struct pt_regs *ctx) { return nccl_enter(ctx, 15, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), -1, -1, PT_REGS_PARM5(ctx), 0); }
// ncclSend(send, count, datatype, peer, comm, stream) / ncclRecv(recv, count, datatype, peer, comm, stream)
int nccl_send(struct pt_regs *ctx) { return nccl_enter(ctx, 18, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), -1, PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), 1); }
int nccl_recv(struct pt_regs *ctx) { return nccl_enter(ctx, 19, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), -1, PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), 1); }

int nccl_return(struct pt_regs *ctx) {
    u32 tgid;
    if (!job_rank(&tgid)) return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct call *c = calls.lookup(&tid);
    if (!c) return 0;
    struct gkey k = c->g;
    calls.delete(&tid);
    struct gstate *g = groups.lookup(&k);
    if (g) {
        g->inside = 0;
        g->exit_ns = bpf_ktime_get_ns();
        g->ret = (s32)PT_REGS_RC(ctx);
    }
    return 0;
}

int nccl_group_start(struct pt_regs *ctx) {
    u32 tgid;
    if (!job_rank(&tgid)) return 0;
    struct wstate wz = {};
    struct wstate *w = works.lookup_or_try_init(&tgid, &wz);
    if (w) w->group_depth += 1;
    return 0;
}

int nccl_group_end(struct pt_regs *ctx) {
    u32 tgid;
    if (!job_rank(&tgid)) return 0;
    struct wstate wz = {};
    struct wstate *w = works.lookup_or_try_init(&tgid, &wz);
    if (w && w->group_depth > 0) w->group_depth -= 1;
    return 0;
}
