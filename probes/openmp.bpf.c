// OpenMP parallel regions of one process: uprobes on the fork entry point of its own runtime
// (GOMP_parallel in libgomp, __kmpc_fork_call in libiomp5) and where the region ends (the
// points are chosen for a cheap trap: profkit/probe_points.py). Regions go to an
// array read in bulk after the capture: a server can start thousands a second, and waking
// profkit for each one (a perf buffer) cost 0.035 cores on a 2-CPU machine, taken from the target.
// REGION_CAPACITY is substituted by profkit before compiling.
//
// With PYSTACK defined (and the PY_* layout of the target's interpreter, profkit/pyruntime),
// each region entry also reads the dispatching thread's Python frame chain and counts regions
// and their time per distinct stack in the kernel; the region log keeps only the stack's id.
#include <uapi/linux/ptrace.h>

struct region_start {
    u64 start_ns;
    u64 stack;  // 0: no Python stack
    u32 requested;
};

struct region {
    u64 start_ns;
    u64 end_ns;
    u64 stack;
    u32 tid;
    u32 requested;
};

BPF_HASH(open_regions, u32, struct region_start, 16384);
BPF_HISTOGRAM(duration_us_log2, int, 64);
BPF_HASH(per_thread, u32, u64, 16384);
BPF_ARRAY(region_log, struct region, REGION_CAPACITY);
BPF_ARRAY(region_count, u64, 1);
BPF_ARRAY(entry_count, u64, 1);  // against region_count: regions whose end was never seen

static inline void count_entry(void) {
    u32 zero = 0;
    u64 *entries = entry_count.lookup(&zero);
    if (entries)
        __sync_fetch_and_add(entries, 1);
}

#ifdef PYSTACK
#define PY_MAX_FRAMES 32
// Shim frames (the C stack re-entering the interpreter) are recorded with this bit set in their
// instruction index and dropped in user space: skipping them here made the loop too branchy for
// the verifier.
#define PY_SHIM_FRAME 0x80000000U

struct pystack {
    u64 code[PY_MAX_FRAMES];   // code object addresses, innermost first
    u32 instr[PY_MAX_FRAMES];  // instruction index in each code object
    u32 depth;
    u32 truncated;
};

struct pystack_stats {
    u64 regions;
    u64 region_ns;
};

// Filled by profkit from the interpreter's thread list: the "current thread" globals are NULL
// while torch runs an op with the GIL released, which is when regions start.
BPF_HASH(tstates, u32, u64, 16384);
BPF_PERCPU_ARRAY(pystack_scratch, struct pystack, 1);
BPF_HASH(pystacks, u64, struct pystack, 16384);
BPF_HASH(pystack_stats, u64, struct pystack_stats, 16384);
// 0 walked, 1 thread without a known thread state, 2 a read failed, 3 stack truncated,
// 4 no Python frame
BPF_ARRAY(walk_counts, u64, 5);

static inline void count_walk(u32 which) {
    u64 *n = walk_counts.lookup(&which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

// The stack's id: FNV-1a over its frames; 0 means "no stack".
static inline u64 walk_python(void) {
    u32 tid = bpf_get_current_pid_tgid();
    u64 *tstate = tstates.lookup(&tid);
    if (!tstate) {
        count_walk(1);
        return 0;
    }
    u32 zero = 0;
    struct pystack *s = pystack_scratch.lookup(&zero);
    if (!s)
        return 0;
    u64 frame = 0;
#if PY_FRAME_KIND == 2
    u64 cframe = 0;
    if (bpf_probe_read_user(&cframe, sizeof(cframe), (void *)(*tstate + PY_TSTATE_FRAME)) ||
        !cframe || bpf_probe_read_user(&frame, sizeof(frame), (void *)(cframe + PY_CFRAME_CURRENT))) {
        count_walk(2);
        return 0;
    }
#else
    if (bpf_probe_read_user(&frame, sizeof(frame), (void *)(*tstate + PY_TSTATE_FRAME))) {
        count_walk(2);
        return 0;
    }
#endif
    u8 buf[PY_FRAME_SPAN];
    u32 depth = 0;
    u64 hash = 14695981039346656037ULL;
    for (int i = 0; i < PY_MAX_FRAMES; i++) {
        if (!frame)
            break;
        // One read per frame: every field used lies within its first PY_FRAME_SPAN bytes.
        if (bpf_probe_read_user(buf, sizeof(buf), (void *)frame)) {
            count_walk(2);
            break;
        }
        u64 code = *(u64 *)(buf + PY_FRAME_CODE);
#if PY_FRAME_KIND == 1
        u32 instr = *(int *)(buf + PY_FRAME_INSTR);
#else
        u64 ip = *(u64 *)(buf + PY_FRAME_INSTR);
        u32 instr = (u32)((ip - code - PY_CODE_ADAPTIVE) / 2) & ~PY_SHIM_FRAME;
#endif
#if PY_FRAME_OWNER >= 0 && PY_OWNER_CSTACK >= 0
        if (buf[PY_FRAME_OWNER] == PY_OWNER_CSTACK)
            instr |= PY_SHIM_FRAME;
#endif
        s->code[i] = code;
        s->instr[i] = instr;
        hash = (hash ^ code) * 1099511628211ULL;
        hash = (hash ^ instr) * 1099511628211ULL;
        depth = i + 1;
        frame = *(u64 *)(buf + PY_FRAME_PREVIOUS);
    }
    s->truncated = frame != 0 && depth == PY_MAX_FRAMES;
    if (s->truncated)
        count_walk(3);
    if (depth == 0) {
        count_walk(4);
        return 0;
    }
    s->depth = depth;
    hash = (hash ^ depth) * 1099511628211ULL;
    if (hash == 0)
        hash = 1;
    if (!pystacks.lookup(&hash))
        pystacks.update(&hash, s);
    struct pystack_stats fresh = {};
    struct pystack_stats *stats = pystack_stats.lookup_or_try_init(&hash, &fresh);
    if (stats)
        __sync_fetch_and_add(&stats->regions, 1);
    count_walk(0);
    return hash;
}
#else
static inline u64 walk_python(void) { return 0; }
#endif

// GOMP_parallel(fn, data, num_threads, flags): 0 threads means "the runtime's setting".
int on_gomp_parallel(struct pt_regs *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    u32 requested = (u32)PT_REGS_PARM3(ctx);
    struct region_start start = {bpf_ktime_get_ns(), walk_python(), requested};
    open_regions.update(&tid, &start);
    count_entry();
    return 0;
}

// __kmpc_fork_call(loc, argc, microtask, ...): the team size is not an argument.
int on_kmpc_fork_call(struct pt_regs *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    struct region_start start = {bpf_ktime_get_ns(), walk_python(), 0};
    open_regions.update(&tid, &start);
    count_entry();
    return 0;
}

int on_region_return(struct pt_regs *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    struct region_start *start = open_regions.lookup(&tid);
    if (!start)
        return 0;  // entered before the probe was attached
    u64 now = bpf_ktime_get_ns();
    struct region r = {start->start_ns, now, start->stack, tid, start->requested};
    open_regions.delete(&tid);
#ifdef PYSTACK
    if (r.stack) {
        struct pystack_stats *stats = pystack_stats.lookup(&r.stack);
        if (stats)
            __sync_fetch_and_add(&stats->region_ns, now - r.start_ns);
    }
#endif
    duration_us_log2.increment(bpf_log2l((now - r.start_ns) / 1000));
    u64 zero = 0;
    u64 *count = per_thread.lookup_or_try_init(&tid, &zero);
    if (count)
        __sync_fetch_and_add(count, 1);
    u32 zero32 = 0;
    u64 *next = region_count.lookup(&zero32);
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
