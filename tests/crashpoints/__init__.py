"""Crash-point enumeration (ALICE/CrashMonkey style) for logkit's storage.

* `workload` — the child process whose file operations are enumerated; it writes a
  ledger of what was acknowledged, after each acknowledgement.
* `check` — run in a fresh process after a trial: reopen, compare with the ledger,
  force a roll from another fresh process, compare again.
* `driver` — counts the workload's file-operation syscalls under strace, then runs one
  trial per (syscall, call number, mode) with strace's fault/signal injection.

docs/crashpoints.md describes the method; tools/crashpoints.py runs the enumeration and
tests/tools/test_crashpoints.py a bounded slice of it.
"""
