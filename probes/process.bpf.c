// The target's process program: one source for both loaders.
// - the on-CPU sampler: every thread of the target sampled on a cpu-clock event, a Python
//   thread with its own Python stack, any other thread (a pool worker) with its dispatcher's,
//   and native kernel and user stacks;
// - the parallel-region probes: an entry program and an end program for every runtime copy
//   (profkit/capture/ebpf/placement/regions.py says where they go);
// - the scheduler's tracepoints: on-CPU slices, off-CPU time by Python stack, who wakes whom;
// - an empty uprobe program with which profkit measures what a trap costs on this machine.
//
// Built ahead of time into process.bpf.o (CO-RE: `make probes`), which the loader relocates
// against the running kernel's BTF. Where the kernel has no BTF, bcc compiles text made from
// this file by profkit/capture/ebpf/loaders/bcc_source.py, so this file keeps to what that
// translation knows:
// - maps are libbpf's BTF map definitions, one block each (type, max_entries, key, value);
// - maps are used only as bpf_map_lookup_elem(&map, key) and bpf_map_update_elem(&map, key,
//   value, BPF_ANY or BPF_NOEXIST), never passed around as pointers;
// - what the target and its interpreter set is read from the one read-only global, `cfg`,
//   which bcc gets as numbers;
// - what only one loader can express (includes, kernel types read through BTF, the
//   tracepoints' arguments, the region entry's attach cookie) lies in the PROFKIT_BCC blocks.
// Nothing else differs: a change to a program is made once.

#ifndef PROFKIT_BCC
#include <linux/types.h>
#include <linux/bpf.h>
#include <asm/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

typedef __u8 u8;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;

char LICENSE[] SEC("license") = "GPL";
#else
#include <uapi/linux/ptrace.h>
#define barrier_var(var) asm volatile("" : "+r"(var))
#endif

// benchmarks/region_cost.py measures a region's cost part by part: these leave out what follows
// each part (an enum, so that its values reach user space in the object's BTF).
enum cost_parts {
    COST_LOOKUP_ONLY = 1,  // the thread-state lookup, no walk
    COST_NO_STACK_MAPS = 2,  // the walk, without storing the stack
};

// The one read-only global. The loader fills it before load: what bcc substitutes into its
// text (the target, the interpreter's layout, capacities, switches) is the same values.
struct process_config {
    u32 target_tgid;
    u32 sample_capacity;
    u32 region_capacity;
    u32 slice_capacity;
    u32 native_stacks_on;
    u32 walker_on;
    // The interpreter's layout (profkit/host/pyruntime), for pywalk.h.
    u32 py_frame_kind;  // 1 frameobject, 2 cframe, 3 direct
    u32 py_tstate_frame;
    u32 py_cframe_current;
    u32 py_frame_code;
    u32 py_frame_previous;
    u32 py_frame_instr;
    s32 py_frame_owner;
    s32 py_owner_cstack;
    u32 py_code_adaptive;
    u32 py_frame_span;
    u32 py_code_tag;  // low bits of a frame's code reference that tag it (3.14: a _PyStackRef)
    // benchmarks/region_cost.py's parts of a region's cost; 0 in a capture.
    enum cost_parts cost_parts;
};

const volatile struct process_config cfg = {};

#define PY_FRAME_KIND cfg.py_frame_kind
#define PY_TSTATE_FRAME cfg.py_tstate_frame
#define PY_CFRAME_CURRENT cfg.py_cframe_current
#define PY_FRAME_CODE cfg.py_frame_code
#define PY_FRAME_PREVIOUS cfg.py_frame_previous
#define PY_FRAME_INSTR cfg.py_frame_instr
#define PY_FRAME_OWNER cfg.py_frame_owner
#define PY_OWNER_CSTACK cfg.py_owner_cstack
#define PY_CODE_ADAPTIVE cfg.py_code_adaptive
#define PY_FRAME_SPAN cfg.py_frame_span
#define PY_CODE_TAG cfg.py_code_tag
#include "pywalk.h"

// --- The Python stack walker ---

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
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, u64);
} tstates SEC(".maps");

// One scratch per kind of program and CPU: the sampler (a perf event, in hard interrupt) can fire
// in the middle of a region probe's walk on the same CPU, and a shared scratch would store the
// sampler's frames under the probe's stack id.
#define SCRATCH_SAMPLER 0
#define SCRATCH_PROBES 1
#define SCRATCH_SCHED 2
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 3);
    __type(key, u32);
    __type(value, struct pyscratch);
} pystack_scratch SEC(".maps");

// Each distinct stack once (3 KB at the bound of 256 frames), allocated as stacks are first
// seen rather than all at load: a capture holds some hundreds or thousands of them. Kernels
// before 6.1 refuse such a map in a perf-event program: the loaders make it preallocated there,
// with fewer entries (program.py, stack_map).
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, u64);
    __type(value, struct pystack);
} pystacks SEC(".maps");

// Regions and their time per (stack, runtime copy), counted by the region probes.
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct pystack_key);
    __type(value, struct pystack_stats);
} pystack_stats SEC(".maps");

// 0 walked, 1 thread without a known thread state, 2 a read failed, 3 stack truncated,
// 4 no Python frame
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 5);
    __type(key, u32);
    __type(value, u64);
} walk_counts SEC(".maps");

static __always_inline void count_walk(u32 which) {
    u64 *n = bpf_map_lookup_elem(&walk_counts, &which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

// The stack's id (pywalk.h), stored once; 0 means "no stack". The thread state may be another
// thread's of the same process (a pool worker's sample reads its dispatcher's stack): the
// frames are read from the process's memory, which every thread of it shares.
static __always_inline u64 walk_tstate(u64 tstate, u32 scratch) {
    struct pyscratch *sc = bpf_map_lookup_elem(&pystack_scratch, &scratch);
    if (!sc)
        return 0;
    struct pystack *s = &sc->stack;
    struct pywalk walked = py_walk(tstate, sc);
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
    if (cfg.cost_parts & COST_NO_STACK_MAPS)
        return hash;
    if (!bpf_map_lookup_elem(&pystacks, &hash))
        bpf_map_update_elem(&pystacks, &hash, s, BPF_ANY);
    count_walk(0);
    return hash;
}

// The current thread's own stack; a thread the map does not hold is counted where asked.
static __always_inline u64 walk_python(u32 count_missing, u32 scratch) {
    if (!cfg.walker_on)
        return 0;
    u32 tid = bpf_get_current_pid_tgid();
    u64 *tstate = bpf_map_lookup_elem(&tstates, &tid);
    if (!tstate) {
        if (count_missing)
            count_walk(1);
        return 0;
    }
    if (cfg.cost_parts & COST_LOOKUP_ONLY)
        return 0;
    return walk_tstate(*tstate, scratch);
}

// --- The on-CPU sampler ---
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
    u64 stack;       // the Python stack's id (the dispatcher's for a worker), 0 for none
    u64 native;      // the native stack's id in native_stacks, 0 for none
    u32 tid;
    u32 python;      // the thread has a thread state: a Python thread
    u32 dispatcher;  // whose stack `stack` is, for a thread that is not a Python thread
    u32 dispatch;    // how that thread was chosen: DISPATCH_*
};

// Each distinct native stack is stored once, keyed by a 64-bit hash of its frames, as the
// Python stacks are: the kernel's stack-trace map keys on a bucket of a 32-bit hash and refuses
// a second stack that lands in a taken bucket, which with a few hundred stacks happens most
// captures and would lose every sample of that stack.
#define NATIVE_USER_FRAMES 48
#define NATIVE_KERNEL_FRAMES 24
struct nstack {
    u64 user[NATIVE_USER_FRAMES];      // leaf first
    u64 kernel[NATIVE_KERNEL_FRAMES];  // leaf first
    u32 user_depth;
    u32 kernel_depth;
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);  // set before load: the sample capacity
    __type(key, u32);
    __type(value, struct pysample);
} sample_log SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} sample_count SEC(".maps");

// Filled by profkit from the interpreter's thread list: its one thread's id, 0 with several.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u32);
} sole_python SEC(".maps");

// Non-Python thread -> the Python thread of the target that last woke it (sched_waking, where
// the scheduler is traced). LRU: a Python thread also wakes other processes' threads, which
// must not crowd out the pool's.
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, u32);
} woken_by SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct nstack);
} nstack_scratch SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1);  // set before load: the native stacks kept
    __type(key, u64);
    __type(value, struct nstack);
} native_stacks SEC(".maps");

// 0 samples whose stack did not fit the map, 1 samples with no stack at all
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, u32);
    __type(value, u64);
} native_counts SEC(".maps");

static __always_inline void count_native(u32 which) {
    u64 *n = bpf_map_lookup_elem(&native_counts, &which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static __always_inline u64 native_stack(void *ctx) {
    u32 zero = 0;
    struct nstack *s = bpf_map_lookup_elem(&nstack_scratch, &zero);
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
    if (!bpf_map_lookup_elem(&native_stacks, &hash) &&
        bpf_map_update_elem(&native_stacks, &hash, s, BPF_NOEXIST) &&
        !bpf_map_lookup_elem(&native_stacks, &hash)) {
        count_native(0);  // the map is full
        return 0;
    }
    return hash;
}

// The Python thread whose stack stands for this non-Python thread's sample, 0 for none.
static __always_inline u32 dispatcher_of(u32 tid, u32 *how) {
    u32 *waker = bpf_map_lookup_elem(&woken_by, &tid);
    if (waker) {
        *how = DISPATCH_WOKEN;
        return *waker;
    }
    u32 zero = 0;
    u32 *sole = bpf_map_lookup_elem(&sole_python, &zero);
    if (sole && *sole) {
        *how = DISPATCH_SOLE;
        return *sole;
    }
    return 0;
}

// Every CPU's cpu-clock event runs this; other processes return at once. The context is only
// handed to bpf_get_stack, so its type is left out.
SEC("perf_event")
int on_cpu_sample(void *ctx) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((pid_tgid >> 32) != cfg.target_tgid)
        return 0;
    u32 tid = pid_tgid;
    struct pysample sample = {};
    u64 *tstate = cfg.walker_on ? bpf_map_lookup_elem(&tstates, &tid) : 0;
    sample.python = tstate ? 1 : 0;
    if (cfg.walker_on && !tstate) {
        u32 how = DISPATCH_NONE;
        u32 dispatcher = dispatcher_of(tid, &how);
        if (dispatcher)
            tstate = bpf_map_lookup_elem(&tstates, &dispatcher);
        if (tstate) {
            sample.dispatcher = dispatcher;
            sample.dispatch = how;
        }
    }
    if (cfg.native_stacks_on)
        sample.native = native_stack(ctx);
    sample.t_ns = bpf_ktime_get_ns();
    sample.stack = tstate ? walk_tstate(*tstate, SCRATCH_SAMPLER) : 0;
    sample.tid = tid;
    u32 zero = 0;
    u64 *next = bpf_map_lookup_elem(&sample_count, &zero);
    if (!next)
        return 0;
    u64 index = __sync_fetch_and_add(next, 1);
    if (index >= cfg.sample_capacity)
        return 0;  // counted: the reader reports count - capacity as lost
    u32 slot = index;
    struct pysample *entry = bpf_map_lookup_elem(&sample_log, &slot);
    if (entry)
        *entry = sample;
    return 0;
}

// --- Parallel regions ---
//
// Regions go to an array read in bulk after the capture: a server can start thousands a
// second, and waking profkit for each one (a perf buffer) cost CPU taken from the target
// (docs/results/ebpf-cost.md#the-region-log).

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
// at its end, never deleted: an update and a delete a region took the hash's lock and free
// list twice. Least recently used entries go first when it fills, so that the exited threads
// of a long capture make room. Sized well past the threads of one process because each CPU
// holds a batch of the LRU's free entries (128): on a machine of a hundred CPUs a map of 16 384
// could evict live entries long before it held that many threads.
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, u32);
    __type(value, struct region_start);
} open_regions SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 64);
    __type(key, u32);
    __type(value, u64);
} duration_us_log2 SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);  // set before load: the region capacity
    __type(key, u32);
    __type(value, struct region);
} region_log SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} region_count SEC(".maps");

// Per runtime copy, for the region rate each copy's probes cost; their sum, against
// region_count, the regions whose end was never seen.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 64);
    __type(key, u32);
    __type(value, u64);
} runtime_entries SEC(".maps");

// An entry's cookie: the runtime copy's index in its lower 16 bits, and above them where the
// team size asked for is: REQUESTED_PARM1 for exec_blas(num, queue), REQUESTED_PARM3 for
// GOMP_parallel*(fn, data, num_threads, ...), REQUESTED_NONE where the runtime decides.
#define REQUESTED_NONE 0
#define REQUESTED_PARM1 1
#define REQUESTED_PARM3 3

// bcc's bpf_log2l: floor(log2(v)) + 1, and 1 for 0.
static __always_inline u32 log2_u64(u64 v) {
    u32 r = 1;
    for (int i = 0; i < 63; i++) {
        if (v <= 1)
            break;
        v >>= 1;
        r++;
    }
    return r;
}

static __always_inline int region_entry(struct pt_regs *ctx, u64 cookie) {
    u32 runtime = cookie & 0xffff;
    u32 where = (cookie >> 16) & 0xffff;
    // Both read before the choice: the verifier refuses a context read at an offset the
    // compiler picked in a branch.
    u32 parm1 = PT_REGS_PARM1(ctx);
    u32 parm3 = PT_REGS_PARM3(ctx);
    barrier_var(parm1);
    barrier_var(parm3);
    u32 requested = where == REQUESTED_PARM1 ? parm1 : where == REQUESTED_PARM3 ? parm3 : 0;
    u32 tid = bpf_get_current_pid_tgid();
    u64 stack = walk_python(1, SCRATCH_PROBES);
    if (stack) {
        struct pystack_key key = {stack, runtime, 0};
        struct pystack_stats *stats = bpf_map_lookup_elem(&pystack_stats, &key);
        if (!stats) {
            struct pystack_stats fresh = {};
            bpf_map_update_elem(&pystack_stats, &key, &fresh, BPF_NOEXIST);
            stats = bpf_map_lookup_elem(&pystack_stats, &key);
        }
        if (stats)
            __sync_fetch_and_add(&stats->regions, 1);
    }
    struct region_start start = {bpf_ktime_get_ns(), stack, requested, runtime};
    struct region_start *open = bpf_map_lookup_elem(&open_regions, &tid);
    if (open)
        *open = start;
    else
        bpf_map_update_elem(&open_regions, &tid, &start, BPF_ANY);
    u64 *entries = bpf_map_lookup_elem(&runtime_entries, &runtime);
    if (entries)
        __sync_fetch_and_add(entries, 1);
    return 0;
}

#ifndef PROFKIT_BCC
// One entry program for every copy: each attachment tells it its copy by its cookie. (bcc has
// no cookies: it compiles one entry program per copy, on_entry_N, with the cookie in it.)
SEC("uprobe")
int on_region_entry(struct pt_regs *ctx) {
    return region_entry(ctx, bpf_get_attach_cookie(ctx));
}
#endif

SEC("uprobe")
int on_region_return(struct pt_regs *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    struct region_start *start = bpf_map_lookup_elem(&open_regions, &tid);
    if (!start || !start->start_ns)
        return 0;  // entered before the probe was attached
    u64 now = bpf_ktime_get_ns();
    struct region r = {start->start_ns, now, start->stack, tid, start->requested, start->runtime};
    start->start_ns = 0;
    if (r.stack) {
        struct pystack_key key = {r.stack, r.runtime, 0};
        struct pystack_stats *stats = bpf_map_lookup_elem(&pystack_stats, &key);
        if (stats)
            __sync_fetch_and_add(&stats->region_ns, now - r.start_ns);
    }
    u32 slot = log2_u64((now - r.start_ns) / 1000);
    u64 *bucket = bpf_map_lookup_elem(&duration_us_log2, &slot);
    if (bucket)
        __sync_fetch_and_add(bucket, 1);
    u32 zero = 0;
    u64 *next = bpf_map_lookup_elem(&region_count, &zero);
    if (!next)
        return 0;
    u64 index = __sync_fetch_and_add(next, 1);
    if (index >= cfg.region_capacity)
        return 0;  // counted: the reader reports count - capacity as lost
    slot = index;
    struct region *entry = bpf_map_lookup_elem(&region_log, &slot);
    if (entry)
        *entry = r;
    return 0;
}

// Attached, for a moment, to a function of profkit's own process: the program does nothing,
// so what a call costs with it on beyond what it costs with it off is the trap alone
// (profkit/capture/ebpf/costs.py).
SEC("uprobe")
int on_calibrate(struct pt_regs *ctx) {
    return 0;
}

// --- The scheduler ---

struct thread_time {
    u64 oncpu_ns;
    u64 offcpu_ns;
    u64 last_in_ns;
    u64 last_out_ns;
    u64 voluntary;
    u64 involuntary;
    u64 off_stack;  // the Python stack the thread left the CPU with, 0 for none
};

struct offcpu_key {
    u64 stack;
    u32 tid;
    u32 pad;
};

struct offcpu_time {
    u64 ns;
    u64 switches;
};

struct wake_key {
    u32 waker;
    u32 wakee;
};

struct slice {
    u64 start_ns;
    u64 end_ns;
    u32 tid;
    u32 voluntary;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, struct thread_time);
} times SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, struct wake_key);
    __type(value, u64);
} wakeups SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);  // set before load: the slice capacity
    __type(key, u32);
    __type(value, struct slice);
} slice_log SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} slice_count SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct offcpu_key);
    __type(value, struct offcpu_time);
} pystack_offcpu SEC(".maps");

static __always_inline void log_slice(u64 start, u64 end, u32 tid, u32 voluntary) {
    u32 zero = 0;
    u64 *count = bpf_map_lookup_elem(&slice_count, &zero);
    if (!count)
        return;
    u64 index = __sync_fetch_and_add(count, 1);
    if (index >= cfg.slice_capacity)
        return;  // counted: the reader reports count - capacity as lost
    u32 slot = index;
    struct slice *s = bpf_map_lookup_elem(&slice_log, &slot);
    if (s) {
        s->start_ns = start;
        s->end_ns = end;
        s->tid = tid;
        s->voluntary = voluntary;
    }
}

// A context switch from prev to next. voluntary: prev gave the CPU up in a state other than
// running (as the kernel counts nvcsw); a preempted thread's state is ignored.
static __always_inline int switched(u32 prev, u32 next, u32 voluntary) {
    u64 now = bpf_ktime_get_ns();
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    // The outgoing task is `current`, so its process is known for certain.
    if (tgid == cfg.target_tgid && prev != 0) {
        struct thread_time *t = bpf_map_lookup_elem(&times, &prev);
        if (!t) {
            struct thread_time fresh = {};
            bpf_map_update_elem(&times, &prev, &fresh, BPF_NOEXIST);
            t = bpf_map_lookup_elem(&times, &prev);
        }
        if (t) {
            if (t->last_in_ns) {
                t->oncpu_ns += now - t->last_in_ns;
                if (cfg.slice_capacity > 1)
                    log_slice(t->last_in_ns, now, prev, voluntary);
            }
            t->last_out_ns = now;
            t->last_in_ns = 0;
            t->off_stack = walk_python(0, SCRATCH_SCHED);
            if (voluntary)
                t->voluntary++;
            else
                t->involuntary++;
        }
    }
    // The incoming task is known only once it has run for the target (or was seeded).
    struct thread_time *n = bpf_map_lookup_elem(&times, &next);
    if (n) {
        if (n->last_out_ns) {
            n->offcpu_ns += now - n->last_out_ns;
            if (n->off_stack) {
                struct offcpu_key key = {n->off_stack, next, 0};
                struct offcpu_time *off = bpf_map_lookup_elem(&pystack_offcpu, &key);
                if (!off) {
                    struct offcpu_time fresh = {};
                    bpf_map_update_elem(&pystack_offcpu, &key, &fresh, BPF_NOEXIST);
                    off = bpf_map_lookup_elem(&pystack_offcpu, &key);
                }
                if (off) {
                    __sync_fetch_and_add(&off->ns, now - n->last_out_ns);
                    __sync_fetch_and_add(&off->switches, 1);
                }
                n->off_stack = 0;
            }
        }
        n->last_in_ns = now;
    }
    return 0;
}

// A wakeup of wakee, counted where the waker is the target's or the wakee a thread of it.
static __always_inline int woke(u32 wakee) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((pid_tgid >> 32) != cfg.target_tgid && !bpf_map_lookup_elem(&times, &wakee))
        return 0;
    struct wake_key key = {(u32)pid_tgid, wakee};
    u64 *count = bpf_map_lookup_elem(&wakeups, &key);
    if (!count) {
        u64 zero = 0;
        bpf_map_update_elem(&wakeups, &key, &zero, BPF_NOEXIST);
        count = bpf_map_lookup_elem(&wakeups, &key);
    }
    if (count)
        __sync_fetch_and_add(count, 1);
    return 0;
}

// sched_waking runs in the waker's context (sched_wakeup may run on the wakee's CPU): a Python
// thread of the target waking a thread that is not one is that thread's dispatcher. A worker
// waking a worker at a barrier must not replace the master that owns both.
static __always_inline int waking(u32 wakee) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((pid_tgid >> 32) != cfg.target_tgid)
        return 0;
    u32 waker = pid_tgid;
    if (!bpf_map_lookup_elem(&tstates, &waker) || bpf_map_lookup_elem(&tstates, &wakee))
        return 0;
    u32 *known = bpf_map_lookup_elem(&woken_by, &wakee);
    if (!known || *known != waker)
        bpf_map_update_elem(&woken_by, &wakee, &waker, BPF_ANY);
    return 0;
}

#ifndef PROFKIT_BCC
// BTF tracepoints: attached through BTF alone, where tracefs (which a classic tracepoint's id
// is read from) is not mounted, as on many GPU and Kubernetes nodes. Their arguments are the
// kernel's task structs, read through CO-RE.
struct task_struct {
    int pid;
    unsigned int __state;  // 5.14 on
} __attribute__((preserve_access_index));

// Before 5.14 the state was `long state`.
struct task_struct___old {
    long state;
} __attribute__((preserve_access_index));

static __always_inline long task_state(struct task_struct *task) {
    if (bpf_core_field_exists(task->__state))
        return BPF_CORE_READ(task, __state);
    return BPF_CORE_READ((struct task_struct___old *)task, state);
}

SEC("tp_btf/sched_switch")
int on_switch(u64 *ctx) {
    u32 preempt = (u32)ctx[0];
    struct task_struct *prev = (struct task_struct *)ctx[1];
    struct task_struct *next = (struct task_struct *)ctx[2];
    u32 voluntary = !preempt && task_state(prev) != 0;
    return switched(BPF_CORE_READ(prev, pid), BPF_CORE_READ(next, pid), voluntary);
}

SEC("tp_btf/sched_wakeup")
int on_wakeup(u64 *ctx) {
    return woke(BPF_CORE_READ((struct task_struct *)ctx[0], pid));
}

SEC("tp_btf/sched_wakeup_new")
int on_wakeup_new(u64 *ctx) {
    return woke(BPF_CORE_READ((struct task_struct *)ctx[0], pid));
}

SEC("tp_btf/sched_waking")
int on_waking(u64 *ctx) {
    return waking(BPF_CORE_READ((struct task_struct *)ctx[0], pid));
}
#elif PROFKIT_SCHED
// bcc reads the classic tracepoints' fields (its kernel headers need not match the running
// kernel's task struct). The tracepoint reports a preemption as TASK_REPORT_MAX (0x100),
// above every state bit, and otherwise the state the thread left in.
TRACEPOINT_PROBE(sched, sched_switch) {
    u32 voluntary = (args->prev_state & 0x100) == 0 && (args->prev_state & 0xff) != 0;
    return switched(args->prev_pid, args->next_pid, voluntary);
}

TRACEPOINT_PROBE(sched, sched_wakeup) {
    return woke(args->pid);
}

TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    return woke(args->pid);
}

TRACEPOINT_PROBE(sched, sched_waking) {
    return waking(args->pid);
}
#endif
