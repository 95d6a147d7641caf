// OpenMP parallel regions of one process: uprobes on the fork entry point of its own runtime
// (GOMP_parallel in libgomp, __kmpc_fork_call in libiomp5), entry and return.
#include <uapi/linux/ptrace.h>

struct region_start {
    u64 start_ns;
    u32 requested;
};

struct region {
    u64 start_ns;
    u64 end_ns;
    u32 tid;
    u32 requested;
};

BPF_HASH(open_regions, u32, struct region_start, 16384);
BPF_HISTOGRAM(duration_us_log2, int, 64);
BPF_HASH(per_thread, u32, u64, 16384);
BPF_PERF_OUTPUT(regions);

// GOMP_parallel(fn, data, num_threads, flags): 0 threads means "the runtime's setting".
int on_gomp_parallel(struct pt_regs *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    struct region_start start = {bpf_ktime_get_ns(), (u32)PT_REGS_PARM3(ctx)};
    open_regions.update(&tid, &start);
    return 0;
}

// __kmpc_fork_call(loc, argc, microtask, ...): the team size is not an argument.
int on_kmpc_fork_call(struct pt_regs *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    struct region_start start = {bpf_ktime_get_ns(), 0};
    open_regions.update(&tid, &start);
    return 0;
}

int on_region_return(struct pt_regs *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    struct region_start *start = open_regions.lookup(&tid);
    if (!start)
        return 0;  // entered before the probe was attached
    u64 now = bpf_ktime_get_ns();
    struct region r = {start->start_ns, now, tid, start->requested};
    open_regions.delete(&tid);
    duration_us_log2.increment(bpf_log2l((now - r.start_ns) / 1000));
    u64 zero = 0;
    u64 *count = per_thread.lookup_or_try_init(&tid, &zero);
    if (count)
        __sync_fetch_and_add(count, 1);
    regions.perf_submit(ctx, &r, sizeof(r));
    return 0;
}
