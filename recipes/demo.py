"""`make demo`: profile the built-in fan-out recipe end to end, the way a user would.

The recipe copies a tensor into fresh shared memory with torch's copy_() and 8 intra-op threads,
inside a cgroup whose quota is half a core (when this machine lets us create one): the case
study in miniature. profkit then reports the quota and attaches to the live process.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profkit.errors import CgroupError  # noqa: E402
from profkit.host.sandbox import QuotaGroup, quota_group  # noqa: E402
from recipes.launch import attach_args, join_quota  # noqa: E402


def profkit(*args: str) -> int:
    print(f"\n$ profkit {' '.join(args)}", flush=True)
    return subprocess.run([sys.executable, "-m", "profkit", *args], cwd=ROOT).returncode


def start_recipe(group: QuotaGroup | None, threads: int) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-u",
        str(ROOT / "recipes/shm_fanout.py"),
        "--copy",
        "torch",
        "--threads",
        str(threads),
    ]
    print("$ " + " ".join(command[1:]), flush=True)
    recipe = subprocess.Popen(
        command, preexec_fn=join_quota(group), stdout=subprocess.PIPE, text=True
    )
    assert recipe.stdout is not None
    print(recipe.stdout.readline().rstrip(), flush=True)
    return recipe


def serving_demo(cores: float, duration: float, out: Path) -> int:
    """The serving recipe under load, its front profiled while it serves."""
    import asyncio
    import socket
    import threading

    from recipes.mm_serving.load import run_load

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with contextlib.ExitStack() as stack:
        group: QuotaGroup | None = None
        with contextlib.suppress(CgroupError):
            group = stack.enter_context(quota_group(cores))
        command = [
            sys.executable,
            "-u",
            "-m",
            "recipes.mm_serving.front",
            "--transport",
            "shm-torch",
            "--threads",
            "8",
            "--port",
            str(port),
            "--model-size",
            "448",
        ]
        print("\n$ " + " ".join(command[1:]) + f"   (in a {cores:g}-core quota)", flush=True)
        front = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=join_quota(group)
        )
        assert front.stdout is not None
        print(front.stdout.readline().rstrip(), flush=True)
        url = f"http://127.0.0.1:{port}"
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                asyncio.run(run_load(url, 8, 16, 7, 512))

        time.sleep(2.0)
        driver = threading.Thread(target=load, daemon=True)
        driver.start()
        try:
            time.sleep(1.0)
            return profkit(*attach_args(front.pid, duration=duration, out=out))
        finally:
            stop.set()
            driver.join(timeout=60)
            front.send_signal(signal.SIGINT)
            front.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--cores", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--out", default="profkit-sessions/demo")
    parser.add_argument(
        "--skip-serving",
        action="store_true",
        help="profile only the copy loop, not the serving recipe",
    )
    args = parser.parse_args()
    profkit("doctor")
    with contextlib.ExitStack() as stack:
        group = None
        try:
            group = stack.enter_context(quota_group(args.cores))
            print(f"\nrecipe runs in a fresh cgroup with a {args.cores:g}-core quota")
        except CgroupError as exc:
            print(f"\nno quota cgroup ({exc.format_message()}): the recipe runs unlimited")
        recipe = start_recipe(group, args.threads)
        try:
            time.sleep(1.5)
            profkit("quota", "--pid", str(recipe.pid), "--window", "2")
            out = Path(args.out)
            if out.exists():
                import shutil

                shutil.rmtree(out)
            code = profkit(
                *attach_args(recipe.pid, duration=args.duration, out=out),
            )
        finally:
            recipe.send_signal(signal.SIGINT)
            print(recipe.communicate(timeout=30)[0].strip().splitlines()[-1], flush=True)
    print(f"\nthe bundle is in {args.out}; re-analyse it without root: profkit report {args.out}")
    if not args.skip_serving:
        serving_out = Path(args.out + "-serving")
        if serving_out.exists():
            import shutil

            shutil.rmtree(serving_out)
        code = serving_demo(args.cores, args.duration, serving_out) or code
        print(f"\nthe serving bundle is in {serving_out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
