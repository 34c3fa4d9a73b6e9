// scout-sys: what every BPF program of scout-sys shares, pasted in by _common.render() where a
// program says `#include "scout_common.bpf.h"`. Needs MAX_PIDS.
#include <uapi/linux/ptrace.h>

BPF_HASH(pids, u32, u32, MAX_PIDS);  // tgid -> rank; the kernel-side filter, filled from user space
BPF_ARRAY(lost, u64, 1);             // updates dropped because a bounded map was full

static inline void count_lost(void) {
    int z = 0;
    u64 *l = lost.lookup(&z);
    if (l) __sync_fetch_and_add(l, 1);
}
