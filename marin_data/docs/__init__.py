"""Documentation generated from the data: datasheet, dataset card, Croissant and figures, whatever the format.

One module per output, each a pure function of the corpus, its statistics and the curated metadata:

- `questions`: the datasheet's questions (ids + text, defined once) and the metadata file that answers them;
- `stats`: per-subset totals (from the manifest) and document-length percentiles (streamed from shards);
- `datasheet`: the Markdown datasheet in the seven sections of *Datasheets for Datasets* (Gebru et al.),
  around what each format says in its own words (`SheetParts`);
- `card`: the Hugging Face dataset card (``README.md``);
- `croissant`: MLCommons Croissant 1.1 JSON-LD (``croissant.json``);
- `figures`: PNG figures with byte-identical output for identical input;
- `distribution`: mirrors, download and verification commands;
- `markdown`: tables, exact numbers and answers, shared by the datasheet and the card;
- `write`: where the files go (into a corpus, its manifest re-committed, or under ``--out``).

Each format composes them (`marin_data.formats.marin.datasheet`, `marin_data.levanter.datasheet`, whose
cache statistics and datasheet parts are `marin_data.levanter.cachestats` and `marin_data.levanter.cachesheet`);
`marin_data.formats.datasheet.write_datasheet` opens a source through its format and writes its documentation.
"""
