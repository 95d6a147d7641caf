// The on-CPU sampler and CPython stack walker, built ahead of time (CO-RE) for hosts where bcc
// cannot compile: no kernel headers, no compiler. It does what probes/pystack.bpf.c's sampler
// does under bcc, and writes the same maps, so one reader serves both: every thread of the
// target sampled on a cpu-clock event, a Python thread with its own Python stack, any other
// thread (a pool worker) with its dispatcher's, and native kernel and user stacks.
//
// What bcc substitutes into its source before compiling (the target, the interpreter's layout,
// capacities) is set here before load: the read-only globals below, and the logs' sizes
// (bpf_map__set_max_entries). Built by `make probes`; the object is committed beside this file.
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

typedef __u8 u8;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;

char LICENSE[] SEC("license") = "GPL";

// The one kernel type read: CO-RE relocates the field on the running kernel's BTF.
struct task_struct {
    int pid;
} __attribute__((preserve_access_index));

// One read-only global, so that its layout is this struct's (profkit/capture/ebpf/libbpf.py
// mirrors it) and it lies at the start of .rodata.
struct sampler_config {
    u32 target_tgid;
    u32 sample_capacity;
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

const volatile struct sampler_config cfg = {};

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

// Regions are counted per stack by the region probes, which this object does not hold; the
// map is here so that the walker's reader finds it, empty.
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1);
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
