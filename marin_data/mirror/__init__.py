"""``marin-data serve``: a Hugging Face Hub-compatible mirror of the corpora under a folder.

Each ``ROOT/org/name`` folder (a marin corpus or any folder) is served as the dataset repo ``org/name`` so
that unmodified ``huggingface_hub`` clients — ``snapshot_download``, ``hf_hub_download``,
``HfApi.list_repo_tree``, ``HfFileSystem``, ``datasets`` — work against it with ``HF_ENDPOINT`` (or
``endpoint=``) pointing at it; started writable with a token it also accepts ``HfApi`` uploads.

Modules: `repo` (what is served: snapshots, content ids, the commit id), `http` (errors in the Hub's shape,
safe path parsing), `app` (the read API), `upload` (the write API), `server` (running it).

Why werkzeug and cheroot: werkzeug parses requests, forms, ``Range`` headers and builds responses the way a
mature WSGI toolkit does (no hand-written header parsing), and cheroot — CherryPy's production WSGI server,
pure Python, two small dependencies — serves it from a thread pool with keep-alive connections parked in a
selector, streams request bodies (a multi-GB LFS upload never sits in memory or in a spool file, unlike
waitress) and response bodies. Both install from PyPI without compilers. An asyncio stack
(aiohttp, starlette + uvicorn) would buy nothing here: the work is file reads and hashing, which threads do
well because hashlib and file I/O release the GIL.
"""

from marin_data.mirror.app import MirrorApp
from marin_data.mirror.server import RunningMirror, serve, start_mirror

__all__ = ["MirrorApp", "RunningMirror", "serve", "start_mirror"]
