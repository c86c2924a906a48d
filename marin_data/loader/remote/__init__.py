"""The loader over a corpus that stays in its store: `stream` opens it and serves batches as the local loader
does, fetching shards ahead of need into `cache`, a bounded on-disk shard cache shared by the processes of a
node."""
