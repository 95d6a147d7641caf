// The CPython stack walker (compiled with PYSTACK and the PY_* layout of the target's
// interpreter, profkit/host/pyruntime): reads a thread's Python frame chain without stopping it and
// stores each distinct stack once. openmp.bpf.c calls it at region entries; on_cpu_sample calls
// it on a cpu-clock event to sample the target's Python threads on CPU.
// TARGET_TGID and SAMPLE_CAPACITY are substituted by profkit before compiling.
#include <uapi/linux/ptrace.h>

#ifdef PYSTACK
#include "pywalk.h"

struct pystack_stats {
    u64 regions;
    u64 region_ns;
};

// Counted per stack and per runtime copy: a reader of the counters alone (watch) must not mix
// an OpenBLAS pool's regions into an OpenMP pool's call sites.
struct pystack_key {
    u64 stack;
    u32 runtime;
    u32 pad;
};

// Filled by profkit from the interpreter's thread list: the "current thread" globals are NULL
// while torch runs an op with the GIL released, which is when regions start.
BPF_HASH(tstates, u32, u64, 16384);
BPF_PERCPU_ARRAY(pystack_scratch, struct pystack, 1);
BPF_HASH(pystacks, u64, struct pystack, 16384);
BPF_HASH(pystack_stats, struct pystack_key, struct pystack_stats, 16384);
// 0 walked, 1 thread without a known thread state, 2 a read failed, 3 stack truncated,
// 4 no Python frame
BPF_ARRAY(walk_counts, u64, 5);

static inline void count_walk(u32 which) {
    u64 *n = walk_counts.lookup(&which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

// The stack's id (pywalk.h), stored once; 0 means "no stack". The thread state may be another
// thread's of the same process (a pool worker's sample reads its dispatcher's stack): the
// frames are read from the process's memory, which every thread of it shares.
static inline u64 walk_tstate(u64 *tstate) {
    u32 zero = 0;
    struct pystack *s = pystack_scratch.lookup(&zero);
    if (!s)
        return 0;
    struct pywalk walked = py_walk(*tstate, s);
    if (walked.failed)
        count_walk(2);
    if (s->truncated)
        count_walk(3);
    if (!walked.hash) {
        if (walked.reached)
            count_walk(4);
        return 0;
    }
    u64 hash = walked.hash;
#ifndef COST_NO_STACK_MAPS  // benchmarks/region_cost.py: the walk without its map updates
    if (!pystacks.lookup(&hash))
        pystacks.update(&hash, s);
    count_walk(0);
#endif
    return hash;
}

// The current thread's own stack.
static inline u64 walk_python(int count_missing) {
    u32 tid = bpf_get_current_pid_tgid();
    u64 *tstate = tstates.lookup(&tid);
    if (!tstate) {
        if (count_missing)
            count_walk(1);
        return 0;
    }
#ifdef COST_LOOKUP_ONLY
    return 0;  // benchmarks/region_cost.py: the thread-state lookup without the walk
#endif
    return walk_tstate(tstate);
}

// On-CPU samples of the target's threads, without stopping them: a cpu-clock event on every
// CPU runs this; other processes return at once. Compiled with NATIVE_STACKS (where perf record
// is not in the capture) every thread of the target is sampled with its kernel and user stacks,
// which the kernel walks by frame pointers as perf record's fp call graphs do; without it every
// thread is sampled with its Python stack only, and native stacks are left to perf.
//
// A sample of a thread that is not a Python thread (a pool worker) carries its dispatcher's
// Python stack as it is at that instant: the dispatcher waits inside the op that started the
// region, its current frame unchanged, so worker CPU is placed by samples at any region rate,
// with no probe per region. The dispatcher is the Python thread that last woke the worker
// (libgomp keeps one pool per master thread, whose workers that master wakes), or, before any
// wakeup was seen, the process's only Python thread where it has one.
#define DISPATCH_NONE 0
#define DISPATCH_WOKEN 1  // the Python thread that last woke this thread
#define DISPATCH_SOLE 2   // the process's only Python thread

struct pysample {
    u64 t_ns;
    u64 stack;   // the Python stack's id (the dispatcher's for a worker), 0 for none
    u64 native;  // the native stack's id in native_stacks, 0 for none
    u32 tid;
    u32 python;  // the thread has a thread state: a Python thread
    u32 dispatcher;  // whose stack `stack` is, for a thread that is not a Python thread
    u32 dispatch;    // how that thread was chosen: DISPATCH_*
};

BPF_ARRAY(sample_log, struct pysample, SAMPLE_CAPACITY);
BPF_ARRAY(sample_count, u64, 1);
// Filled by profkit from the interpreter's thread list: its one thread's id, 0 with several.
BPF_ARRAY(sole_python, u32, 1);

static inline u32 sole_dispatcher(u32 *how) {
    u32 zero = 0;
    u32 *sole = sole_python.lookup(&zero);
    if (sole && *sole) {
        *how = DISPATCH_SOLE;
        return *sole;
    }
    return 0;
}

#ifdef DISPATCH_WAKEUPS
// Defined where the scheduler's tracepoints fit the budget: this one also runs on every wakeup
// of the machine.
// Non-Python thread -> the Python thread of the target that last woke it. LRU: a Python thread
// also wakes other processes' threads, which must not crowd out the pool's.
BPF_TABLE("lru_hash", u32, u32, woken_by, 16384);

// sched_waking runs in the waker's context (sched_wakeup may run on the wakee's CPU).
TRACEPOINT_PROBE(sched, sched_waking) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((pid_tgid >> 32) != TARGET_TGID)
        return 0;
    u32 waker = pid_tgid;
    u32 wakee = args->pid;
    // Only a Python thread waking a thread that is not one: a worker waking a worker at a
    // barrier must not replace the master that owns both.
    if (!tstates.lookup(&waker) || tstates.lookup(&wakee))
        return 0;
    u32 *known = woken_by.lookup(&wakee);
    if (!known || *known != waker)
        woken_by.update(&wakee, &waker);
    return 0;
}

// The Python thread whose stack stands for this non-Python thread's sample, 0 for none.
static inline u32 dispatcher_of(u32 tid, u32 *how) {
    u32 *waker = woken_by.lookup(&tid);
    if (waker) {
        *how = DISPATCH_WOKEN;
        return *waker;
    }
    return sole_dispatcher(how);
}
#else
static inline u32 dispatcher_of(u32 tid, u32 *how) { return sole_dispatcher(how); }
#endif

#ifdef NATIVE_STACKS
// Each distinct stack is stored once, keyed by a 64-bit hash of its frames, as the Python
// stacks are: the kernel's stack-trace map keys on a bucket of a 32-bit hash and refuses a
// second stack that lands in a taken bucket, which with a few hundred stacks happens most
// captures and would lose every sample of that stack.
#define NATIVE_USER_FRAMES 48
#define NATIVE_KERNEL_FRAMES 24
struct nstack {
    u64 user[NATIVE_USER_FRAMES];      // leaf first
    u64 kernel[NATIVE_KERNEL_FRAMES];  // leaf first
    u32 user_depth;
    u32 kernel_depth;
};
BPF_PERCPU_ARRAY(nstack_scratch, struct nstack, 1);
BPF_HASH(native_stacks, u64, struct nstack, NATIVE_STACKS);
// 0 samples whose stack did not fit the map, 1 samples with no stack at all
BPF_ARRAY(native_counts, u64, 2);

static inline void count_native(u32 which) {
    u64 *n = native_counts.lookup(&which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static inline u64 native_stack(void *ctx) {
    u32 zero = 0;
    struct nstack *s = nstack_scratch.lookup(&zero);
    if (!s)
        return 0;
    long user = bpf_get_stack(ctx, s->user, sizeof(s->user), BPF_F_USER_STACK);
    long kernel = bpf_get_stack(ctx, s->kernel, sizeof(s->kernel), 0);
    s->user_depth = user > 0 ? (u64)user / 8 : 0;
    s->kernel_depth = kernel > 0 ? (u64)kernel / 8 : 0;
    if (!s->user_depth && !s->kernel_depth) {
        count_native(1);
        return 0;
    }
    u64 hash = 14695981039346656037ULL;
    for (int i = 0; i < NATIVE_USER_FRAMES; i++) {
        if (i >= s->user_depth)
            break;
        hash = (hash ^ s->user[i]) * 1099511628211ULL;
    }
    hash = (hash ^ s->user_depth) * 1099511628211ULL;
    for (int i = 0; i < NATIVE_KERNEL_FRAMES; i++) {
        if (i >= s->kernel_depth)
            break;
        hash = (hash ^ s->kernel[i]) * 1099511628211ULL;
    }
    hash = (hash ^ s->kernel_depth) * 1099511628211ULL;
    if (hash == 0)
        hash = 1;
    if (!native_stacks.lookup(&hash) && native_stacks.insert(&hash, s) &&
        !native_stacks.lookup(&hash)) {
        count_native(0);  // the map is full
        return 0;
    }
    return hash;
}
#endif

// The context's registers are not read, so its type is left out: including
// <uapi/linux/bpf_perf_event.h> tripled the program's compile time.
int on_cpu_sample(void *ctx) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((pid_tgid >> 32) != TARGET_TGID)
        return 0;
    u32 tid = pid_tgid;
    struct pysample sample = {};
    u64 *tstate = tstates.lookup(&tid);
    sample.python = tstate ? 1 : 0;
    if (!tstate) {
        u32 how = DISPATCH_NONE;
        u32 dispatcher = dispatcher_of(tid, &how);
        if (dispatcher)
            tstate = tstates.lookup(&dispatcher);
        if (tstate) {
            sample.dispatcher = dispatcher;
            sample.dispatch = how;
        }
    }
#ifdef NATIVE_STACKS
    sample.native = native_stack(ctx);
#endif
    sample.t_ns = bpf_ktime_get_ns();
    sample.stack = tstate ? walk_tstate(tstate) : 0;
    sample.tid = tid;
    u32 zero = 0;
    u64 *next = sample_count.lookup(&zero);
    if (!next)
        return 0;
    u64 index = __sync_fetch_and_add(next, 1);
    if (index >= SAMPLE_CAPACITY)
        return 0;  // counted: the reader reports count - capacity as lost
    u32 slot = index;
    struct pysample *entry = sample_log.lookup(&slot);
    if (entry)
        *entry = sample;
    return 0;
}
#else
static inline u64 walk_python(int count_missing) { return 0; }
#endif

