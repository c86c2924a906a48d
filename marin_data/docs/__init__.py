"""Documentation generated from the data: datasheet, dataset card, Croissant and figures.

One module per output, each a pure function of the corpus, its statistics and the curated metadata:

- `questions`: the datasheet's questions (ids + text, defined once) and the metadata file that answers them;
- `stats`: per-subset totals (from the manifest) and document-length percentiles (streamed from shards);
- `cachestats`: the same statistics of a Levanter cache or store (lengths from its offsets), and its cells;
- `datasheet`: the Markdown datasheet in the seven sections of *Datasheets for Datasets* (Gebru et al.);
- `card`: the Hugging Face dataset card (``README.md``);
- `croissant`: MLCommons Croissant 1.1 JSON-LD (``croissant.json``);
- `figures`: PNG figures with byte-identical output for identical input;
- `distribution`: mirrors, download and verification commands;
- `markdown`: tables, exact numbers and answers, shared by the datasheet and the card;
- `cachesheet`: the datasheet's parts that differ for a Levanter cache or store.

`marin_data.docs.write.write_datasheet` composes them and decides where the files go.
"""
