"""Who listens on a TCP port: the socket's owner from /proc/net/tcp(6), its process from /proc.

Linux only. The uid comes from the socket table itself, so a listener of another user is
recognised even when its process cannot be inspected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"


@dataclass(frozen=True, slots=True)
class Listener:
    port: int
    uid: int
    inode: int
    pid: int | None  # None: the process could not be found (another user's, or gone)
    cmdline: tuple[str, ...] | None

    def describe(self) -> str:
        who = f"uid {self.uid}"
        if self.pid is None:
            return f"{who}, process not visible"
        return f"{who}, pid {self.pid}: {' '.join(self.cmdline or ()) or '?'}"


def _socket_rows(port: int) -> list[tuple[int, int]]:
    """(uid, inode) of the listening sockets on `port`."""
    rows = []
    for table in ("tcp", "tcp6"):
        path = PROC / "net" / table
        try:
            lines = path.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != LISTEN:
                continue
            if int(cols[1].rsplit(":", 1)[1], 16) == port:
                rows.append((int(cols[7]), int(cols[9])))
    return rows


def process_cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return tuple(raw.decode(errors="replace").split("\0")[:-1]) if raw else None


def _pid_of_inode(inode: int) -> int | None:
    target = f"socket:[{inode}]"
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) == target:
                    return int(entry.name)
        except OSError:
            continue
    return None


def find_listener(port: int) -> Listener | None:
    rows = _socket_rows(port)
    if not rows:
        return None
    uid, inode = rows[0]
    pid = _pid_of_inode(inode)
    return Listener(port, uid, inode, pid, None if pid is None else process_cmdline(pid))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = PROC / str(pid) / "stat"
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except (OSError, IndexError):
        return True
