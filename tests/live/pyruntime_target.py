"""Target process for tests/live/test_pyruntime.py: two threads parked in known nests of functions.

Runs under any CPython 3.9+.  Every call the test expects on a stack ends with a
``# at:<label>`` comment; the test reads the line numbers from those comments.

Usage: python pyruntime_target.py CODE_DUMP.json [--spin]
With --spin a third thread keeps running Python code (calls, returns, allocations), so that
readers meet stacks that change under them.
Writes, for the code objects of a few modules, what this interpreter itself reports (address,
names, line of every code unit), then prints ``ready MAIN_TID WORKER_TID`` and sleeps.
"""

import json
import json.decoder
import sys
import threading
import time
import types

parked = threading.Event()
release = threading.Event()


class Worker:
    def run(self):
        self.step()  # at:run

    def step(self):
        waiter()  # at:step


def waiter():
    parked.set()
    release.wait()  # at:waiter


def 函数():
    time.sleep(3600)  # at:ucs2


def café():
    函数()  # at:latin1


def f1():
    café()  # at:f1


def spin_leaf(n):
    return [i * i for i in range(n)]


def spin_middle(n):
    return sum(spin_leaf(n)) + len(str(n))


def spin():
    n = 0
    while True:
        n = (n + 1) % 50
        spin_middle(n)


def main():
    worker = threading.Thread(target=Worker().run, name="worker", daemon=True)
    worker.start()
    if "--spin" in sys.argv:
        threading.Thread(target=spin, name="spinner", daemon=True).start()
    parked.wait()
    dump_code_lines(sys.argv[1], [json.decoder, threading, sys.modules[__name__]])
    print("ready", threading.get_native_id(), worker.native_id, flush=True)
    f1()  # at:main


def _unit_lines(code):
    if not hasattr(code, "co_lines"):
        return []  # before 3.10: such interpreters are only checked for being refused
    if sys.version_info >= (3, 11):
        return [pos[0] for pos in code.co_positions()]
    lines = [None] * (len(code.co_code) // 2)
    for start, end, line in code.co_lines():
        for offset in range(start, end, 2):
            lines[offset // 2] = line
    return lines


def dump_code_lines(path, modules):
    seen = {}

    def visit_code(code):
        if id(code) in seen:
            return
        seen[id(code)] = {
            "addr": id(code),
            "filename": code.co_filename,
            "name": code.co_name,
            "qualname": getattr(code, "co_qualname", code.co_name),
            "firstlineno": code.co_firstlineno,
            "lines": _unit_lines(code),
        }
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                visit_code(const)

    def visit(obj, depth):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for accessor in (obj.fget, obj.fset, obj.fdel):
                if accessor is not None:
                    visit(accessor, depth)
        elif isinstance(obj, types.FunctionType):
            visit_code(obj.__code__)
        elif isinstance(obj, type) and depth < 3:
            for value in vars(obj).values():
                visit(value, depth + 1)

    for module in modules:
        for value in list(vars(module).values()):
            if getattr(value, "__module__", module.__name__) == module.__name__:
                visit(value, 0)
    with open(path, "w") as f:
        json.dump(list(seen.values()), f)


if __name__ == "__main__":
    main()  # at:module
