"""`profkit watch` and `profkit top`: the cheap collectors kept running, one window per interval.

Per target and interval: /proc per-thread CPU (process, Python threads, pool workers), the
tightest ancestor's cgroup cpu.stat, and the OpenMP region probe's cumulative in-kernel counters
(regions, and regions and region time per Python stack from the eBPF stack walker). Nothing
stops the target: no ptrace, no py-spy.
"""
