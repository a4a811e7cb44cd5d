"""Listings of model folders: walked once, following symlinks, and kept until a folder changes.

A model library is often a tree of symlinks (one copy of each multi-gigabyte file shared by several
installations), so :func:`scan` follows links to files and to folders wherever they point. It keeps
the chain of folders it is inside (by device and inode) and skips a link back into that chain, so a
link cycle ends the walk of that branch instead of looping. One folder reached under several link
names is listed under each, up to :data:`MAX_VISITS` times (folders linked to each other in a mesh
would otherwise be walked once per path through the mesh). Hidden names (``.git``, ``.cache``) are
skipped, like dangling links and folders it may not read.

:class:`ListingCache` keeps one :class:`Listing` per root folder. A listing records every folder it
walked with that folder's inode and modification time; adding, removing or renaming an entry changes
the folder's modification time, so a listing is reused while a ``stat`` of each of its folders shows
the same figures (no folder is read again), and walked again otherwise. A link whose target is missing
(a drive not mounted yet) is remembered too: the listing is walked again once it leads somewhere, since
its target appearing changes no time of a listed folder. A folder modified within
:data:`SETTLE_NS` of the walk is not trusted: file systems stamp times coarsely, so a file added in
the same tick as the walk could leave the time unchanged. ``clear()`` forgets everything.
Look-ups of one root that arrive while it is being checked or walked wait for that result.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

SETTLE_NS = 2_000_000_000  # a folder modified this recently (ns) is walked again next time
MAX_DEPTH = 64  # folders deeper than this (below the root) are not walked
MAX_FOLDERS = 200_000  # one walk reads at most this many folders (a guard against link mazes)
MAX_VISITS = 16  # one folder is walked at most this many times in one listing, under different link names

Stamp = tuple[int, int]  # (inode, modification time in ns) of a folder


@dataclass(frozen=True)
class Listing:
    """One root folder's files (relative, ``/``-separated) and the folders walked to find them."""

    root: str
    files: tuple[str, ...]
    stamps: dict[str, Stamp]  # folder path as walked (through links) -> its stamp
    settled: bool  # False when a folder was modified too recently to trust its stamp
    dangling: tuple[str, ...] = ()  # links (as walked) whose target was missing

    @property
    def exists(self) -> bool:
        return bool(self.stamps)


def _stamp(st: os.stat_result) -> Stamp:
    return st.st_ino, st.st_mtime_ns


def scan(root: str | Path) -> Listing:
    """Walk ``root``, following symlinks, and list its files; a missing root lists nothing."""
    root = os.fspath(root)
    started = time.time_ns()
    try:
        top = os.stat(root)
    except OSError:
        return Listing(root, (), {}, settled=True)
    if not stat.S_ISDIR(top.st_mode):
        return Listing(root, (), {}, settled=True)
    files: list[str] = []
    dangling: list[str] = []
    visits: dict[tuple[int, int], int] = {}  # (dev, inode) of a folder -> times queued for a walk
    stamps: dict[str, Stamp] = {}
    # (folder path, its name relative to root + "/", the (dev, inode) chain down to it, its stat)
    pending: list[tuple[str, str, tuple[tuple[int, int], ...], os.stat_result]] = [
        (root, "", ((top.st_dev, top.st_ino),), top)
    ]
    while pending:
        path, prefix, chain, st = pending.pop()
        if len(stamps) >= MAX_FOLDERS:
            log.warning(
                "stopped listing %s after %d folders (a maze of links?); files past that are not listed",
                root,
                MAX_FOLDERS,
            )
            break
        stamps[path] = _stamp(st)
        try:
            with os.scandir(path) as entries:
                found = list(entries)
        except OSError as exc:
            log.warning("cannot list model folder %s: %s", path, exc)
            continue
        for entry in found:
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir():  # follows a link to a folder
                    sub = entry.stat()
                    ident = (sub.st_dev, sub.st_ino)
                    if ident in chain:
                        log.info(
                            "model folder link %s leads back into %s; not followed again", entry.path, path
                        )
                    elif len(chain) > MAX_DEPTH:
                        log.warning(
                            "model folder %s is nested deeper than %d folders; not listed",
                            entry.path,
                            MAX_DEPTH,
                        )
                    elif visits.get(ident, 0) >= MAX_VISITS:
                        if visits[ident] == MAX_VISITS:  # said once per folder
                            log.warning(
                                "model folder %s is reached through more than %d links; listed under "
                                "the first %d only",
                                os.path.realpath(entry.path),
                                MAX_VISITS,
                                MAX_VISITS,
                            )
                        visits[ident] += 1
                    else:
                        visits[ident] = visits.get(ident, 0) + 1
                        pending.append((entry.path, f"{prefix}{entry.name}/", (*chain, ident), sub))
                elif entry.is_file():  # follows a link to a file
                    files.append(prefix + entry.name)
                elif entry.is_symlink():  # leads nowhere (yet)
                    dangling.append(entry.path)
            except OSError:  # vanished, no permission, or a link to itself: not listed
                continue
    settled = all(started - mtime >= SETTLE_NS for _, mtime in stamps.values())
    return Listing(root, tuple(files), stamps, settled, tuple(dangling))


def is_current(listing: Listing) -> bool:
    """True while no folder of ``listing`` changed (one ``stat`` per folder; nothing is read)."""
    if not listing.settled:
        return False
    if not listing.stamps:
        return not os.path.isdir(listing.root)
    for path, stamp in listing.stamps.items():
        try:
            if _stamp(os.stat(path)) != stamp:
                return False
        except OSError:
            return False
    return not any(os.path.exists(link) for link in listing.dangling)


def keep_with_extensions(files: Iterable[str], extensions: frozenset[str]) -> list[str]:
    """The names whose lower-cased suffix is in ``extensions`` (an empty set keeps every name)."""
    if not extensions:
        return list(files)
    return [f for f in files if os.path.splitext(f)[1].lower() in extensions]


def folders_holding(files: Iterable[str], marker: str) -> list[str]:
    """Folders (relative) that directly contain a file named ``marker``; ``""`` is the root itself."""
    suffix = "/" + marker
    return [f[: -len(suffix)] if f != marker else "" for f in files if f == marker or f.endswith(suffix)]


class _Flight:
    """One look-up of a root in progress: its leader checks (and walks if needed) the root; callers
    arriving meanwhile wait for the leader's listing instead of walking it again."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.listing: Listing | None = None
        self.error: BaseException | None = None
        self.waiters = 0  # callers waiting for the leader (counted under the cache's lock)

    def result(self) -> Listing:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.listing is not None
        return self.listing


@dataclass
class ListingCache:
    """Root folder -> its :class:`Listing`, walked again only when a folder of it changed.

    Thread-safe: the server lists from its worker threads while runs resolve names. Concurrent
    look-ups of one root share one check (and one walk, when it is needed): a large library is
    never walked twice at once, and a walk of one root never waits for another root's. ``scans``
    counts the walks (for stats and tests).
    """

    _listings: dict[str, Listing] = field(default_factory=dict)
    _flights: dict[str, _Flight] = field(default_factory=dict)  # root -> its look-up in progress
    _lock: threading.Lock = field(default_factory=threading.Lock)
    scans: int = 0

    def listing(self, root: str | Path) -> Listing:
        key = os.path.abspath(root)
        with self._lock:
            flight = self._flights.get(key)
            leading = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
            else:
                flight.waiters += 1
            cached = self._listings.get(key)
        if not leading:
            return flight.result()
        try:
            if cached is not None and is_current(cached):
                flight.listing = cached
            else:
                flight.listing = scan(key)
                with self._lock:
                    self.scans += 1
                    if self._flights.get(key) is flight:  # not forgotten meanwhile
                        self._listings[key] = flight.listing
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                if self._flights.get(key) is flight:
                    del self._flights[key]
            flight.done.set()
        return flight.listing

    def waiting(self, root: str | Path) -> int:
        """How many look-ups of ``root`` wait for the one in progress now (for stats and tests)."""
        with self._lock:
            flight = self._flights.get(os.path.abspath(root))
            return flight.waiters if flight is not None else 0

    def files(self, root: str | Path, extensions: frozenset[str] = frozenset()) -> list[str]:
        """The files under ``root`` with one of ``extensions`` (all files when empty)."""
        return keep_with_extensions(self.listing(root).files, extensions)

    def forget(self, root: str | Path) -> None:
        """Forget one root's listing: its next look-up walks it again (a look-up already in progress
        finishes for its own callers; later ones do not join it)."""
        key = os.path.abspath(root)
        with self._lock:
            self._listings.pop(key, None)
            self._flights.pop(key, None)

    def clear(self) -> None:
        """Forget every listing: the next look-up walks the folders again."""
        with self._lock:
            self._listings.clear()
            self._flights.clear()
