"""A corpus on local disk: its description (`manifest`), its shard files (`shard`), building it from raw
inputs (`build`, `sample`), checking it (`verify`), summarizing it (`info`), the record a partial
download leaves in it (`record`), and where it was published (`mirrors`)."""
