"""A corpus published to Hugging Face dataset repos, as a store: ``hf://datasets/org/name[@revision]``.

Works against the Hub and any Hub-compatible endpoint (``marin-data serve``, an institution's mirror), with
the same resumable, verifying download machinery as S3 (`marin_data.transfer.download`), so HF and S3 copies are
fallbacks of each other.

- ``list`` / ``head`` come from the tree API (``GET /api/datasets/{repo}/tree/{commit}?recursive=true``,
  following ``Link: rel="next"``), read once per store: an LFS file's entry carries its sha256 (the content
  hash the Hub checked on upload) and size, a regular file's its git blob SHA-1 (`ObjectInfo.git_sha1`).
  No data is downloaded to answer them, which is what ``verify --remote`` needs.
- ``read`` is one ``GET /datasets/{repo}/resolve/{commit}/{path}`` with ``Range: bytes=N-`` to resume
  (the Hub may redirect to its CDN; credentials are dropped on a redirect to another host).
- Each repo's revision is resolved to its commit id once, on first use, and every later request names that
  commit: a download reads one consistent version even if the repo is updated meanwhile. ``@revision``
  names the main repo's; part repos are read at their ``main``. `HfStore.reopen_url` names that commit, so
  the jobs of a run (an adopt's, a deep verify's, a convert's, on threads or Ray) read the version it listed.
- A corpus split across repos (`marin_data.transfer.publish_hf`: ``org/name``, ``org/name-part2``...) is one store:
  the part repos are those the main repo's manifest assigns subsets to (``repos``, n > 1 is ``org/name-partN``),
  and each path is read from the repo whose listing holds it.

Requests go through one ``httpx2`` client (huggingface_hub's HTTP library) with no retries of its own:
failures come out typed (`marin_data.retry.status_error`) and `marin_data.retry.retry_call` retries them.
"""

from __future__ import annotations

import contextlib
import copy
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from marin_data.errors import RemoteError, RemoteLimitError, RetryableRemoteError, shown
from marin_data.layout import MANIFEST
from marin_data.retry import parse_retry_after, status_error
from marin_data.stores.base import METADATA_LIMIT, ObjectInfo, ReadStream, Store, body_span, collect, range_header
from marin_data.stores.http import http_client, mapped_errors
from marin_data.stores.hub_ids import parse_hf_url
from marin_data.stores.limits import PAGE_MAX_BYTES, ListingBudget, RequestClock
from marin_data.fileio.untrusted_json import loads

__all__ = ["HfStore"]

_REVISION_LIMIT = 1 << 20  # a revision lookup answers a commit id and a few fields


class HfStore(Store):
    """The repo (and part repos) of ``hf://datasets/org/name[@revision]``.

    Args:
        url: ``hf://datasets/org/name``, optionally ``@revision`` (a branch, tag or commit of the main repo).
        endpoint: the Hub endpoint; default ``HF_ENDPOINT``, else huggingface.co.
        token: a Hugging Face token; default the one huggingface_hub finds (``HF_TOKEN``, ``hf auth login``).
        max_connections: size of the connection pool (one per parallel read).
    """

    OPTIONS = ("endpoint", "token")  # the `open_store` options that are this store's

    def __init__(self, url: str, *, endpoint: str | None = None, token: str | None = None,
                 max_connections: int = 16):
        from huggingface_hub import constants, get_token

        try:
            self.hf = parse_hf_url(url)
        except ValueError as e:
            raise RemoteError(str(e), path=url) from e
        self.url = f"hf://datasets/{self.hf.repo_id}"
        self.endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
        token = token or get_token()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = http_client(max_connections)
        self._lock = threading.Lock()
        self._list_lock = threading.Lock()  # one listing at a time: concurrent first reads wait for it
        self._commits: dict[str, str] = {}
        self._index: dict[str, tuple[str, ObjectInfo]] | None = None  # path -> (repo, info)
        self._index_error: RemoteLimitError | None = None  # a listing past its bound is not walked again

    # --- Store -------------------------------------------------------------------------------------------
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        top = prefix.strip("/")
        for path, (_, info) in sorted(self._listing().items()):
            if not top or path == top or path.startswith(top + "/"):
                yield info

    def head(self, path: str) -> ObjectInfo | None:
        hit = self._listing().get(path)
        return None if hit is None else hit[1]

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        where = self.describe(path)
        with _looking_up(where):
            repo = self.hf.repo_id if path == MANIFEST else self._repo_of(path)
            commit = self._commit(repo)
        url = f"{self.endpoint}/datasets/{repo}/resolve/{commit}/{quote(path)}"
        wanted = range_header(start, end)
        headers = {**self._headers, "Accept-Encoding": "identity", **({"Range": wanted} if wanted else {})}
        return self._get(url, where, start, end, headers)[0]

    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        raise RemoteError("a Hugging Face repo is written in commits: publish with `marin-data publish "
                          "--to hf://datasets/org/name` (marin_data.transfer.publish_hf)", path=self.describe(path))

    def reopen_url(self) -> str:
        """``hf://datasets/org/name@<commit>``: the commit this store reads (its revision resolved now if not
        yet), so that a job opening it in another thread or process reads this version, not a branch that
        may have moved since. Part repos are read at their ``main``, as here."""
        return f"{self.url}@{self._commit(self.hf.repo_id)}"

    def mirror_record(self) -> dict:
        return {"url": self.url, **({"endpoint": self.endpoint} if self.endpoint != _default_endpoint() else {})}

    def describe(self, path: str) -> str:
        return f"{self.url}/{path}"

    # --- internals ---------------------------------------------------------------------------------------
    def _get(self, url: str, where: str, start: int = 0, end: int | None = None,
             headers: dict | None = None):
        """One GET as a stream of its body (and the response, for its headers), on a fresh `RequestClock`;
        any non-2xx answer or transport failure raises the typed error."""
        clock = RequestClock(where)
        with clock.running(), mapped_errors(where):
            request = self._client.build_request("GET", url, headers=headers or self._headers)
            response = self._client.send(request, stream=True)
        if response.status_code >= 300:
            response.close()  # its body unread: an error answer is only its status and headers
            message = response.headers.get("X-Error-Message") or f"HTTP {response.status_code}"
            if response.headers.get("X-Error-Code"):
                message = f"{response.headers['X-Error-Code']}: {message}"
            raise status_error(message, status=response.status_code, path=where,
                               retry_after=parse_retry_after(response.headers.get("Retry-After")))
        begin, stop = body_span(response.status_code, response.headers.get("Content-Range"), start, end, where,
                                response.close)

        def pieces() -> Iterator[bytes]:
            with mapped_errors(where):
                yield from response.iter_bytes()  # as they arrive: the clock is checked at each

        return ReadStream(pieces(), start=begin, stop=stop, close=response.close, clock=clock), response

    def _json(self, url: str, where: str, limit: int = METADATA_LIMIT):
        """The JSON answer at ``url``, its size and its ``Link`` header's links; refused past ``limit`` bytes
        as they arrive (`RemoteLimitError`)."""
        stream, response = self._get(url, where)
        body = collect(stream, limit=limit, where=where)
        try:
            return loads(body), len(body), response.links
        except ValueError as e:  # too deep a nesting is a ValueError too (`marin_data.fileio.untrusted_json`)
            raise RetryableRemoteError(f"not JSON from {url}: {shown(e)}", path=where) from e

    def _commit(self, repo: str) -> str:
        """The commit id the repo's revision names, resolved once (every read then names that commit)."""
        with self._lock:
            if repo in self._commits:
                return self._commits[repo]
        rev = (self.hf.revision or "main") if repo == self.hf.repo_id else "main"
        info, _, _ = self._json(f"{self.endpoint}/api/datasets/{repo}/revision/{quote(rev, safe='')}",
                                f"hf://datasets/{repo}@{rev}", limit=_REVISION_LIMIT)
        sha = info.get("sha") if isinstance(info, dict) else None
        if not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{40}", sha)):
            raise RemoteError("the endpoint gave no commit id for the revision: not a Hub-compatible endpoint?",
                              path=f"hf://datasets/{repo}@{rev}")
        with self._lock:
            return self._commits.setdefault(repo, sha)

    def _repos(self) -> list[str]:
        """The main repo, then the part repos its manifest assigns subsets to (``repos``: n > 1 is -partN)."""
        parts: list[str] = []
        try:
            data = self.read_bytes(MANIFEST, limit=METADATA_LIMIT)  # bounded before it is buffered
            if data:
                doc = loads(data)
                repos = doc.get("repos", {}) if isinstance(doc, dict) else {}
                numbers = {n for n in repos.values() if isinstance(n, int)} if isinstance(repos, dict) else set()
                parts = [f"{self.hf.repo_id}-part{n}" for n in sorted(numbers) if 1 < n <= len(repos)]
        except RemoteError as e:
            if e.status != 404:
                raise
        except ValueError:
            pass  # no usable manifest: the repo alone (a malformed one is reported by whoever reads it)
        return [self.hf.repo_id, *parts]

    def _listing(self) -> dict[str, tuple[str, ObjectInfo]]:
        """``path -> (repo, info)`` over every repo of the corpus, listed once."""
        with self._list_lock:
            if self._index_error is not None:
                raise self._index_error
            if self._index is None:
                index: dict[str, tuple[str, ObjectInfo]] = {}
                budget = ListingBudget(self.url)  # every page of every repo of the corpus counts
                try:
                    for i, repo in enumerate(self._repos()):
                        for path, info in self._list_repo(repo, budget):
                            if i == 0 or path != "README.md":  # a part repo's own card is not a corpus file
                                index.setdefault(path, (repo, info))
                except RemoteLimitError as e:
                    self._index_error = e
                    raise
                self._index = index
            return self._index

    def _list_repo(self, repo: str, budget: ListingBudget) -> Iterator[tuple[str, ObjectInfo]]:
        url: str | None = f"{self.endpoint}/api/datasets/{repo}/tree/{self._commit(repo)}?recursive=true&expand=false"
        where = f"hf://datasets/{repo}"
        while url is not None:
            try:
                items, size, links = self._json(url, where, limit=min(PAGE_MAX_BYTES, budget.bytes_left()))
            except RemoteLimitError as e:
                raise budget.exceeded(f"a page of more than {min(PAGE_MAX_BYTES, budget.bytes_left()):,} bytes "
                                      "left for it") from e
            if not isinstance(items, list):
                raise RemoteError("malformed tree listing", path=where)
            budget.take(entries=len(items), nbytes=size, page=True)
            for e in items:
                if isinstance(e, dict) and e.get("type") == "file":
                    lfs = e.get("lfs") or {}
                    if not (isinstance(e.get("path"), str) and type(e.get("size")) is int and e["size"] >= 0
                            and isinstance(lfs, dict)):
                        raise RemoteError(f"malformed tree listing entry {str(e)[:200]}", path=where)
                    yield e["path"], ObjectInfo(e["path"], e["size"], sha256=lfs.get("oid"),
                                                sha256_source="lfs" if lfs else None,
                                                git_sha1=None if lfs else e.get("oid"))
            url = self._next_page(links, where)

    def _next_page(self, links: dict, where: str) -> str | None:
        """The ``Link: rel="next"`` URL, followed only on the endpoint's own origin: the request carries the
        token, which another host must not get."""
        url = links.get("next", {}).get("url")
        if url is None:
            return None
        if not isinstance(url, str) or _origin(url) != _origin(self.endpoint):
            raise RemoteError(f"the tree listing's next page {str(url)[:200]!r} is not on {self.endpoint}: not "
                              "followed", path=where)
        return url

    def _repo_of(self, path: str) -> str:
        hit = self._listing().get(path)
        return self.hf.repo_id if hit is None else hit[0]


@contextlib.contextmanager
def _looking_up(where: str) -> Iterator[None]:
    """Errors of the requests a read makes first (the manifest and listing that say which repo holds the file,
    the revision's commit) name the file read, ``where``, with the request that failed in the message."""
    try:
        yield
    except RemoteError as e:
        if e.path == where:
            raise
        named = copy.copy(e)
        named.path, named.message = where, f"{e.message} (while reading {e.path} to locate it)"
        named.args = (named.message,)
        raise named from e


def _default_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def _origin(url: str) -> tuple[str, str, int | None]:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:  # a malformed port or host
        return ("", "", None)
