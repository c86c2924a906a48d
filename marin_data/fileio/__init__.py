"""Bytes in and out, safely: the helpers every stage of the data path shares.

- `atomic`: files written to a temporary name, fsynced and renamed, so a crash never leaves wrong bytes
  under a final name; streaming hashes; `SafeDir`, which follows no link below a root.
- `lock`: the corpus write lock (one writer per corpus directory).
- `parquet_io`: every Parquet read (`open_parquet`), decoded on the calling thread where Python owns the bytes.
- `untrusted_json`: every JSON parse (`loads`), refusing nesting deep enough to exhaust the stack.
- `untrusted_paths`: every path a description names (`safe_relpath`), kept a clean relative path.
- `arrays`: Arrow arrays on numpy buffers and back, without pyarrow importing pandas.
"""
