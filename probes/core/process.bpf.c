// The target's process program, built ahead of time (CO-RE) for hosts where bcc cannot
// compile: no kernel headers, no compiler. It does what probes/pystack.bpf.c and
// probes/openmp.bpf.c do under bcc, and writes the same maps, so one reader serves both:
// - the on-CPU sampler: every thread of the target sampled on a cpu-clock event, a Python
//   thread with its own Python stack, any other thread (a pool worker) with its dispatcher's,
//   and native kernel and user stacks;
// - the parallel-region probes: one entry program and one end program for every runtime copy,
//   each attachment told its copy and where the team size is by its BPF cookie (bcc compiles a
//   handler per copy instead).
//
// What bcc substitutes into its source before compiling (the target, the interpreter's layout,
// capacities) is set here before load: the read-only globals below, and the logs' sizes
// (bpf_map__set_max_entries). Built by `make probes`; the object is committed beside this file.
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <asm/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

typedef __u8 u8;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;

char LICENSE[] SEC("license") = "GPL";

// The one kernel type read: CO-RE relocates its fields on the running kernel's BTF.
struct task_struct {
    int pid;
    unsigned int __state;  // 5.14 on
} __attribute__((preserve_access_index));

// Before 5.14 the state was `long state`.
struct task_struct___old {
    long state;
} __attribute__((preserve_access_index));

// One read-only global, so that its layout is this struct's (profkit/capture/ebpf/core_program.py
// mirrors it) and it lies at the start of .rodata.
struct process_config {
    u32 target_tgid;
    u32 sample_capacity;
    u32 region_capacity;
    u32 slice_capacity;
    u32 native_stacks_on;
    // The interpreter's layout (profkit/host/pyruntime), as pystack.bpf.c's PY_* definitions.
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
};

const volatile struct process_config cfg = {};

// The layout's names as pywalk.h reads them: the config's fields.
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
#include "../pywalk.h"

struct pystack_stats {
    u64 regions;
    u64 region_ns;
};

struct pystack_key {
    u64 stack;
    u32 runtime;
    u32 pad;
};

struct pysample {
    u64 t_ns;
    u64 stack;
    u64 native;
    u32 tid;
    u32 python;
    u32 dispatcher;
    u32 dispatch;
};

#define NATIVE_USER_FRAMES 48
#define NATIVE_KERNEL_FRAMES 24
struct nstack {
    u64 user[NATIVE_USER_FRAMES];
    u64 kernel[NATIVE_KERNEL_FRAMES];
    u32 user_depth;
    u32 kernel_depth;
};

#define DISPATCH_WOKEN 1
#define DISPATCH_SOLE 2

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, u64);
} tstates SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct pystack);
} pystack_scratch SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
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

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 5);
    __type(key, u32);
    __type(value, u64);
} walk_counts SEC(".maps");

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

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u32);
} sole_python SEC(".maps");

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
    __uint(max_entries, 16384);
    __type(key, u64);
    __type(value, struct nstack);
} native_stacks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, u32);
    __type(value, u64);
} native_counts SEC(".maps");

static __always_inline void count_in(void *map, u32 which) {
    u64 *n = bpf_map_lookup_elem(map, &which);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static __always_inline u64 walk_tstate(u64 tstate) {
    u32 zero = 0;
    struct pystack *s = bpf_map_lookup_elem(&pystack_scratch, &zero);
    if (!s)
        return 0;
    struct pywalk walked = py_walk(tstate, s);
    if (walked.failed)
        count_in(&walk_counts, 2);
    if (s->truncated)
        count_in(&walk_counts, 3);
    if (!walked.hash) {
        if (walked.reached)
            count_in(&walk_counts, 4);
        return 0;
    }
    u64 hash = walked.hash;
    if (!bpf_map_lookup_elem(&pystacks, &hash))
        bpf_map_update_elem(&pystacks, &hash, s, BPF_ANY);
    count_in(&walk_counts, 0);
    return hash;
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
        count_in(&native_counts, 1);
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
        count_in(&native_counts, 0);
        return 0;
    }
    return hash;
}

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

// A BTF tracepoint: attached through BTF alone, where tracefs (which a classic tracepoint's id
// is read from) is not mounted, as on many GPU and Kubernetes nodes.
SEC("tp_btf/sched_waking")
int on_waking(u64 *ctx) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((pid_tgid >> 32) != cfg.target_tgid)
        return 0;
    u32 waker = pid_tgid;
    struct task_struct *task = (struct task_struct *)ctx[0];
    u32 wakee = BPF_CORE_READ(task, pid);
    if (!bpf_map_lookup_elem(&tstates, &waker) || bpf_map_lookup_elem(&tstates, &wakee))
        return 0;
    u32 *known = bpf_map_lookup_elem(&woken_by, &wakee);
    if (!known || *known != waker)
        bpf_map_update_elem(&woken_by, &wakee, &waker, BPF_ANY);
    return 0;
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx) {
    u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((pid_tgid >> 32) != cfg.target_tgid)
        return 0;
    u32 tid = pid_tgid;
    struct pysample sample = {};
    u64 *tstate = bpf_map_lookup_elem(&tstates, &tid);
    sample.python = tstate ? 1 : 0;
    if (!tstate) {
        u32 how = 0;
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
    sample.stack = tstate ? walk_tstate(*tstate) : 0;
    sample.tid = tid;
    u32 zero = 0;
    u64 *next = bpf_map_lookup_elem(&sample_count, &zero);
    if (!next)
        return 0;
    u64 index = __sync_fetch_and_add(next, 1);
    if (index >= cfg.sample_capacity)
        return 0;
    u32 slot = index;
    struct pysample *entry = bpf_map_lookup_elem(&sample_log, &slot);
    if (entry)
        *entry = sample;
    return 0;
}

// --- Parallel regions (probes/openmp.bpf.c under bcc; the same maps and records) ---

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

// Per runtime copy, for the cost of each copy's traps; their sum, against region_count, the
// regions whose end was never seen.
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 64);
    __type(key, u32);
    __type(value, u64);
} runtime_entries SEC(".maps");

// Where an entry attachment finds the team size asked for (its cookie's upper half).
#define REQUESTED_NONE 0
#define REQUESTED_PARM1 1  // exec_blas(num, queue)
#define REQUESTED_PARM3 3  // GOMP_parallel*(fn, data, num_threads, ...)

// bcc's bpf_log2l, so that both loaders fill the same slots: floor(log2(v)) + 1, and 1 for 0.
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

// The cookie: the runtime copy's index in its lower 16 bits, REQUESTED_* above them.
SEC("uprobe")
int on_region_entry(struct pt_regs *ctx) {
    u64 cookie = bpf_get_attach_cookie(ctx);
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
    u64 stack = 0;
    u64 *tstate = bpf_map_lookup_elem(&tstates, &tid);
    if (!tstate) {
        count_in(&walk_counts, 1);
    } else {
        stack = walk_tstate(*tstate);
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
    }
    struct region_start start = {bpf_ktime_get_ns(), stack, requested, runtime};
    struct region_start *open = bpf_map_lookup_elem(&open_regions, &tid);
    if (open)
        *open = start;
    else
        bpf_map_update_elem(&open_regions, &tid, &start, BPF_ANY);
    count_in(&runtime_entries, runtime);
    return 0;
}

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
    count_in(&duration_us_log2, log2_u64((now - r.start_ns) / 1000));
    u32 zero = 0;
    u64 *next = bpf_map_lookup_elem(&region_count, &zero);
    if (!next)
        return 0;
    u64 index = __sync_fetch_and_add(next, 1);
    if (index >= cfg.region_capacity)
        return 0;  // counted: the reader reports count - capacity as lost
    u32 slot = index;
    struct region *entry = bpf_map_lookup_elem(&region_log, &slot);
    if (entry)
        *entry = r;
    return 0;
}

// --- The scheduler (probes/sched.bpf.c under bcc; the same maps and records) ---

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

static __always_inline long task_state(struct task_struct *task) {
    if (bpf_core_field_exists(task->__state))
        return BPF_CORE_READ(task, __state);
    return BPF_CORE_READ((struct task_struct___old *)task, state);
}

// Voluntary as the kernel counts a thread's switches (nvcsw): it gave the CPU up, in a state
// other than running; a preempted thread's state is ignored.
SEC("tp_btf/sched_switch")
int on_switch(u64 *ctx) {
    u64 now = bpf_ktime_get_ns();
    u32 preempt = (u32)ctx[0];
    struct task_struct *prev_task = (struct task_struct *)ctx[1];
    struct task_struct *next_task = (struct task_struct *)ctx[2];
    u32 prev = BPF_CORE_READ(prev_task, pid);
    u32 next = BPF_CORE_READ(next_task, pid);
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
            u32 voluntary = !preempt && task_state(prev_task) != 0;
            if (t->last_in_ns) {
                t->oncpu_ns += now - t->last_in_ns;
                if (cfg.slice_capacity > 1)
                    log_slice(t->last_in_ns, now, prev, voluntary);
            }
            t->last_out_ns = now;
            t->last_in_ns = 0;
            u64 stack = 0;
            u64 *tstate = bpf_map_lookup_elem(&tstates, &prev);
            if (tstate)
                stack = walk_tstate(*tstate);
            t->off_stack = stack;
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

static __always_inline int count_wakeup(struct task_struct *task) {
    u32 wakee = BPF_CORE_READ(task, pid);
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

SEC("tp_btf/sched_wakeup")
int on_wakeup(u64 *ctx) {
    return count_wakeup((struct task_struct *)ctx[0]);
}

SEC("tp_btf/sched_wakeup_new")
int on_wakeup_new(u64 *ctx) {
    return count_wakeup((struct task_struct *)ctx[0]);
}
