"""The format names a manifest may carry (`marin_data.corpus.manifest.FORMATS`, which the corpus stage lists
because it comes before the formats it names) are the registry's."""

from marin_data.corpus.manifest import FORMATS
from marin_data.formats import formats


def test_the_manifest_accepts_exactly_the_registered_format_names():
    assert sorted(FORMATS) == sorted(f.name for f in formats())
