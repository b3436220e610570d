"""The driver: count the workload's file operations under strace, then inject a crash
or an error at each one, in a fresh trial each time, and check what is left.

Call numbers are strace's: `:when=N` counts calls of one syscall *per tracee* (per
thread, with -f), so a target is (syscall, N) and the injection fires at the N-th call
of that syscall in every thread that makes N of them. The counting run (`strace -f -ff
-y`, one trace file per thread) tells which N touch the broker root in at least one
thread (a path under it, a descriptor whose path is under it, or an address inside a
mapping of a file under it for msync/munmap); only those are targets. Python's start-up
calls never touch the root, so they are never targets.

Modes:
  kill-before  `inject=S:signal=SIGKILL:when=N` — strace delivers SIGKILL on entry to
               the call; the call does not run (checked: a 1 MiB write stores nothing).
  kill-after   `inject=S:delay_exit=1s:when=N` — the call completes, strace holds the
               thread at its exit for 1 s and prints "(DELAYED)"; the driver SIGKILLs
               that process then. A tracee in a ptrace stop does not die until strace
               resumes it, and then dies before returning to user space: exact, nothing
               of the process runs after the call. A kill that missed the 1 s window
               (the trace shows the process went on) counts as "not-reached".
  ENOSPC, EIO  `inject=S:error=E:when=N` (every syscall); EMFILE for openat, ENOLCK for
               flock. The workload goes on after an error and closes the broker.

Each trial's strace output (only syscall S, -y) shows which call was hit: a trial whose
injection never happened ("not-reached", thread timing moved the calls) or hit a call
outside the root ("off-target") is reported but not counted as tried.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRACE = shutil.which("strace") or "/usr/bin/strace"
PYTHON = sys.executable

SYSCALLS = ("openat", "write", "pwrite64", "pwritev", "fsync", "fdatasync", "msync",
            "ftruncate", "rename", "renameat", "renameat2", "unlink", "unlinkat", "mkdir",
            "rmdir", "mmap", "munmap", "flock", "fallocate", "syncfs")
VARIANTS = ("acks1", "flush1", "twowriters", "clean", "txn")   # compaction.py, transactions.py
CLASSES = ("integrity", "wedge", "raw-error", "hang", "reopen-error")
KILL_MODES = ("kill-before", "kill-after")
DELAY = "1s"          # the kill lands while strace holds the thread (see kill-after)
TRIAL_TIMEOUT_S = 90.0
CHECK_TIMEOUT_S = 120.0


def error_modes(syscall: str) -> tuple[str, ...]:
    extra = {"openat": ("EMFILE",), "flock": ("ENOLCK",)}.get(syscall, ())
    return ("ENOSPC", "EIO") + extra


def all_modes(syscall: str) -> tuple[str, ...]:
    return KILL_MODES + error_modes(syscall)


def child_env() -> dict:
    env = dict(os.environ)
    env.update(PYTHONPATH=ROOT_DIR, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    return env


def workload_argv(root: str, variant: str, ledger: str) -> list[str]:
    return [PYTHON, "-m", "tests.crashpoints.workload", root, variant, ledger]


def strace_usable() -> str | None:
    """None when strace can trace and inject here, else the reason it cannot."""
    if not os.path.exists(STRACE):
        return "strace is not installed"
    try:
        proc = subprocess.run([STRACE, "-f", "-qq", "-o", "/dev/null", "-e",
                               "inject=getppid:error=EPERM", PYTHON, "-c",
                               "import os, sys; sys.exit(0 if os.getppid() == -1 "
                               "or True else 1)"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"strace failed to run: {exc}"
    if proc.returncode != 0:
        return f"strace cannot trace here (ptrace not permitted?): {proc.stderr.strip()[:300]}"
    return None


# ---- counting --------------------------------------------------------------------------

_LINE = re.compile(r"^(\w+)\((.*)\)\s+=\s+(\S+)")


@dataclass
class Target:
    syscall: str
    n: int
    hits: list[str] = field(default_factory=list)     # "tid: call" lines that touch root

    @property
    def key(self) -> str:
        return f"{self.syscall}#{self.n}"


def _touches(line: str, root: str) -> bool:
    return (root + "/") in line or (root + ">") in line or (root + '"') in line


def parse_traces(prefix: str, root: str) -> tuple[dict[str, Target], dict[str, int]]:
    """Targets from the per-thread trace files `prefix.<tid>`, and per syscall the
    largest per-thread call count."""
    targets: dict[str, Target] = {}
    maxima: dict[str, int] = {}
    directory, base = os.path.split(prefix)
    for name in sorted(os.listdir(directory)):
        if not name.startswith(base + "."):
            continue
        tid = name[len(base) + 1:]
        counts: dict[str, int] = {}
        maps: dict[int, tuple[int, str]] = {}           # address -> (length, path)
        with open(os.path.join(directory, name), errors="replace") as f:
            for raw in f:
                m = _LINE.match(raw)
                if not m:
                    continue
                syscall, args, ret = m.group(1), m.group(2), m.group(3)
                if syscall not in SYSCALLS:
                    continue
                counts[syscall] = n = counts.get(syscall, 0) + 1
                hit = _touches(raw, root)
                parts = [a.strip() for a in args.split(",")]
                if syscall == "mmap" and hit and ret.startswith("0x"):
                    try:
                        maps[int(ret, 16)] = (int(parts[1]), raw)
                    except ValueError:
                        pass
                elif syscall in ("munmap", "msync") and parts and parts[0].startswith("0x"):
                    addr = int(parts[0], 16)
                    for start, (length, _) in maps.items():
                        if start <= addr < start + length:
                            hit = True
                            if syscall == "munmap":
                                del maps[start]
                            break
                if hit:
                    t = targets.setdefault(f"{syscall}#{n}", Target(syscall, n))
                    if len(t.hits) < 3:
                        t.hits.append(f"{tid}: {raw.strip()[:220]}")
        for syscall, n in counts.items():
            maxima[syscall] = max(maxima.get(syscall, 0), n)
    return targets, maxima


def count(variant: str, workdir: str) -> dict:
    """The counting run: the workload under `strace -f -ff -y`, uninjected."""
    root, ledger = os.path.join(workdir, "root"), os.path.join(workdir, "ledger")
    prefix = os.path.join(workdir, "trace")
    argv = [STRACE, "-f", "-ff", "-qq", "-y", "-e", "trace=" + ",".join(SYSCALLS),
            "-o", prefix] + workload_argv(root, variant, ledger)
    proc = subprocess.run(argv, cwd=ROOT_DIR, env=child_env(), capture_output=True,
                          text=True, timeout=TRIAL_TIMEOUT_S)
    targets, maxima = parse_traces(prefix, root)
    events = read_events(ledger)
    check = run_checker(root, ledger)
    return {"variant": variant, "returncode": proc.returncode, "stderr": proc.stderr[-2000:],
            "targets": targets, "maxima": maxima, "baseline_events": events,
            "baseline_check": check}


def read_events(ledger: str) -> list[dict]:
    out = []
    for path in (ledger + ".events", ledger + ".2.events"):
        try:
            with open(path, "rb") as f:
                out.extend(json.loads(line) for line in f if line.endswith(b"\n"))
        except FileNotFoundError:
            pass
    return out


def run_checker(root: str, ledger: str) -> dict:
    try:
        proc = subprocess.run([PYTHON, "-m", "tests.crashpoints.check", root, ledger],
                              cwd=ROOT_DIR, env=child_env(), capture_output=True,
                              text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"failures": [{"class": "hang", "phase": "check",
                              "detail": f"checker ran over {CHECK_TIMEOUT_S} s"}]}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"failures": [{"class": "reopen-error", "phase": "check",
                              "detail": "checker crashed: " + proc.stderr[-600:]}]}


# ---- trials ----------------------------------------------------------------------------

def inject_spec(syscall: str, n: int, mode: str) -> str:
    if mode == "kill-before":
        return f"inject={syscall}:signal=SIGKILL:when={n}"
    if mode == "kill-after":
        return f"inject={syscall}:delay_exit={DELAY}:when={n}"
    return f"inject={syscall}:error={mode}:when={n}"


def trial_argv(syscall: str, n: int, mode: str, root: str, variant: str, ledger: str,
               trace: str) -> list[str]:
    return [STRACE, "-f", "-qq", "-y", "-o", trace, "-e", f"trace={syscall}",
            "-e", inject_spec(syscall, n, mode)] + workload_argv(root, variant, ledger)


def reproducer(syscall: str, n: int, mode: str, variant: str) -> str:
    argv = trial_argv(syscall, n, mode, "/tmp/cp/root", variant, "/tmp/cp/ledger",
                      "/tmp/cp/trace")
    argv[argv.index(PYTHON)] = "python"
    line = " ".join(shlex.quote(a) for a in argv)
    if mode == "kill-after":
        line += "  # and kill -9 the pid on the '(DELAYED)' line of /tmp/cp/trace"
    return (f"cd {ROOT_DIR} && rm -rf /tmp/cp && mkdir /tmp/cp && PYTHONPATH=. {line}; "
            "python -m tests.crashpoints.check /tmp/cp/root /tmp/cp/ledger")


def _kill_delayed(trace: str, proc: subprocess.Popen, stop: threading.Event,
                  killed: list[int]) -> None:
    """kill-after: SIGKILL every process that strace holds at a delayed exit."""
    offset = 0
    while not stop.is_set() and proc.poll() is None:
        try:
            with open(trace, errors="replace") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            chunk = ""
        complete = chunk[:chunk.rfind("\n") + 1]
        offset += len(complete.encode(errors="replace"))
        for line in complete.splitlines():
            if "(DELAYED)" in line:
                tid = int(line.split()[0])
                try:
                    os.kill(tid, signal.SIGKILL)
                    killed.append(tid)
                except ProcessLookupError:
                    pass
        stop.wait(0.01)


def injected_lines(trace: str, mode: str) -> list[str]:
    try:
        with open(trace, errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    if mode == "kill-before":
        # the killed thread's last line is its unfinished call; strace marks the kill
        killed = {ln.split()[0] for ln in lines if "+++ killed by SIGKILL" in ln}
        last: dict[str, str] = {}
        for ln in lines:
            parts = ln.split(None, 1)
            if len(parts) == 2 and not parts[1].startswith(("+++", "---")):
                if "resumed>" in parts[1] and "<unfinished" in last.get(parts[0], ""):
                    ln = last[parts[0]] + " " + parts[1]     # the call's path is there
                last[parts[0]] = ln
        # SIGKILL takes the whole process: pick the threads whose last call is unfinished
        return [last[t] for t in last if t in killed and (
            "<unfinished" in last[t] or last[t].rstrip().endswith("= ?"))]
    if mode == "kill-after":
        killed = {ln.split()[0] for ln in lines if "+++ killed by SIGKILL" in ln}
        delayed = [ln for ln in lines if "(DELAYED)" in ln]
        # the delayed thread's process must have died right there: its next line (if
        # any) is the kill
        out = []
        for ln in delayed:
            tid = ln.split()[0]
            after = [x for x in lines[lines.index(ln) + 1:] if x.split()[0] == tid]
            if tid in killed and (not after or "+++ killed" in after[0]):
                out.append(ln)
        return out
    return [ln for ln in lines if "(INJECTED)" in ln]


def run_trial(variant: str, target: Target, mode: str, baseline_raw: set,
              keep: str | None = None) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"cp-{variant}-{target.syscall}-{target.n}-")
    root, ledger = os.path.join(workdir, "root"), os.path.join(workdir, "ledger")
    trace = os.path.join(workdir, "trace")
    argv = trial_argv(target.syscall, target.n, mode, root, variant, ledger, trace)
    result = {"variant": variant, "syscall": target.syscall, "n": target.n, "mode": mode,
              "classes": [], "details": []}
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT_DIR, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    stop, killed = threading.Event(), []
    watcher = None
    if mode == "kill-after":
        watcher = threading.Thread(target=_kill_delayed, args=(trace, proc, stop, killed),
                                   daemon=True)
        watcher.start()
    try:
        _, stderr = proc.communicate(timeout=TRIAL_TIMEOUT_S)
        hung = False
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
    stop.set()
    if watcher is not None:
        watcher.join()
    hits = injected_lines(trace, mode)
    result["injected"] = [h[:240] for h in hits[:3]]
    on_root = [h for h in hits if _touches(h, root) or target.syscall in ("msync", "munmap")]
    if not hits:
        result["status"] = "not-reached"
    elif not on_root:
        result["status"] = "off-target"
    else:
        result["status"] = "tried"
    if hung:
        result["classes"].append("hang")
        result["details"].append(f"workload ran over {TRIAL_TIMEOUT_S} s")
    events = read_events(ledger)
    for e in events:
        if e["kind"] == "raw" and (e["op"], e["type"]) not in baseline_raw:
            result["classes"].append("raw-error")
            result["details"].append(f"{e['who']} {e['op']}: {e['type']}: {e['message']}"
                                     f" || {e.get('traceback', '')[-700:]}")
    result["logkit_errors"] = sorted({f"{e['op']}:{e['type']}" for e in events
                                      if e["kind"] == "logkit"})
    if proc.returncode not in (0, -9, 137) and not hung and mode != "kill-before" \
            and not killed:
        result["classes"].append("raw-error")
        result["details"].append(f"workload exited {proc.returncode}: {stderr[-700:]}")
    check = run_checker(root, ledger)
    for f in check.get("failures", []):
        result["classes"].append(f["class"])
        result["details"].append(f"[{f['phase']}] {f['detail']}")
    result["acked"] = check.get("acked")
    result["seconds"] = round(time.monotonic() - started, 2)
    result["reproducer"] = reproducer(target.syscall, target.n, mode, variant)
    if keep and result["classes"]:
        shutil.copytree(workdir, os.path.join(keep, os.path.basename(workdir)),
                        dirs_exist_ok=True)
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def baseline_raw_errors(counted: dict) -> set:
    return {(e["op"], e["type"]) for e in counted["baseline_events"] if e["kind"] == "raw"}


def plan(targets: dict[str, Target], *, modes: tuple[str, ...] | None = None,
         syscalls: tuple[str, ...] | None = None, sample: int | None = None
         ) -> list[tuple[Target, str]]:
    """Every (target, mode), or a deterministic sample of `sample` call numbers per
    syscall (spread evenly over its targets: first, last and between)."""
    by_syscall: dict[str, list[Target]] = {}
    for t in targets.values():
        if syscalls is None or t.syscall in syscalls:
            by_syscall.setdefault(t.syscall, []).append(t)
    out = []
    for syscall in sorted(by_syscall):
        ts = sorted(by_syscall[syscall], key=lambda t: t.n)
        if sample is not None and len(ts) > sample:
            step = (len(ts) - 1) / max(1, sample - 1)
            ts = [ts[round(i * step)] for i in range(sample)]
        for t in ts:
            for mode in all_modes(syscall):
                if modes is None or mode in modes:
                    out.append((t, mode))
    return out


def run_plan(variant: str, counted: dict, work: list[tuple[Target, str]], *,
             jobs: int = 2, keep: str | None = None, deadline: float | None = None,
             progress=None) -> list[dict]:
    raw = baseline_raw_errors(counted)
    results: list[dict] = []

    def one(item):
        if deadline is not None and time.monotonic() > deadline:
            return None
        r = run_trial(variant, item[0], item[1], raw, keep)
        if progress is not None:
            progress(r)
        return r

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for r in pool.map(one, work):
            if r is not None:
                results.append(r)
    return results


# ---- reporting -------------------------------------------------------------------------

def summarize(results: list[dict]) -> dict:
    """{(variant, syscall, mode): {"tried", "not-reached", "off-target", class counts,
    "reproducer" per class}}"""
    table: dict = {}
    for r in results:
        row = table.setdefault((r["variant"], r["syscall"], r["mode"]),
                               {"tried": 0, "not-reached": 0, "off-target": 0,
                                **{c: 0 for c in CLASSES}, "examples": {}})
        row[r["status"]] += 1
        for c in set(r["classes"]):
            row[c] += 1
            row["examples"].setdefault(c, (r["reproducer"], r["details"][
                r["classes"].index(c)]))
    return table


def format_table(table: dict) -> str:
    head = ["variant", "syscall", "mode", "tried", "not-reached", "off-target", *CLASSES]
    rows = [head]
    totals = {h: 0 for h in head[3:]}
    for key in sorted(table):
        row = table[key]
        rows.append([*key, *(str(row[h]) for h in head[3:])])
        for h in head[3:]:
            totals[h] += row[h]
    rows.append(["total", "", "", *(str(totals[h]) for h in head[3:])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)
