"""HTTP plumbing of the mirror: the Hub's error shape, JSON responses and safe parsing of request paths.

The Hub client reads errors from headers: ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``) picks the exception ``huggingface_hub`` raises, ``X-Error-Message`` its text, and on a
missing file ``X-Repo-Commit`` lets it cache the absence per commit (``huggingface_hub.utils._http.
hf_raise_for_status``, ``file_download._get_metadata_or_catch_error``).

Paths are parsed from the *raw* request URI, segment by segment, and each segment is percent-decoded on
its own: a client quotes a revision or a tree path with ``safe=""`` (``refs%2Fpr%2F1``), so the split must
happen before decoding, and ``%2e%2e`` must be seen as the ``..`` it is. Every decoded path is checked
component by component (`repo_path`) before it is looked up; lookups only ever go through a snapshot's
dictionary of files, never through a path built from the request.
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

from werkzeug.wrappers import Request, Response

from marin_data.mirror.repo import RepoStore, Snapshot, hidden_file

__all__ = ["HubError", "BodyError", "FileSpan", "json_response", "raw_segments", "repo_path", "snapshot_at", "read_body",
           "MAX_PATH_CHARS", "MAX_JSON_BODY", "MAIN_REVISIONS"]

MAX_PATH_CHARS = 4096
MAX_JSON_BODY = 1 << 20  # a JSON or form body (paths-info, preupload, LFS batch): ~5,000 paths; 413 beyond
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAIN_REVISIONS = ("main", "refs/heads/main")  # the mirror's one branch


class FileSpan:
    """A response body that is ``length`` bytes of the open file ``file`` from ``start``. The HTTP front
    (`marin_data.mirror.front`) sends it with ``sendfile``, so its bytes go from the page cache to the
    socket through no buffer of the server's; any other WSGI server iterates it, ``block`` bytes at a time.
    Closing it closes the file (also when it was never read)."""

    def __init__(self, file, start: int, length: int, block: int = 256 << 10):
        self.file, self.start, self.length, self.block = file, start, length, block

    def __iter__(self):
        self.file.seek(self.start)
        left = self.length
        while left > 0:
            data = self.file.read(min(self.block, left))
            if not data:
                return  # the file shrank: the client sees a short body against Content-Length
            left -= len(data)
            yield data

    def close(self) -> None:
        self.file.close()


class BodyError(OSError):
    """A streamed request body that could not be read: it stalled past the body time limit (408) or its
    chunked framing is malformed (400). The HTTP front raises it from ``wsgi.input``; the app answers with
    ``status``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class HubError(Exception):
    """An error the mirror answers with, in the Hub's shape.

    Args:
        status: HTTP status.
        message: one line for the user (sent as ``X-Error-Message`` and as ``{"error": ...}``).
        code: the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``), if any.
        commit: the repo's commit id, sent as ``X-Repo-Commit`` where the client uses it.
        extra: more fields of the JSON body (a 409 on repo creation carries the repo's ``url``).
    """

    def __init__(self, status: int, message: str, *, code: str | None = None, commit: str | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.commit = commit
        self.extra = extra or {}

    def response(self) -> Response:
        # A message may quote the request: no CR, LF or other control character may reach a header
        headers = {"X-Error-Message": _CONTROL.sub("?", self.message.encode("ascii", "replace").decode())}
        if self.code:
            headers["X-Error-Code"] = self.code
        if self.commit:
            headers["X-Repo-Commit"] = self.commit
        return json_response({"error": self.message, **self.extra}, status=self.status, headers=headers)


def json_response(data: object, *, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data), status=status, headers=headers, mimetype="application/json")


def raw_segments(environ: dict) -> list[str]:
    """The request path split on ``/`` *before* percent-decoding, each segment then decoded.

    Raises:
        HubError: 400 on a path that is too long or not valid UTF-8 once decoded.
    """
    raw = environ.get("REQUEST_URI") or environ.get("RAW_URI")
    if raw is None:  # a server that only gives the decoded path: re-encode it (WSGI passes it as latin-1)
        from urllib.parse import quote

        raw = quote(environ.get("PATH_INFO", "").encode("latin-1"), safe="/")
    raw = raw.split("?", 1)[0]
    if "://" in raw:  # absolute-form request target (a proxy request): keep only the path
        raw = "/" + raw.split("://", 1)[1].partition("/")[2]
    if len(raw) > MAX_PATH_CHARS:
        raise HubError(414, "request path too long")
    try:
        return [unquote(s, errors="strict") for s in raw.split("/")[1:]]
    except UnicodeDecodeError as e:
        raise HubError(400, f"request path is not valid UTF-8: {e}") from e


def repo_path(segments: list[str], *, allow_empty: bool = False) -> str:
    """Join decoded segments into a repo-relative path, refusing anything that could leave the repo.

    ``..`` and ``.`` components (also when they arrived encoded), empty components (``//``, a leading
    ``/``: absolute paths), backslashes and NUL bytes are refused with 400. Hidden components (``.git``,
    ``.cache``) are not part of any repo: 404.

    Raises:
        HubError: 400 for a malformed or escaping path, 404 (EntryNotFound) for a hidden one.
    """
    path = "/".join(segments)
    if not path and allow_empty:
        return ""
    parts = path.split("/")
    if (not path or "\\" in path or _CONTROL.search(path) or any(p in ("", ".", "..") for p in parts)
            or len(path) > MAX_PATH_CHARS):
        raise HubError(400, f"invalid path {path!r}: absolute, '..', '.', empty components and control "
                            "characters are refused")
    if any(p.startswith(".") for p in parts[:-1]) or hidden_file(parts[-1]):
        raise HubError(404, f"{path}: hidden paths are not served", code="EntryNotFound")
    return path


def read_body(request: Request, limit: int = MAX_JSON_BODY) -> bytes:
    """The request body, refused with 413 before it is read (``Content-Length``) or as soon as it passes
    ``limit`` bytes (a chunked body): a JSON body is parsed whole, so it is bounded first.

    Raises:
        HubError: 413 over ``limit``.
    """
    if request.content_length is not None and request.content_length > limit:
        raise HubError(413, f"request body of {request.content_length} bytes is over the limit of {limit}")
    out = bytearray()
    while len(out) <= limit and (block := request.stream.read(min(64 << 10, limit + 1 - len(out)))):
        out += block
    if len(out) > limit:
        raise HubError(413, f"request body is over the limit of {limit} bytes")
    return bytes(out)


def snapshot_at(repos: RepoStore, repo_id: str, rev: str, *, refresh: bool = False) -> Snapshot:
    """The repo's snapshot if ``rev`` names it: ``main`` or the current commit id.

    Raises:
        HubError: 404 ``RepoNotFound`` or ``RevisionNotFound``. An older commit id is not found: the mirror
            keeps no history, and a client must not mix two versions of a repo.
    """
    snap = repos.snapshot(repo_id, refresh=refresh)
    if snap is None:
        raise HubError(404, f"Repository {repo_id} not found on this mirror", code="RepoNotFound")
    if rev not in MAIN_REVISIONS and rev != snap.commit:
        raise HubError(404, f"Revision {rev!r} not found in {repo_id}: this mirror has only 'main', now at "
                            f"{snap.commit}", code="RevisionNotFound")
    return snap
