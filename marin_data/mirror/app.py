"""The mirror as a WSGI application: the read side of the Hub API that ``huggingface_hub`` clients use.

Endpoints (the spec is the client code: ``huggingface_hub`` ``file_download.py``, ``hf_api.py``,
``hf_file_system.py``):

=================================================  ==============================================================
``GET  /api/{datasets,models}``                    list the repos (``HfApi.list_datasets``)
``GET  /api/datasets/{repo}[/revision/{rev}]``     repo info with its commit id ``sha`` and ``siblings``
``GET  /api/datasets/{repo}/tree/{rev}[/{path}]``  listing, ``recursive``, paginated by ``Link: <...>; rel="next"``
``POST /api/datasets/{repo}/paths-info/{rev}``     items for the form field ``paths``
``GET  /api/datasets/{repo}/refs``, ``commits/..`` the one branch, ``main``, and its one commit
``HEAD|GET /datasets/{repo}/resolve/{rev}/{path}`` a file: ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag`` and
                                                   ``X-Linked-Size`` (LFS), ``Range`` -> 206
=================================================  ==============================================================

Model URLs (no ``datasets/`` prefix, ``/api/models/``) address the same directories, so a tokenizer repo can
be served beside the corpora. The only revisions are ``main`` and the current commit id; an older commit
id answers ``RevisionNotFound``, so a client never mixes two versions. No ``X-Xet-*`` header is ever sent:
clients download over plain HTTP. Writes (`marin_data.mirror.upload`) are refused unless the mirror was
started writable.
"""

from __future__ import annotations

import base64
import logging
import mimetypes
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, quote, urlencode

from werkzeug.wrappers import Request, Response

from marin_data.errors import UnsafeDestinationError
from marin_data.mirror.http import (BodyError, FileSpan, HubError, json_response, raw_segments, read_body, repo_path,
                                   snapshot_at)
from marin_data.mirror.repo import FileEntry, RepoStore, Snapshot, file_stamp
from marin_data.mirror.upload import Uploads
from marin_data.fileio.untrusted_json import loads

__all__ = ["MirrorApp", "DEFAULT_PAGE_SIZE"]

log = logging.getLogger(__name__)
access_log = logging.getLogger("marin_data.mirror.access")

DEFAULT_PAGE_SIZE = 1000  # the Hub's tree page size
_KINDS = {"datasets": "dataset", "models": "model"}


class MirrorApp:
    """The WSGI application serving the repos under ``root``.

    Args:
        root: folder whose ``org/name`` subfolders are the repos.
        token: with ``writable``, the bearer token every write must carry.
        writable: accept the Hub's upload protocol (`marin_data.mirror.upload`).
        page_size: tree entries per page (small in tests, to exercise pagination).
    """

    def __init__(self, root: str | os.PathLike, *, token: str | None = None, writable: bool = False,
                 page_size: int = DEFAULT_PAGE_SIZE):
        if writable and not token:
            raise ValueError("a writable mirror needs a token")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.repos = RepoStore(root)
        self.page_size = page_size
        self.uploads = Uploads(self.repos, token=token, writable=writable)

    def streams_body(self, environ: dict) -> bool:
        """True when this request's body is read only after its credentials are checked (a bearer token, or the
        signed URL of an LFS upload): such a body may stream, any other is read whole first, bounded."""
        return "HTTP_AUTHORIZATION" in environ or environ.get("PATH_INFO", "").startswith(f"/{Uploads.PREFIX}/")

    def __call__(self, environ, start_response):
        request = Request(environ)
        try:
            response = self.dispatch(request, raw_segments(environ))
        except HubError as e:
            response = e.response()
        except BodyError as e:  # a streamed body stalled or was malformed: the front closes the connection
            response = HubError(e.status, e.message).response()
        except UnsafeDestinationError as e:  # a link where a write goes (ROOT/org -> /elsewhere): refused
            response = HubError(400, f"{e.actual} where the mirror writes {e.expected}: refused, the mirror never "
                                     "writes through a symlink").response()
        except Exception:  # noqa: BLE001 - a server answers 500 and stays up
            log.exception("error while serving %s %s", request.method, request.path)
            response = HubError(500, "internal mirror error (see the server log)").response()
        access_log.info("%s %s %s %s", request.remote_addr, request.method, request.full_path.rstrip("?"),
                        response.status_code)
        return response(environ, start_response)

    # --- routing -----------------------------------------------------------------------------------------
    def dispatch(self, request: Request, segs: list[str]) -> Response:
        if segs[:1] == ["api"]:
            return self._api(request, segs[1:])
        if segs[:1] == [self.uploads.PREFIX]:
            return self.uploads.transfer(request, segs[1:])
        kind, segs = ("dataset", segs[1:]) if segs[:1] == ["datasets"] else ("model", segs)
        if len(segs) >= 3 and segs[1].endswith(".git"):  # {repo}.git/info/lfs/objects/batch
            repo_id = f"{segs[0]}/{segs[1][:-4]}"
            if segs[2:] == ["info", "lfs", "objects", "batch"] and request.method == "POST":
                return self.uploads.lfs_batch(request, repo_id, kind)
        if len(segs) >= 5 and segs[2] == "resolve" and request.method in ("GET", "HEAD"):
            return self._resolve(request, f"{segs[0]}/{segs[1]}", segs[3], segs[4:])
        raise HubError(404, f"no such endpoint: {request.method} {request.path}")

    def _api(self, request: Request, segs: list[str]) -> Response:
        m = "GET" if request.method == "HEAD" else request.method  # the server sends HEAD's headers only
        if segs == ["repos", "create"] and m == "POST":
            return self.uploads.create_repo(request)
        if segs == ["validate-yaml"] and m == "POST":
            return json_response({"errors": [], "warnings": []})
        if segs == ["whoami-v2"] and m == "GET":
            return self.uploads.whoami(request)
        kind = _KINDS.get(segs[0]) if segs else None
        if kind is None:
            raise HubError(404, f"no such endpoint: {m} {request.path} (this mirror serves datasets and models)")
        if len(segs) == 1 and m == "GET":
            return self._list_repos(request)
        if len(segs) < 3:
            raise HubError(404, f"no such endpoint: {m} {request.path}")
        repo_id, action, rest = f"{segs[1]}/{segs[2]}", (segs[3:4] or [""])[0], segs[4:]
        rev = "/".join(rest[:1]) or "main"
        if action == "" and m == "GET":
            return self._info(request, repo_id, "main")
        if action == "revision" and m == "GET" and rest:
            return self._info(request, repo_id, "/".join(rest))
        if action == "tree" and m == "GET" and rest:
            return self._tree(request, repo_id, rev, rest[1:], kind)
        if action == "paths-info" and m == "POST" and rest:
            return self._paths_info(request, repo_id, rev)
        if action == "refs" and m == "GET":
            snap = self._at(repo_id, "main")
            return json_response({"branches": [{"name": "main", "ref": "refs/heads/main",
                                                "targetCommit": snap.commit}], "tags": [], "converts": []})
        if action == "commits" and m == "GET":
            snap = self._at(repo_id, rev)
            return json_response([{"id": snap.commit, "title": "Current content of the mirror", "message": "",
                                   "authors": [], "date": _iso(snap.last_modified)}])
        if action == "preupload" and m == "POST" and rest:
            return self.uploads.preupload(request, repo_id, rev)
        if action == "commit" and m == "POST" and rest:
            return self.uploads.commit(request, repo_id, rev, kind)
        if action in ("xet-write-token", "xet-read-token"):
            raise HubError(501, "this mirror speaks plain HTTP and Git LFS, not Xet: set HF_HUB_DISABLE_XET=1 "
                                "(marin-data publish does this by itself)")
        raise HubError(404, f"no such endpoint: {m} {request.path}")

    # --- read endpoints ------------------------------------------------------------------------------------
    def _at(self, repo_id: str, rev: str, *, refresh: bool = False) -> Snapshot:
        return snapshot_at(self.repos, repo_id, rev, refresh=refresh)

    def _list_repos(self, request: Request) -> Response:
        search, author = request.args.get("search", ""), request.args.get("author")
        return json_response([{"id": r, "author": r.split("/")[0]} for r in self.repos.repo_ids()
                              if search.lower() in r.lower() and author in (None, r.split("/")[0])])

    def _info(self, request: Request, repo_id: str, rev: str) -> Response:
        snap = self._at(repo_id, rev)
        blobs = request.args.get("blobs", "").lower() in ("1", "true")
        siblings = []
        for path in sorted(snap.files):
            entry = snap.files[path]
            sib: dict = {"rfilename": path}
            if blobs:
                sib.update(size=entry.size, blobId=entry.oid)
                if entry.lfs:
                    sib["lfs"] = {"sha256": entry.sha256, "size": entry.size,
                                  "pointerSize": entry.to_json()["lfs"]["pointerSize"]}
            siblings.append(sib)
        when = _iso(snap.last_modified)
        card = _card_data(snap, self.repos.root)
        return json_response({
            "_id": snap.commit[:24], "id": repo_id, "author": repo_id.split("/")[0], "sha": snap.commit,
            "lastModified": when, "createdAt": when, "private": False, "gated": False, "disabled": False,
            "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
            "usedStorage": sum(e.size for e in snap.files.values()), **({"cardData": card} if card else {}),
        })

    def _tree(self, request: Request, repo_id: str, rev: str, path_segs: list[str], kind: str) -> Response:
        snap = self._at(repo_id, rev)
        path = repo_path(path_segs, allow_empty=True)
        if path not in snap.folders:
            raise HubError(404, f"{path!r} is not a folder of {repo_id}", code="EntryNotFound", commit=snap.commit)
        recursive = request.args.get("recursive", "").lower() in ("1", "true")
        expand = request.args.get("expand", "false")
        try:
            limit = min(int(request.args.get("limit", self.page_size)), self.page_size)
            offset = int(base64.urlsafe_b64decode(request.args["cursor"]).decode()) if "cursor" in request.args else 0
            if limit < 1 or offset < 0:
                raise ValueError("out of range")
        except (ValueError, UnicodeDecodeError) as e:
            raise HubError(400, f"bad limit or cursor: {e}") from e
        paths = snap.listing(path, recursive=recursive)
        page = paths[offset:offset + limit]
        headers = {"X-Repo-Commit": snap.commit}
        if offset + limit < len(paths):
            # The next page is pinned to this commit: a repo that changes mid-listing fails loudly
            # (RevisionNotFound) instead of mixing two versions.
            prefix = "datasets" if kind == "dataset" else "models"
            query = urlencode({"recursive": str(recursive).lower(), "expand": expand, "limit": limit,
                               "cursor": base64.urlsafe_b64encode(str(offset + limit).encode()).decode()})
            tail = f"/{quote(path, safe='')}" if path else ""
            headers["Link"] = (f'<{request.root_url.rstrip("/")}/api/{prefix}/{repo_id}/tree/{snap.commit}{tail}'
                               f'?{query}>; rel="next"')
        return json_response([snap.item(p) for p in page], headers=headers)

    def _paths_info(self, request: Request, repo_id: str, rev: str) -> Response:
        snap = self._at(repo_id, rev)
        body = read_body(request)
        if request.is_json:
            try:
                paths = (loads(body) or {}).get("paths", [])
            except (ValueError, AttributeError) as e:
                raise HubError(400, f"malformed JSON body: {e}") from e
        else:
            paths = parse_qs(body.decode("latin-1"), keep_blank_values=True).get("paths", [])
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise HubError(400, "paths must be a list of strings")
        items = [snap.item(repo_path(p.strip("/").split("/"))) for p in paths if p.strip("/")]
        return json_response([i for i in items if i is not None], headers={"X-Repo-Commit": snap.commit})

    def _resolve(self, request: Request, repo_id: str, rev: str, path_segs: list[str]) -> Response:
        for attempt in range(2):
            snap = self._at(repo_id, rev, refresh=attempt > 0)
            try:
                path = repo_path(path_segs)
            except HubError as e:
                e.commit = snap.commit
                raise
            entry = snap.files.get(path)
            if entry is None:
                raise HubError(404, f"{path} not found in {repo_id} at {snap.commit}", code="EntryNotFound",
                               commit=snap.commit)
            f = _open_inside(snap.directory / path, self.repos.root)
            if f is not None and file_stamp(os.fstat(f.fileno())) == entry.stamp:
                return _file_response(request, snap, entry, f)
            if f is not None:
                f.close()  # changed since the snapshot: rescan once, then answer for the new content
        raise HubError(503, f"{path} keeps changing on the mirror; retry later", commit=snap.commit)


_CARD_LIMIT = 1 << 20  # a dataset card's YAML header is kilobytes


def _card_data(snap: Snapshot, root: Path) -> dict | None:
    """The YAML header of the repo's ``README.md``, as the Hub returns it in ``cardData`` (``datasets`` reads
    the configs from it); None without a card or a readable header."""
    import yaml

    entry = snap.files.get("README.md")
    f = _open_inside(snap.directory / "README.md", root) if entry is not None and entry.size <= _CARD_LIMIT else None
    if f is None:
        return None
    with f:
        text = f.read(_CARD_LIMIT).decode("utf-8", errors="replace")
    head, sep, _ = text.removeprefix("---\n").partition("\n---")
    if not text.startswith("---\n") or not sep:
        return None
    class NoAliases(yaml.SafeLoader):  # an alias bomb of a few bytes would expand in the JSON answer
        def compose_node(self, parent, index):
            if self.check_event(yaml.events.AliasEvent):
                raise yaml.YAMLError("aliases are not read")
            return super().compose_node(parent, index)

    try:
        data = yaml.load(head, Loader=NoAliases)  # noqa: S506 - a SafeLoader that also refuses aliases
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def _open_inside(path: Path, root: Path):
    """Open ``path`` for reading if it still resolves inside ``root``; None if it vanished."""
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(root):
        return None
    try:
        return open(real, "rb")
    except OSError:
        return None


_EMPTY_SUFFIX = re.compile(r"\s*bytes\s*=\s*-0+\s*", re.IGNORECASE)


def _file_response(request: Request, snap: Snapshot, entry: FileEntry, f) -> Response:
    size = entry.size
    name = entry.path.rpartition("/")[2]
    headers = {
        "X-Repo-Commit": snap.commit,
        "ETag": f'"{entry.sha256 or entry.oid}"',
        "Accept-Ranges": "bytes",
        "Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}",
    }
    if entry.lfs:
        headers["X-Linked-Etag"] = f'"{entry.sha256}"'
        headers["X-Linked-Size"] = str(size)
    status, start, length = 200, 0, size
    rng = request.range if "Range" in request.headers else None
    # RFC 9110 14.2: a malformed range or an unknown unit is ignored; several ranges get the whole file. A
    # zero-length suffix ("bytes=-0") is well-formed but selects nothing: unsatisfiable (werkzeug drops it).
    empty_suffix = rng is None and _EMPTY_SUFFIX.fullmatch(request.headers.get("Range", ""))
    if empty_suffix or (rng is not None and rng.units == "bytes" and len(rng.ranges) == 1):
        span = None
        if not empty_suffix:
            first = rng.ranges[0][0]
            if first < 0 and -first > size > 0:
                rng.ranges[0] = (-size, None)  # a suffix longer than the file: the whole file
            span = rng.range_for_length(size)
        if span is None:
            f.close()
            headers["Content-Range"] = f"bytes */{size}"
            return Response(b"", status=416, headers=headers)
        start, stop = span
        status, length = 206, stop - start
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
    headers["Content-Length"] = str(length)
    mimetype = mimetypes.guess_type(name)[0] if not entry.lfs else None
    if request.method == "HEAD":
        f.close()
        body = []  # an iterable, not b"": werkzeug would reset Content-Length to 0 for bytes
    else:
        body = FileSpan(f, start, length)
    return Response(body, status=status, headers=headers, mimetype=mimetype or "application/octet-stream",
                    direct_passthrough=True)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
