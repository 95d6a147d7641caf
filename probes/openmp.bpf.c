// Parallel regions of one process: uprobes on the fork entry points of every pool runtime it maps
// (GOMP_parallel* in each libgomp, __kmpc_fork_call in libiomp5/libomp, exec_blas in OpenBLAS)
// and where each region ends (the points are chosen for a cheap trap: profkit/capture/ebpf/probe_points.py).
// Regions go to an array read in bulk after the capture: a server can start thousands a second,
// and waking profkit for each one (a perf buffer) cost CPU taken from the target
// (docs/results/ebpf-cost.md#the-region-log). REGION_CAPACITY is substituted, and one entry handler per runtime copy
// (on_entry_N, calling region_entry with the copy's index) appended, by profkit before compiling.
//
// With PYSTACK defined, this file follows pystack.bpf.c in one program: each region entry also
// reads the dispatching thread's Python frame chain, and regions and their time are counted per
// distinct stack in the kernel; the region log keeps only the stack's id.

struct region_start {
    u64 start_ns;
    u64 stack;  // 0: no Python stack
    u32 requested;
    u32 runtime;  // which probed copy of which runtime
};

struct region {
    u64 start_ns;
    u64 end_ns;
    u64 stack;
    u32 tid;
    u32 requested;
    u32 runtime;
    u32 pad;
};

// A thread's entry is written in place at each region's start and marked closed (start_ns 0)
// at its end, never deleted (an update and a delete a region took the hash's lock and free list
// twice); least recently used entries go first when it fills, so that the exited threads of a
// long capture make room. Sized as the CO-RE program's (core/process.bpf.c says why).
BPF_TABLE("lru_hash", u32, struct region_start, open_regions, 65536);
BPF_HISTOGRAM(duration_us_log2, int, 64);
BPF_ARRAY(region_log, struct region, REGION_CAPACITY);
BPF_ARRAY(region_count, u64, 1);
// Per runtime copy, for the cost of each copy's traps; their sum, against region_count, the
// regions whose end was never seen.
BPF_ARRAY(runtime_entries, u64, 64);

// The dispatching thread's Python stack, counted as one more region of it in this runtime copy.
static inline u64 region_stack(u32 runtime) {
#ifdef PYSTACK
    u64 stack = walk_python(1);
#ifdef COST_NO_STACK_MAPS
    return stack;
#endif
    if (stack) {
        struct pystack_key key = {stack, runtime, 0};
        struct pystack_stats fresh = {};
        struct pystack_stats *stats = pystack_stats.lookup_or_try_init(&key, &fresh);
        if (stats)
            __sync_fetch_and_add(&stats->regions, 1);
    }
    return stack;
#else
    return 0;
#endif
}

// requested: the team size asked for, 0 where the runtime decides (GOMP_parallel's num_threads
// of 0, __kmpc_fork_call, which has no such argument).
static inline int region_entry(u32 runtime, u32 requested) {
    u32 tid = bpf_get_current_pid_tgid();
    struct region_start start = {bpf_ktime_get_ns(), region_stack(runtime), requested, runtime};
    struct region_start *open = open_regions.lookup(&tid);
    if (open)
        *open = start;
    else
        open_regions.update(&tid, &start);
    u64 *mine = runtime_entries.lookup(&runtime);
    if (mine)
        __sync_fetch_and_add(mine, 1);
    return 0;
}

int on_region_return(struct pt_regs *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    struct region_start *start = open_regions.lookup(&tid);
    if (!start || !start->start_ns)
        return 0;  // entered before the probe was attached
    u64 now = bpf_ktime_get_ns();
    struct region r = {start->start_ns, now, start->stack, tid, start->requested, start->runtime};
    start->start_ns = 0;
#ifdef PYSTACK
    if (r.stack) {
        struct pystack_key key = {r.stack, r.runtime, 0};
        struct pystack_stats *stats = pystack_stats.lookup(&key);
        if (stats)
            __sync_fetch_and_add(&stats->region_ns, now - r.start_ns);
    }
#endif
    duration_us_log2.increment(bpf_log2l((now - r.start_ns) / 1000));
    u32 zero = 0;
    u64 *next = region_count.lookup(&zero);
    if (!next)
        return 0;
    u64 index = __sync_fetch_and_add(next, 1);
    if (index >= REGION_CAPACITY)
        return 0;  // counted: the reader reports count - capacity as lost
    u32 slot = index;
    struct region *entry = region_log.lookup(&slot);
    if (entry)
        *entry = r;
    return 0;
}
