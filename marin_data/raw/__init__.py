"""The inputs of a corpus: documents read from jsonl/.gz/.zst/parquet files (`documents`, through the readers
`jsonl` and `parquet`; `records`: a document, or a bad record and its reason), and the tokenizer that encodes
them the way every shard frames them (`tokenizer`)."""
