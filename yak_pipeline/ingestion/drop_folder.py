"""The drop folder on disk: which files are ready, and where each goes once it has been read.

Shared by the Dagster drop-folder sensor and the ``yak process`` command; parsing itself is
:mod:`yak_pipeline.ingestion.formats.history_files`. Layout::

    drop/                 files waiting (.jsonl, .json, .md, .zip; anything else is left alone and reported)
    drop/<user>/          files waiting whose exchanges are that user's: exports (ChatGPT, Claude,
                          Claude Code sessions) name no user, and Yak records without user_id
    drop/processed/       files that were read, good records and all
    drop/failed/          files that could not be read at all, each with <name>.error.txt beside it,
                          and <stem>.rejected<suffix> (+ .error.txt) holding a file's bad records

Order of work, so that a crash never loses an exchange:

1. :func:`read_and_parse` reads and parses a file and moves nothing;
2. the caller stores ``parsed.records`` in the database;
3. :func:`finish_file` writes the rejected records to ``failed/``, then moves the file to
   ``processed/`` (or, when it could not be parsed at all, to ``failed/`` with an error file).

A crash between 2 and 3 leaves the file in the drop folder, so the next scan reads it again;
ingestion is idempotent on the content hash, so that stores nothing twice. :func:`claim_file`
does 1 and 3 together, for callers that store nothing (tests, dry runs).

Nothing is ever deleted or overwritten: moves are renames within the folder, quarantine files are
written to a temporary name and then linked into place, and a name already taken gets a counter
(``chat.1.jsonl``, ``chat.2.jsonl``, …).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from yak_pipeline.core.types import InvalidUserId, validate_user_id
from yak_pipeline.ingestion.formats.exchange_files import exchange_file_suffix, parse_exchange_file
from yak_pipeline.ingestion.formats.exchange_records import (
    DEFAULT_MAX_RECORD_CHARS,
    ExchangeRecord,
    ParsedFile,
    RejectedRecord,
)
from yak_pipeline.ingestion.formats.history_files import history_file_suffix

PROCESSED_DIR_NAME: Final = "processed"
FAILED_DIR_NAME: Final = "failed"
ERROR_FILE_SUFFIX: Final = ".error.txt"
DEFAULT_MIN_AGE_SECONDS: Final = 2.0

# A counter this high means something is creating names in a loop; stop rather than spin forever.
_MAX_NAME_ATTEMPTS: Final = 100_000
# Filesystems that cannot hard-link (FAT, some network mounts) answer with one of these.
_NO_HARD_LINK_ERRNOS: Final = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS})


class DropFolderError(Exception):
    """A file could not be moved or quarantined; the message is one line saying which and why."""


@dataclass
class ClaimResult:
    """Where a drop-folder file ended up and what it yielded.

    ``path_processed`` is the file's new place in ``processed/`` (None if it failed as a whole);
    ``path_failed`` is either the file itself in ``failed/`` (``error`` then says why) or the
    quarantine file holding its rejected records (None when nothing was rejected).
    """

    path_processed: Path | None
    path_failed: Path | None
    records: list[ExchangeRecord]
    rejected_count: int
    error: str | None


@dataclass(frozen=True)
class QuarantinedFile:
    """One entry of ``failed/``: a whole file that could not be read (``kind == "file"``), or the
    rejected records of an otherwise good file (``kind == "records"``), with the reasons its
    ``.error.txt`` gives (``"line 3: …"`` per record, or the file's one reason)."""

    name: str
    kind: str
    records: int
    reasons: tuple[str, ...]
    quarantined_at: datetime


# How quarantine_records writes a rejected record's reason; a whole file's reason starts with its name.
_RECORD_REASON = re.compile(r"^(line|item) \d+: ")


def list_quarantine(drop_dir: Path) -> list[QuarantinedFile]:
    """What ``failed/`` holds, newest first, read from its ``.error.txt`` files (nothing is moved).

    A missing folder holds nothing; an error file whose data file is gone (moved away by a
    person fixing it) is left out.
    """
    folder = failed_dir(drop_dir)
    entries = []
    for error_path, modified in _visible_files(folder):
        if not error_path.name.endswith(ERROR_FILE_SUFFIX):
            continue
        data_name = error_path.name[: -len(ERROR_FILE_SUFFIX)]
        if not os.path.lexists(folder / data_name):
            continue
        try:
            reasons = tuple(line for line in error_path.read_text(encoding="utf-8", errors="replace").splitlines()
                            if line.strip())
        except OSError:
            continue
        per_record = bool(reasons) and all(_RECORD_REASON.match(line) for line in reasons)
        entries.append(QuarantinedFile(
            name=data_name, kind="records" if per_record else "file", records=len(reasons) if per_record else 0,
            reasons=reasons, quarantined_at=datetime.fromtimestamp(modified, UTC)))
    return sorted(entries, key=lambda entry: (entry.quarantined_at, entry.name), reverse=True)


def processed_dir(drop_dir: Path) -> Path:
    """The folder read files are moved to."""
    return drop_dir / PROCESSED_DIR_NAME


def failed_dir(drop_dir: Path) -> Path:
    """The folder unreadable files and rejected records are moved to."""
    return drop_dir / FAILED_DIR_NAME


def ensure_drop_dirs(drop_dir: Path) -> None:
    """Create the drop folder and its ``processed/`` and ``failed/`` subfolders if missing."""
    processed_dir(drop_dir).mkdir(parents=True, exist_ok=True)
    failed_dir(drop_dir).mkdir(parents=True, exist_ok=True)


def list_ready_files(
    drop_dir: Path, *, min_age_seconds: float = DEFAULT_MIN_AGE_SECONDS, now: float | None = None
) -> list[Path]:
    """Supported files directly in ``drop_dir`` that are ready to read, sorted by name.

    Skipped: hidden files (editors' and copy tools' temporaries), files modified less than
    ``min_age_seconds`` before ``now`` (probably still being written), folders (so ``processed/``
    and ``failed/`` are never rescanned) and unsupported suffixes (see :func:`list_unsupported_files`).
    A missing drop folder has no files.
    """
    current = time.time() if now is None else now
    ready = []
    for path, modified in _visible_files(drop_dir):
        if history_file_suffix(path.name) is not None and current - modified >= min_age_seconds:
            ready.append(path)
    return sorted(ready, key=lambda path: path.name)


def list_ready_files_by_user(
    drop_dir: Path, *, min_age_seconds: float = DEFAULT_MIN_AGE_SECONDS, now: float | None = None
) -> list[tuple[Path, str | None]]:
    """:func:`list_ready_files` of the drop folder (user None), then of each user folder ``drop/<user>/``.

    A user folder is a subfolder named by a valid user id, other than ``processed`` and ``failed``;
    its files' exchanges belong to that user (exports name no user of their own).
    """
    ready: list[tuple[Path, str | None]] = [(path, None) for path in list_ready_files(
        drop_dir, min_age_seconds=min_age_seconds, now=now)]
    for folder in _user_folders(drop_dir):
        ready += [(path, folder.name) for path in list_ready_files(folder, min_age_seconds=min_age_seconds, now=now)]
    return ready


def _user_folders(drop_dir: Path) -> list[Path]:
    try:
        entries = sorted(os.scandir(drop_dir), key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    folders = []
    for entry in entries:
        if entry.name in (PROCESSED_DIR_NAME, FAILED_DIR_NAME) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            folders.append(Path(drop_dir, validate_user_id(entry.name)))
        except InvalidUserId:
            continue
    return folders


def list_unsupported_files(drop_dir: Path) -> list[Path]:
    """Visible files in ``drop_dir`` that Yak does not read, sorted by name, so callers can report them.

    They are left where they are: a stray .txt or .csv is the user's, not ours to move.
    """
    unsupported = [path for path, _ in _visible_files(drop_dir) if history_file_suffix(path.name) is None]
    return sorted(unsupported, key=lambda path: path.name)


def _visible_files(drop_dir: Path) -> Iterator[tuple[Path, float]]:
    """``(path, modification time)`` of each non-hidden regular file directly in ``drop_dir``."""
    try:
        entries = list(os.scandir(drop_dir))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            if not entry.is_file():
                continue
            modified = entry.stat().st_mtime
        except OSError:  # removed or renamed since the listing: the next scan will see
            continue
        yield Path(entry.path), modified


def read_and_parse(path: Path, *, max_record_chars: int = DEFAULT_MAX_RECORD_CHARS) -> ParsedFile:
    """Read and parse one drop-folder file without moving it; an unreadable file is ``fatal``."""
    try:
        data = path.read_bytes()
    except OSError as error:
        return ParsedFile(fatal=f"cannot read the file: {error.strerror or error}")
    return parse_exchange_file(path.name, data, max_record_chars=max_record_chars)


def finish_file(path: Path, drop_dir: Path, parsed: ParsedFile, *, quarantine_suffix: str | None = None) -> ClaimResult:
    """Move a parsed file out of the drop folder (or a user folder in it); call it after storing ``parsed.records``.

    A fatal file goes to ``failed/<name>`` with ``failed/<name>.error.txt`` (``"<name>: <reason>"``).
    Otherwise rejected records are first written to ``failed/<stem>.rejected<suffix>`` with an
    error file listing ``line N: reason`` (``item N`` for .json lists), then the file goes to
    ``processed/<name>``. ``quarantine_suffix`` is the form of the rejected records when it is
    not the file's own (an export's zip quarantines conversations as ``.json``). Raises
    :class:`DropFolderError` if the disk refuses.
    """
    gone = f"{path.name} is no longer in the drop folder (claimed by another process?)"
    # Checked first so that a file someone else already finished gets no second quarantine copy.
    if not os.path.lexists(path):
        raise DropFolderError(gone)
    try:
        ensure_drop_dirs(drop_dir)
        if parsed.fatal is not None:
            failed_path = _move_no_clobber(path, failed_dir(drop_dir), path.name)
            error_text = f"{path.name}: {parsed.fatal}\n"
            _write_new_file(failed_dir(drop_dir), failed_path.name + ERROR_FILE_SUFFIX, error_text)
            return ClaimResult(None, failed_path, [], 0, parsed.fatal)
        # Quarantine first: until the original leaves the drop folder, a crash loses nothing.
        rejected_path = (quarantine_records(path.name, drop_dir, parsed.rejected, suffix=quarantine_suffix)
                         if parsed.rejected else None)
        processed_path = _move_no_clobber(path, processed_dir(drop_dir), path.name)
    except OSError as error:
        if isinstance(error, FileNotFoundError) and error.filename == str(path):
            raise DropFolderError(gone) from error
        raise DropFolderError(
            f"cannot move {path.name} out of the drop folder: {error.strerror or error}; "
            "check that the folder and its processed/ and failed/ subfolders are writable"
        ) from error
    return ClaimResult(processed_path, rejected_path, list(parsed.records), len(parsed.rejected), None)


def claim_file(path: Path, drop_dir: Path) -> ClaimResult:
    """:func:`read_and_parse` then :func:`finish_file`, for callers that do not store the records first."""
    return finish_file(path, drop_dir, read_and_parse(path))


def rejection_reason(name: str, record: RejectedRecord, *, suffix: str | None = None) -> str:
    """Where in file ``name`` a rejected record was and why, as its quarantine's error file says
    it: ``item 3: …`` in a JSON list, ``line 3: …`` otherwise."""
    suffix = suffix or exchange_file_suffix(name) or Path(name).suffix.lower()
    return f"{'item' if suffix == '.json' else 'line'} {record.line}: {record.reason}"


def quarantine_records(name: str, drop_dir: Path, rejected: tuple[RejectedRecord, ...] | list[RejectedRecord], *,
                       suffix: str | None = None) -> Path:
    """Write the rejected records of file ``name`` to ``failed/``, in their original form, and the
    reasons; return the records' file. ``suffix`` (default: the name's) picks the form."""
    ensure_drop_dirs(drop_dir)
    name_suffix = suffix or Path(name).suffix
    suffix = suffix or exchange_file_suffix(name) or Path(name).suffix.lower()
    if suffix == ".json":
        # A JSON list of the original items: fix them and drop the file back in.
        body = "[\n" + ",\n".join(record.raw for record in rejected) + "\n]\n"
    elif suffix == ".md":
        body = "\n\n".join(record.raw for record in rejected) + "\n"
    else:
        body = "".join(record.raw + "\n" for record in rejected)
    reasons = "".join(rejection_reason(name, record, suffix=suffix) + "\n" for record in rejected)
    directory = failed_dir(drop_dir)
    stem = name[: len(name) - len(Path(name).suffix)]
    rejected_path = _write_new_file(directory, f"{stem}.rejected{name_suffix}", body)
    _write_new_file(directory, rejected_path.name + ERROR_FILE_SUFFIX, reasons)
    return rejected_path


def _candidate_names(name: str) -> Iterator[str]:
    """``name``, then ``stem.1.suffix``, ``stem.2.suffix``, … (``chat.jsonl`` → ``chat.1.jsonl``)."""
    yield name
    dot = name.rfind(".")
    stem, suffix = (name[:dot], name[dot:]) if dot > 0 else (name, "")
    for counter in itertools.count(1):
        yield f"{stem}.{counter}{suffix}"


def _name_taken(target: Path) -> bool:
    # A leftover error file counts: it must never end up describing a different file.
    return os.path.lexists(target) or os.path.lexists(str(target) + ERROR_FILE_SUFFIX)


def _move_no_clobber(source: Path, directory: Path, name: str) -> Path:
    """Rename ``source`` into ``directory`` under ``name`` or the first free counter name; return it."""
    for candidate in itertools.islice(_candidate_names(name), _MAX_NAME_ATTEMPTS):
        target = directory / candidate
        if _name_taken(target):
            continue
        try:
            # link() fails if the target exists, which rename() would silently overwrite.
            os.link(source, target, follow_symlinks=False)
        except FileExistsError:
            continue  # another process took the name after our check
        except OSError as error:
            if error.errno not in _NO_HARD_LINK_ERRNOS:
                raise
            # Without hard links only the check above guards the name: a tiny race with
            # another Yak process choosing the same name at the same moment.
            os.rename(source, target)
            return target
        os.unlink(source)  # the data now lives under the new name
        return target
    raise DropFolderError(f"no free name for {name} in {directory} after {_MAX_NAME_ATTEMPTS} tries")


def _write_new_file(directory: Path, name: str, text: str) -> Path:
    """Write ``text`` to a new file in ``directory`` (``name`` or a counter name), never half-written."""
    descriptor, temporary = tempfile.mkstemp(prefix=".", suffix=".partial", dir=directory)
    try:
        # newline="" keeps each raw record's own line ending (CRLF stays CRLF).
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        return _move_no_clobber(Path(temporary), directory, name)
    finally:
        # Only our own staging copy: after a successful move it is already gone.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
