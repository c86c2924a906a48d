"""Helpers for the tests, the benchmarks and ``scripts/quickstart.py``; never imported by the library.

- `loopback`: a free port on 127.0.0.1 and a stop that always reaps a child server;
- `local_s3`: a throwaway S3 server (moto) in its own process;
- `mirror`: the Hub mirror started in this process or as its own;
- `simulate`: an index-only corpus of production scale (no data files) for scale tests and benchmarks;
- `demo`: ``python -m marin_data.testing.demo CORPUS``, the loader walk-through the quickstart runs.
"""
