"""The write side of the mirror: the Hub's upload protocol as ``HfApi`` speaks it, behind one bearer token.

`Uploads` answers ``create_repo``, ``preupload`` (upload modes, and the oids already there, so a re-publish
sends only what changed), the LFS batch API, the upload and verify URLs (signed with a key that lives only
in this process) and ``commit``. A commit is checked whole before anything is written, then applied file by
file, each atomically, ``manifest.json`` last; commits to one repo are serialised. Every write needs
``Authorization: Bearer <token>`` on a mirror started ``--writable --token T``. Xet uploads are refused with
a message saying to set ``HF_HUB_DISABLE_XET=1``. The protocol step by step: docs/data.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from werkzeug.wrappers import Request, Response

from marin_data.fileio.atomic import SafeDir, atomic_path, atomic_write_bytes
from marin_data.layout import MANIFEST
from marin_data.mirror.http import MAIN_REVISIONS, HubError, json_response, read_body, repo_path, snapshot_at
from marin_data.mirror.repo import RepoStore, Snapshot, hidden_file, split_repo_id
from marin_data.stores.hub_ids import is_lfs
from marin_data.fileio.untrusted_json import loads

__all__ = ["Uploads", "STAGING"]

STAGING = ".mirror-uploads"  # ROOT/.mirror-uploads/org/name/<oid>: hidden, never a repo, same filesystem
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
_URL_LIFETIME = 24 * 3600  # seconds an upload URL stays valid
_MAX_COMMIT_LINE = 128 << 20  # one NDJSON line: a regular file (<= 10 MiB) in base64, with a wide margin
_MAX_COMMIT_BYTES = 2 << 30


@dataclass(frozen=True)
class _Add:
    path: str
    content: bytes | None  # a regular file's bytes
    oid: str | None  # an LFS file's sha256
    size: int | None


class Uploads:
    """The write endpoints; every one of them refuses unless the mirror is writable and the token matches."""

    PREFIX = "__mirror"  # URL prefix of the upload and verify URLs handed out by the LFS batch endpoint

    def __init__(self, repos: RepoStore, *, token: str | None, writable: bool):
        self.repos = repos
        self.writable = writable
        self._token = (token or "").encode()
        self._key = secrets.token_bytes(32)
        self.staging = repos.root / STAGING

    # --- auth --------------------------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        if not self.writable:
            raise HubError(403, "this mirror is read-only; start it with `marin-data serve ROOT --writable "
                                "--token T` to accept uploads")
        auth = request.headers.get("Authorization", "")
        given = auth[7:].strip().encode() if auth[:7].lower() == "bearer " else b""
        if not hmac.compare_digest(given, self._token):
            raise HubError(401, "Invalid credentials in Authorization header")

    def whoami(self, request: Request) -> Response:
        self._authorize(request)
        return json_response({"type": "user", "name": "mirror-writer", "fullname": "mirror writer", "orgs": [],
                              "auth": {"type": "access_token",
                                       "accessToken": {"displayName": "mirror", "role": "write"}}})

    def _writable_snapshot(self, request: Request, repo_id: str, rev: str) -> Snapshot:
        self._authorize(request)
        if rev not in MAIN_REVISIONS:
            raise HubError(400, f"only 'main' can be written on this mirror, not {rev!r}")
        if request.args.get("create_pr"):
            raise HubError(400, "this mirror has no pull requests: commit to main")
        return snapshot_at(self.repos, repo_id, "main")

    # --- repos -------------------------------------------------------------------------------------------
    def create_repo(self, request: Request) -> Response:
        self._authorize(request)
        body = _json(request)
        kind = body.get("type") or "model"
        if kind not in ("model", "dataset"):
            raise HubError(400, f"this mirror holds datasets and models, not {kind}s")
        repo_id = f"{body.get('organization')}/{body.get('name')}"
        parts = split_repo_id(repo_id)
        if body.get("organization") is None or parts is None:
            raise HubError(400, f"invalid repo id {repo_id!r}: give it as org/name (letters, digits, '-', '_', '.')")
        url = f"{request.root_url}{'datasets/' if kind == 'dataset' else ''}{repo_id}"
        if self.repos.repo_dir(repo_id) is not None:
            raise HubError(409, f"You already created this {kind} repo: {repo_id}", extra={"url": url})
        SafeDir(self.repos.root, f"{parts[0]}/{parts[1]}").close()  # never through a link: ROOT/org -> /elsewhere
        return json_response({"url": url, "name": repo_id, "id": repo_id})

    # --- preupload ---------------------------------------------------------------------------------------
    def preupload(self, request: Request, repo_id: str, rev: str) -> Response:
        snap = self._writable_snapshot(request, repo_id, rev)
        files = _json(request).get("files")
        if not isinstance(files, list):
            raise HubError(400, "preupload expects {'files': [{'path', 'sample', 'size'}, ...]}")
        out = []
        for item in files:
            try:
                if _hidden(item["path"]):  # .marin.lock, .gitattributes...: never served, so never stored
                    out.append({"path": item["path"], "uploadMode": "regular", "shouldIgnore": True, "oid": None})
                    continue
                path, size = _write_path(item["path"]), int(item["size"])
                sample = base64.b64decode(item.get("sample", ""), validate=True)
            except (KeyError, TypeError, ValueError, binascii.Error) as e:
                raise HubError(400, f"malformed preupload item {item!r}: {e}") from e
            lfs = is_lfs(path, size, sample)
            have = snap.files.get(path)
            oid = None if have is None or have.lfs != lfs else (have.sha256 or have.oid)
            out.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                        "oid": oid})
        return json_response({"files": out, "commitOid": snap.commit})

    # --- LFS ---------------------------------------------------------------------------------------------
    def lfs_batch(self, request: Request, repo_id: str, kind: str) -> Response:
        snap = self._writable_snapshot(request, repo_id, "main")
        body = _json(request)
        if body.get("operation") != "upload":
            raise HubError(400, "the LFS batch endpoint of this mirror only uploads; download through /resolve")
        have = {e.sha256 for e in snap.files.values() if e.lfs}
        objects = []
        for obj in body.get("objects") or []:
            oid, size = obj.get("oid") if isinstance(obj, dict) else None, obj.get("size") if isinstance(
                obj, dict) else None
            if not (isinstance(oid, str) and _HEX64.match(oid) and isinstance(size, int) and size >= 0):
                objects.append({"oid": str(oid), "size": size if isinstance(size, int) else 0,
                                "error": {"code": 422, "message": "oid must be a hex sha256 and size an int >= 0"}})
                continue
            if oid in have or self._staged(repo_id, oid, size) is not None:
                objects.append({"oid": oid, "size": size})  # already here: no action, the client skips it
                continue
            base = f"{request.root_url}{self.PREFIX}"
            expires = int(time.time()) + _URL_LIFETIME
            sig = self._sign(repo_id, oid, size, expires)
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                "upload": {"href": f"{base}/upload/{repo_id}/{oid}?size={size}&expires={expires}&sig={sig}"},
                "verify": {"href": f"{base}/verify/{repo_id}"},
            }})
        return Response(json.dumps({"transfer": "basic", "objects": objects, "hash_algo": "sha256"}),
                        mimetype="application/vnd.git-lfs+json")

    def _sign(self, repo_id: str, oid: str, size: int, expires: int) -> str:
        return hmac.new(self._key, f"{repo_id}\n{oid}\n{size}\n{expires}".encode(), hashlib.sha256).hexdigest()

    def _staged(self, repo_id: str, oid: str, size: int | None = None) -> Path | None:
        """The received object ``oid`` for ``repo_id`` (of ``size`` bytes when given), if there is one."""
        path = self.staging / repo_id / oid
        try:
            st = path.stat()
        except OSError:
            return None
        return path if size is None or st.st_size == size else None

    def transfer(self, request: Request, segs: list[str]) -> Response:
        """The URLs handed out by `lfs_batch`: ``PUT upload/{repo}/{oid}`` and ``POST verify/{repo}``."""
        if len(segs) == 4 and segs[0] == "upload" and request.method == "PUT":
            return self._receive(request, f"{segs[1]}/{segs[2]}", segs[3])
        if len(segs) == 3 and segs[0] == "verify" and request.method == "POST":
            self._authorize(request)
            body = _json(request)
            oid, size = body.get("oid"), body.get("size")
            if not (isinstance(oid, str) and _HEX64.match(oid)) or self._staged(f"{segs[1]}/{segs[2]}", oid,
                                                                                size) is None:
                raise HubError(404, f"LFS object {oid} of size {size} was not received")
            return json_response({"message": "verified"})
        raise HubError(404, f"no such endpoint: {request.method} {request.path}")

    def _receive(self, request: Request, repo_id: str, oid: str) -> Response:
        if not self.writable:
            raise HubError(403, "this mirror is read-only")
        try:
            size, expires = int(request.args["size"]), int(request.args["expires"])
            sig = request.args["sig"]
        except (KeyError, ValueError) as e:
            raise HubError(400, "malformed upload URL") from e
        if not (_HEX64.match(oid) and hmac.compare_digest(sig, self._sign(repo_id, oid, size, expires))):
            raise HubError(403, "upload URL signature does not match (a URL from another server run?)")
        if time.time() > expires:
            raise HubError(403, "upload URL expired: ask the LFS batch endpoint for a new one")
        h, got = hashlib.sha256(), 0
        with atomic_path(self.staging / repo_id / oid, root=self.repos.root) as tmp:
            with open(tmp, "wb") as f:
                while got <= size and (block := request.stream.read(_CHUNK)):
                    h.update(block)
                    f.write(block)
                    got += len(block)
            if got != size or h.hexdigest() != oid:
                raise HubError(400, f"upload of {oid} rejected: received {got} bytes with sha256 {h.hexdigest()}, "
                                    f"expected {size} bytes with sha256 {oid}")
        return Response(b"", status=200)

    # --- commit ------------------------------------------------------------------------------------------
    def commit(self, request: Request, repo_id: str, rev: str, kind: str) -> Response:
        self._writable_snapshot(request, repo_id, rev)
        header, adds, deletes = _parse_commit(request)
        with self.repos.lock(repo_id):
            snap = snapshot_at(self.repos, repo_id, "main", refresh=True)
            parent = header.get("parentCommit")
            if parent is not None and parent != snap.commit:
                raise HubError(412, f"parentCommit {parent} is not the head of main ({snap.commit})")
            sources = self._check(repo_id, snap, adds, deletes)
            order = sorted(adds, key=lambda a: (a.path == MANIFEST, a.content is not None))
            for add in order:
                if add.path != MANIFEST:
                    self._write(snap, add, sources.get(add.path))
            for path, folder in deletes:
                _delete(snap.directory, path, folder)
            for add in order:
                if add.path == MANIFEST:
                    self._write(snap, add, sources.get(add.path))
            for add in adds:
                if add.oid is not None:
                    (self.staging / repo_id / add.oid).unlink(missing_ok=True)  # consumed
            self.repos.invalidate(repo_id)
            new = snapshot_at(self.repos, repo_id, "main")
        prefix = "datasets/" if kind == "dataset" else ""
        return json_response({"success": True, "commitOid": new.commit, "pullRequestUrl": None,
                              "commitUrl": f"{request.root_url}{prefix}{repo_id}/commit/{new.commit}"})

    def _check(self, repo_id: str, snap: Snapshot, adds: list[_Add], deletes: list[tuple[str, bool]]) -> dict[str, Path]:
        """Refuse the commit before writing anything; return the source file of each LFS addition."""
        by_sha = {e.sha256: snap.directory / e.path for e in snap.files.values() if e.lfs}
        sources = {}
        added = {a.path for a in adds}
        for add in adds:
            if add.path in snap.folders or any(p in snap.files and p not in added for p in _parents(add.path)):
                raise HubError(400, f"{add.path}: a file and a folder cannot share a path")
            for folder in _parents(add.path):  # symlinked folders are not in the snapshot: look at the disk
                if os.path.islink(snap.directory / folder):
                    raise HubError(400, f"{add.path}: {folder} is a symlink on the mirror, and the mirror never "
                                        "writes through a symlink")
            if add.oid is not None:
                src = self._staged(repo_id, add.oid, add.size) or by_sha.get(add.oid)
                if src is None:
                    raise HubError(422, f"{add.path}: LFS object {add.oid} was never uploaded to this mirror")
                sources[add.path] = src
        for path, folder in deletes:
            if (path not in snap.folders) if folder else (path not in snap.files):
                raise HubError(404, f"{path}: A file with this name doesn't exist" if not folder else
                               f"{path}: no such folder", code="EntryNotFound", commit=snap.commit)
        return sources

    def _write(self, snap: Snapshot, add: _Add, src: Path | None) -> None:
        """Write one file of a commit atomically, never through a symlink below the repo's folder."""
        target = snap.directory / add.path
        if add.content is not None:
            atomic_write_bytes(target, add.content, root=snap.directory)
            return
        if src.is_relative_to(self.staging) and _link_into(src, target, snap.directory):
            return  # no copy: the staged object was checked when it was received
        with atomic_path(target, root=snap.directory) as tmp:
            h = hashlib.sha256()
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                while block := fin.read(_CHUNK):
                    h.update(block)
                    fout.write(block)
            if h.hexdigest() != add.oid:
                raise HubError(409, f"{add.path}: the mirror's copy of LFS object {add.oid} is corrupt; upload it "
                                    "again")


def _json(request: Request) -> dict:
    try:
        data = loads(read_body(request))
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise HubError(400, "expected a JSON object body")
    return data


def _write_path(path: object) -> str:
    """A repo path a client may write: safe, and not hidden (hidden paths are never served)."""
    if not isinstance(path, str):
        raise HubError(400, f"path must be a string, got {path!r}")
    try:
        return repo_path(path.split("/"))
    except HubError as e:
        raise HubError(400, f"cannot write {path!r}: {e.message}") from e


def _hidden(path: object) -> bool:
    if not isinstance(path, str):
        return False
    *folders, name = path.split("/")
    return any(p.startswith(".") and p not in (".", "..") for p in folders) or (name not in ("", ".", "..")
                                                                               and hidden_file(name))


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _parse_commit(request: Request) -> tuple[dict, list[_Add], list[tuple[str, bool]]]:
    """Read the NDJSON commit body line by line, with bounded memory per line and in total."""
    header: dict = {}
    adds: dict[str, _Add] = {}
    deletes: list[tuple[str, bool]] = []
    total = 0
    while line := request.stream.readline(_MAX_COMMIT_LINE + 1):
        total += len(line)
        if len(line) > _MAX_COMMIT_LINE or total > _MAX_COMMIT_BYTES:
            raise HubError(413, "commit too large: send regular files above 10 MiB through LFS, or split it")
        if not line.strip():
            continue
        try:
            item = loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = dict(value)
            elif key == "file":
                if value.get("encoding", "base64") != "base64":
                    raise ValueError(f"unsupported encoding {value.get('encoding')!r}")
                path = _write_path(value["path"])
                adds[path] = _Add(path, base64.b64decode(value["content"], validate=True), None, None)
            elif key == "lfsFile":
                path, oid = _write_path(value["path"]), str(value["oid"])
                if value.get("algo", "sha256") != "sha256" or not _HEX64.match(oid):
                    raise ValueError(f"LFS oid must be a hex sha256, got {oid!r}")
                size = value.get("size")
                adds[path] = _Add(path, None, oid, int(size) if size is not None else None)
            elif key in ("deletedFile", "deletedFolder"):
                deletes.append((_write_path(value["path"].rstrip("/")), key == "deletedFolder"))
            else:
                raise ValueError(f"unsupported operation {key!r}")
        except HubError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as e:
            raise HubError(400, f"malformed commit line: {e}") from e
    if not header:
        raise HubError(400, "commit has no header line")
    return header, list(adds.values()), deletes


def _link_into(src: Path, target: Path, repo: Path) -> bool:
    """Hard-link ``src`` to ``target`` atomically, never through a symlink; False when they are on two file
    systems (copy instead)."""
    with SafeDir.of(target, repo) as folder:
        folder.regular(target.name)
        tmp = f"{target.name}.{secrets.token_hex(4)}.part"
        try:
            os.link(src, tmp, dst_dir_fd=folder.fd)
        except OSError:
            return False
        try:
            folder.replace(tmp, target.name)
        finally:
            folder.unlink(tmp)
    return True


def _delete(repo: Path, path: str, folder: bool) -> None:
    target = repo / path
    with SafeDir.of(target, repo, create=False) as parent:  # refuses a symlinked folder on the way
        st = parent.lstat(target.name)
        if st is None or stat.S_ISLNK(st.st_mode):
            raise HubError(400, f"{path}: a symlink on the mirror; the mirror never deletes through a symlink")
        if folder:
            shutil.rmtree(target.name, dir_fd=parent.fd)
        else:
            os.unlink(target.name, dir_fd=parent.fd)
    parent = target.parent
    while parent != repo and not any(parent.iterdir()):  # the Hub has no empty folders
        parent.rmdir()
        parent = parent.parent
