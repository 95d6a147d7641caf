// Scheduler view of one process: per-thread on-CPU and off-CPU time, voluntary and involuntary
// switches, who wakes whom, and a log of on-CPU slices for the timeline. The log is an array
// read in bulk after the capture: a per-event perf buffer would make profkit wake for every
// context switch of a large pool, and that CPU is taken from the target.
// TARGET_TGID and SLICE_CAPACITY are substituted by profkit before compiling. This file follows
// pystack.bpf.c and openmp.bpf.c in one program; with the walker (PYSTACK), a Python thread
// that leaves the CPU has its stack read, and its time off CPU is counted against that stack.
// No #include: TRACEPOINT_PROBE brings the tracepoints' argument structs, and <linux/sched.h>
// alone doubled the compile time.

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

BPF_HASH(times, u32, struct thread_time, 16384);
BPF_HASH(wakeups, struct wake_key, u64, 65536);
BPF_ARRAY(slice_log, struct slice, SLICE_CAPACITY);
BPF_ARRAY(slice_count, u64, 1);
BPF_HASH(pystack_offcpu, struct offcpu_key, struct offcpu_time, 16384);

static inline void log_slice(u64 start, u64 end, u32 tid, u32 voluntary) {
    u32 zero = 0;
    u64 *count = slice_count.lookup(&zero);
    if (!count)
        return;
    u64 index = __sync_fetch_and_add(count, 1);
    if (index >= SLICE_CAPACITY)
        return;  // counted: the reader reports count - capacity as lost
    u32 slot = index;
    struct slice *s = slice_log.lookup(&slot);
    if (s) {
        s->start_ns = start;
        s->end_ns = end;
        s->tid = tid;
        s->voluntary = voluntary;
    }
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 prev = args->prev_pid;
    u32 next = args->next_pid;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;

    // The outgoing task is `current`, so its process is known for certain.
    if (tgid == TARGET_TGID && prev != 0) {
        struct thread_time zero = {};
        struct thread_time *t = times.lookup_or_try_init(&prev, &zero);
        if (t) {
            // Voluntary as the kernel counts it (nvcsw): given up in a state other than
            // running. The tracepoint reports a kernel preemption as TASK_REPORT_MAX (0x100),
            // above every state bit; running (0) is a preemption on the way to user space.
            u32 voluntary = (args->prev_state & 0xff) != 0;
            if (t->last_in_ns) {
                t->oncpu_ns += now - t->last_in_ns;
                if (SLICE_CAPACITY > 1)
                    log_slice(t->last_in_ns, now, prev, voluntary);
            }
            t->last_out_ns = now;
            t->last_in_ns = 0;
#ifdef PYSTACK
            t->off_stack = walk_python(0);
#endif
            if (voluntary)
                t->voluntary++;
            else
                t->involuntary++;
        }
    }
    // The incoming task is known only once it has run for the target (or was seeded).
    struct thread_time *n = times.lookup(&next);
    if (n) {
        if (n->last_out_ns) {
            n->offcpu_ns += now - n->last_out_ns;
            if (n->off_stack) {
                struct offcpu_key key = {n->off_stack, next, 0};
                struct offcpu_time fresh = {};
                struct offcpu_time *off = pystack_offcpu.lookup_or_try_init(&key, &fresh);
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

static inline int count_wakeup(u32 wakee) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (tgid != TARGET_TGID && !times.lookup(&wakee))
        return 0;
    struct wake_key key = {};
    key.waker = bpf_get_current_pid_tgid();
    key.wakee = wakee;
    u64 zero = 0;
    u64 *count = wakeups.lookup_or_try_init(&key, &zero);
    if (count)
        __sync_fetch_and_add(count, 1);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup) {
    return count_wakeup(args->pid);
}

TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    return count_wakeup(args->pid);
}
