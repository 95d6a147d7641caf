"""Re-record the bundles under tests/data with the real collectors (needs root).

    .venv/bin/python tests/data/record_bundles.py

Each bundle keeps the manifest, the normalised files and the small raw outputs that parser tests
read (py-spy's chrometrace, perf stat's CSV, a slice of `perf script` text); perf.data is dropped.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from profkit.host.sandbox import quota_group  # noqa: E402
from recipes.launch import attach_command, join_quota  # noqa: E402

CASES = {
    "fanout_quota": (["recipes/shm_fanout.py", "--copy", "torch", "--threads", "8"], 0.5),
    "numpy_copy": (["recipes/shm_fanout.py", "--copy", "numpy", "--threads", "8"], None),
    "two_sites": (["recipes/two_sites.py", "--threads", "8"], None),
}
KEEP = (
    "manifest.json",
    "proc.json",
    "cgroup.json",
    "pyspy.json",
    "perf.json",
    "ebpf.json",
    "perf_stat.json",
    "pyspy.chrometrace.json",
    "perf_stat.csv",
    "perf_script.txt",
)


def record(name: str, command: list[str], cores: float | None) -> None:
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    scratch = Path("/tmp") / f"profkit-record-{name}"
    shutil.rmtree(scratch, ignore_errors=True)
    with quota_group(cores) if cores else _nothing() as group:
        target = subprocess.Popen(
            [sys.executable, *command],
            cwd=ROOT,
            preexec_fn=join_quota(group),
            stdout=subprocess.DEVNULL,
        )
        time.sleep(2.5)
        subprocess.run(
            attach_command(target.pid, duration=3, out=scratch, report=False),
            check=True,
            cwd=ROOT,
        )
        script = subprocess.run(
            [
                "perf",
                "script",
                "-i",
                str(scratch / "perf.data"),
                "--no-inline",
                "-F",
                "tid,time,period,ip,sym,dso",
            ],
            capture_output=True,
            text=True,
        ).stdout
        (scratch / "perf_script.txt").write_text("\n\n".join(script.split("\n\n")[:150]))
        target.terminate()
        target.wait()
    out.mkdir()
    for keep in KEEP:
        if (scratch / keep).exists():
            # Fixtures name no machine: the checkout's path and the host are replaced.
            text = (scratch / keep).read_text().replace(str(ROOT), "/srv/app")
            text = text.replace(platform.node(), "recorded-host")
            (out / keep).write_text(text)
    shutil.rmtree(scratch)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    for case, (cmd, quota) in CASES.items():
        record(case, cmd, quota)
        print(case, sum(p.stat().st_size for p in (HERE / case).iterdir()) // 1024, "KiB")
