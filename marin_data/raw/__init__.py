"""The inputs of a corpus: documents read from jsonl/.gz/.zst/parquet files (`documents`), and the tokenizer
that encodes them the way every shard frames them (`tokenizer`)."""
