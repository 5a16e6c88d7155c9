"""vLLM run as a systemd unit logs to the journal: `[log] journal_unit = "vllm.service"`.

The journal is read with `journalctl -o json --all --follow -u UNIT --after-cursor C` (an argv
list, no shell), and each entry's MESSAGE is appended, with a newline, to a spool file in the
state directory, which the daemon then follows as it follows any log: rotation, checkpoints,
the emit mark and replay work on the spool unchanged, and so does exactly-once.

Exactly once into the spool. After each batch of entries is appended, `journal.json` is
replaced (atomically) with the cursor of the batch's last entry and the spool's size then. A
restart goes on after that cursor; when the spool is longer than the recorded size (a kill
between the append and the record), the entries after the cursor are the ones that made it
longer, and rendering is deterministic, so their first (size - recorded) bytes are skipped: no
entry is written twice, none is lost. A spool shorter than recorded was rotated (`.1` holds the
recorded size) or lost (then a `problem` line says so and writing goes on after the cursor).

The first start reads the unit's entries of the current boot (`-b`; with `journal_file` or
`journal_directory`, all of the unit's entries there), so a session already loading is
rebuilt. The spool is rotated to `vllm.log.1` past `spool_max_bytes` (the follower reads
the renamed file to its end, then the new one). MESSAGE fields that are not UTF-8 (tqdm's `\\r`
makes journald store a line as bytes) come as byte arrays and are written as they are; a
MESSAGE that is null (a field over journald's limit that `--all` could not show) is skipped.

journalctl is loadwatch's child: `stop()` ends it. After a SIGKILL of loadwatch it ends at its next
write (the pipe is gone), or with the unit's cgroup under systemd.

    pump = JournalPump("vllm.service", state_dir, on_problem=print)
    pump.start()          # then follow pump.spool_path
    pump.stop()
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# journalctl's JSON line for one entry, past which it is skipped: journald keeps a service's
# line up to LineMax (48 KiB by default), a native entry's field up to far more.
MAX_ENTRY_BYTES = 8 << 20
RESTART_S = (1.0, 30.0)  # journalctl ended: start it again after 1 s, doubling up to 30 s


class JournalError(Exception):
    """journalctl cannot be run at all: one line."""


@dataclass(frozen=True)
class JournalSource:
    unit: str
    file: Path | None = None  # `journalctl --file` (a journal file, e.g. copied off a host)
    directory: Path | None = None  # `journalctl -D` (a mounted /var/log/journal)
    journalctl: str = "journalctl"

    def argv(self, cursor: str | None) -> list[str]:
        argv = [self.journalctl, "-o", "json", "--all", "--follow", "--no-pager", "-u", self.unit]
        if self.file is not None:
            argv += ["--file", str(self.file)]
        elif self.directory is not None:
            argv += ["-D", str(self.directory)]
        elif cursor is None:
            argv.append("-b")
        if cursor is not None:
            argv += ["--after-cursor", cursor]
        return [*argv, "--no-tail"]  # everything after the cursor, not follow's last 10 lines


def render(entry: Any) -> bytes | None:
    """One entry's line in the spool; None when it has no message to write."""
    if not isinstance(entry, dict):
        return None
    msg = entry.get("MESSAGE")
    if isinstance(msg, str):
        data = msg.encode("utf-8", "surrogateescape")
    elif isinstance(msg, list) and all(isinstance(b, int) and 0 <= b < 256 for b in msg):
        data = bytes(msg)
    else:
        return None
    # One entry is one line of the spool. journald splits a service's output at `\n`, so a `\n`
    # inside MESSAGE never is a line break of vLLM's: it came another way (the native protocol,
    # syslog), and written out it would forge a line of its own. (`\r` stays: tqdm's bars.)
    return data.replace(b"\n", b" ") + b"\n"


class JournalPump:
    """Copies the unit's journal entries into `spool_path`, each once, until `stop()`."""

    def __init__(
        self,
        source: JournalSource,
        state_dir: Path,
        *,
        on_problem: Callable[[str], None] | None = None,
        spool_max_bytes: int = 256 << 20,
        max_entry_bytes: int = MAX_ENTRY_BYTES,
    ) -> None:
        self.source = source
        self.dir = state_dir / "journal"
        self.spool_path = self.dir / "vllm.log"
        self._state_path = self.dir / "journal.json"
        self._on_problem = on_problem or (lambda line: None)
        self._max = spool_max_bytes
        self._max_entry = max_entry_bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.cursor: str | None = None
        self.entries = 0
        self._size = 0  # the spool's size as recorded with the cursor
        self._skip = 0  # bytes of the next entries already in the spool (a kill after append)

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._load()
        self._spawn()  # a journalctl that cannot start fails the start, in one line
        self._thread = threading.Thread(target=self._run, name="loadwatch-journal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._end_proc()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    # -- resume -----------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            doc = json.loads(self._state_path.read_text(encoding="utf-8"))
            cursor, size = doc["cursor"], int(doc["size"])
            if not isinstance(cursor, str):
                raise ValueError("cursor")
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError):
            self._on_problem(f"{self._state_path}: unreadable, reading the journal from the start")
            return
        have = max(_size(self.spool_path), 0)
        if have >= size:
            self._skip = have - size
            self._size = size
        elif _size(self.spool_path.with_name(self.spool_path.name + ".1")) == size:
            self._size = 0  # rotated after the record was written: the new spool is empty
        else:
            self._on_problem(
                f"{self.spool_path}: {have} bytes, {size} recorded: spool lost, going on after "
                "the journal cursor"
            )
            self._size = have
        self.cursor = cursor

    def _record(self) -> None:
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"cursor": self.cursor, "size": self._size}), encoding="utf-8")
        os.replace(tmp, self._state_path)

    # -- reading ----------------------------------------------------------------------------

    def _spawn(self) -> None:
        argv = self.source.argv(self.cursor)
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as exc:
            raise JournalError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        with self._lock:
            self._proc = proc

    def _run(self) -> None:
        delay = RESTART_S[0]
        while not self._stop.is_set():
            proc = self._proc
            if proc is not None:
                self._read(proc)
                code = proc.wait()
                err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace")
                if self._stop.is_set():
                    return
                line = " ".join(err.split())[:200]
                self._on_problem(f"journalctl ended (exit {code}){': ' + line if line else ''}")
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, RESTART_S[1])
            try:
                self._spawn()
            except JournalError as exc:
                self._on_problem(str(exc))

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        pending = bytearray()
        skipping = False  # dropping the rest of an entry over MAX_ENTRY_BYTES
        try:
            while not self._stop.is_set():
                if not sel.select(timeout=0.5):
                    continue
                data = os.read(fd, 1 << 20)
                if not data:
                    return
                if skipping:
                    end = data.find(b"\n")
                    if end < 0:
                        continue
                    data, skipping = data[end + 1 :], False
                pending += data
                cut = pending.rfind(b"\n") + 1
                if cut:
                    lines = bytes(pending[:cut]).splitlines()
                    del pending[:cut]
                    # (one read may hold an entry over the bound whole: skipped all the same)
                    kept = [x for x in lines if len(x) <= self._max_entry]
                    for _ in range(len(lines) - len(kept)):
                        self._on_problem(
                            f"journal: an entry of over {self._max_entry} bytes is skipped"
                        )
                    self._take(kept)
                if len(pending) > self._max_entry:
                    # An entry that never ends (journalctl prints one JSON document a line):
                    # not held whole, never a memory that grows without bound.
                    self._on_problem(
                        f"journal: an entry of over {self._max_entry} bytes is skipped"
                    )
                    pending.clear()
                    skipping = True
        finally:
            sel.close()

    def _take(self, lines: Sequence[bytes]) -> None:
        """Append a batch of entries, then record where it ends."""
        out = bytearray()
        cursor = self.cursor
        for raw in lines:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("__CURSOR"), str):
                cursor = entry["__CURSOR"]
            data = render(entry)
            if data is None:
                continue
            self.entries += 1
            if self._skip:
                dropped = min(self._skip, len(data))
                self._skip -= dropped
                data = data[dropped:]
            out += data
        if out:
            if self._size + len(out) > self._max and self._size > 0:
                self._rotate()
            with open(self.spool_path, "ab") as fh:
                fh.write(out)
            self._size += len(out)
        if cursor != self.cursor:
            self.cursor = cursor
            self._record()

    def _rotate(self) -> None:
        os.replace(self.spool_path, self.spool_path.with_name(self.spool_path.name + ".1"))
        self._size = 0
        self._record()

    def _end_proc(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1
