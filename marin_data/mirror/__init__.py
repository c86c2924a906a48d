"""``marin-data serve``: a Hugging Face Hub-compatible mirror of the corpora under a folder.

Each ``ROOT/org/name`` folder (a marin corpus or any folder) is served as the dataset repo ``org/name`` so
that unmodified ``huggingface_hub`` clients — ``snapshot_download``, ``hf_hub_download``,
``HfApi.list_repo_tree``, ``HfFileSystem``, ``datasets`` — work against it with ``HF_ENDPOINT`` (or
``endpoint=``) pointing at it; started writable with a token it also accepts ``HfApi`` uploads.

Modules: `repo` (what is served: snapshots, content ids, the commit id), `http` (errors in the Hub's shape,
safe path parsing, bounded bodies), `app` (the read API), `upload` (the write API), `front` (the HTTP
server: limits, idle and slow clients), `request_body` (a request body as the front reads it), `server`
(running it).

Why werkzeug behind an asyncio front: werkzeug parses requests, forms and ``Range`` headers and builds
responses the way a mature WSGI toolkit does, while the work is file reads and hashing, which threads do well
(hashlib and file I/O release the GIL). A server that gives each connection a thread (cheroot, with its
fixed pool of 16) is stopped by 16 clients that connect and send nothing; here one event loop reads every
request head, bounded in size and time, and only complete requests reach the bounded pool of worker
threads. The limits, as numbers, are in docs/security.md ("The mirror").
"""

from marin_data.mirror.app import MirrorApp
from marin_data.mirror.server import RunningMirror, serve, start_mirror

__all__ = ["MirrorApp", "RunningMirror", "serve", "start_mirror"]
