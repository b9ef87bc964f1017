"""Owner liveness on one host: is the process that holds a reservation still running?

Used by the SQLite store (one host by nature). A process is named by what survives neither its
death nor a reboot: the kernel's boot id, the PID namespace it sees, its pid and its start time
(``/proc/<pid>/stat`` field 22, in clock ticks since boot). A pid reused by a later process has
another start time; a pid from before a reboot has another boot id; a pid from another container
has another namespace (then nothing is concluded: the lease decides).

Linux only (``/proc``). Elsewhere :func:`this_process` returns ``None`` and every owner counts as
unknown: takeover then waits for the lease, as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ProcessIdentity", "is_dead", "this_process"]


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """Where and which process: enough to tell, on the same host, whether it still runs.

    Attributes:
        host: ``<boot id>/<pid namespace>``: equal only on the same kernel run and namespace.
        pid: the process id.
        start: the process's start time in clock ticks since boot.
    """

    host: str
    pid: int
    start: int


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            return file.read()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of ``pid``, or ``None`` when there is no such process."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or parentheses.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _host() -> str | None:
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    if boot is None:
        return None
    return f"{boot.strip()}/{namespace}"


def this_process() -> ProcessIdentity | None:
    """The identity of the calling process, or ``None`` where ``/proc`` is not there."""
    host = _host()
    stat = _stat(os.getpid())
    if host is None or stat is None:
        return None
    return ProcessIdentity(host, os.getpid(), stat[1])


def is_dead(owner: ProcessIdentity, here: ProcessIdentity | None) -> bool:
    """Whether ``owner`` is known to be dead, seen from ``here`` (the calling process).

    ``False`` when it runs (stopped or not: a SIGSTOPped process is alive) or when this host
    cannot tell (another host, namespace or boot... the lease decides then). A zombie (killed,
    not yet reaped by its parent) is dead: it will never renew or complete again.
    """
    if here is None:
        return False
    if owner.host != here.host:
        # Same boot id but another namespace, or another host: nothing can be concluded. Another
        # boot id with the same namespace path is not proof either (another machine).
        return False
    stat = _stat(owner.pid)
    if stat is None:
        return True
    state, start = stat
    return start != owner.start or state in {"Z", "X", "x"}
