"""The datasheet's questions, defined once, and the metadata file that answers them.

Numbers are computed from the corpus; everything a machine cannot know (why the corpus exists, where the
text came from, what it must not be used for, who maintains it) is a *question* with an id, answered in a
YAML metadata file keyed by those ids::

    pretty_name: Marin sample corpus          # optional; defaults to the manifest's name
    motivation:
      purpose: Exercise the toolkit end to end without a network.
    uses:
      out_of_scope:
        - Training a model meant for use.     # a list renders as bullet points
    subsets:
      stdlib/code:
        description: Python source files of the standard library.
        sources: [https://github.com/python/cpython/tree/v3.11.7/Lib]

An unanswered question is never filled in: the outputs say **Not answered.** with its id, and
``--strict`` refuses to write anything while any remains (`DatasheetIncompleteError`, whose message shows
the YAML keys still missing). Unknown keys are an error, so a typo (``motivaton``) cannot silently leave a
question unanswered. `meta_template` writes a file to start from: every question, its key and its kind,
commented, with the corpus's subsets filled in (``marin-data datasheet CORPUS --meta-template``).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from marin_data.errors import DatasheetIncompleteError, InvalidMetadataError
from marin_data.ui import plural

__all__ = ["SECTIONS", "Question", "QUESTIONS", "SUBSET_QUESTIONS", "KINDS", "Metadata", "parse_metadata",
           "load_metadata", "not_answered", "require_complete", "meta_template"]

# The seven sections of Datasheets for Datasets (Gebru et al., 2021), in order: (key, title).
SECTIONS = (
    ("motivation", "Motivation"),
    ("composition", "Composition"),
    ("collection", "Collection process"),
    ("preprocessing", "Preprocessing, cleaning and labeling"),
    ("uses", "Uses"),
    ("distribution", "Distribution"),
    ("maintenance", "Maintenance"),
)


@dataclass(frozen=True)
class Question:
    id: str  # "<section>.<key>": the YAML path of its answer
    text: str
    kind: str = "text"  # "text" (a string or a list of strings), "url", or "date" (YYYY-MM-DD)

    @property
    def section(self) -> str:
        return self.id.split(".", 1)[0]

    def for_subset(self, subset: str) -> Question:
        """A per-subset question (``subsets.*.sources``) made concrete: ``subsets.web/en.sources``."""
        return Question(f"subsets.{subset}.{self.leaf}", self.text, self.kind)

    @property
    def leaf(self) -> str:
        """The answer's key inside its YAML block (``purpose``, ``sources``)."""
        return self.id.rsplit(".", 1)[1]


QUESTIONS: tuple[Question, ...] = (
    Question("motivation.summary", "What is this dataset, in one paragraph?"),
    Question("motivation.purpose", "For what purpose was the dataset created? Was there a specific gap to fill?"),
    Question("motivation.creators", "Who created the dataset, and on behalf of which entity?"),
    Question("motivation.funding", "Who funded the creation of the dataset?"),
    Question("composition.instances", "What do the instances (documents) represent?"),
    Question("composition.sampling", "Is it a sample of a larger set? If so, how was the sample chosen?"),
    Question("composition.personal_data", "Does it contain data that identifies people, or that is confidential "
             "or sensitive? How was it handled?"),
    Question("composition.offensive_content", "Does it contain data that might be offensive, insulting or "
             "threatening?"),
    Question("composition.redundancy", "Are there errors, sources of noise, or redundancies (beyond the exact "
             "duplicates counted above)?"),
    Question("collection.process", "How was the data acquired (crawls, dumps, APIs, licensed sources)?"),
    Question("collection.timeframe", "Over what timeframe was the data collected, and when was it created?"),
    Question("collection.consent", "Were the people whose data is included notified, and did they consent? "
             "Was there an ethical review?"),
    Question("preprocessing.cleaning", "What cleaning, filtering and deduplication was done before tokenization?"),
    Question("preprocessing.raw_data", "Is the raw (pre-tokenization) data kept, and where?"),
    Question("uses.intended", "What tasks is the dataset intended for?"),
    Question("uses.out_of_scope", "What should the dataset not be used for?"),
    Question("uses.risks", "Is there anything about its composition or collection that could harm people or "
             "bias models trained on it?"),
    Question("distribution.homepage", "Where is the dataset's home page?", kind="url"),
    Question("distribution.date_published", "When was this version first published (YYYY-MM-DD)?", kind="date"),
    Question("distribution.terms", "Are there terms of use beyond the licenses of the subsets?"),
    Question("distribution.citation", "How should the dataset be cited (BibTeX or a sentence)?"),
    Question("maintenance.maintainers", "Who maintains the dataset, and how can they be contacted?"),
    Question("maintenance.updates", "Will the dataset be updated (errors fixed, data removed on request)? How "
             "will users learn of it?"),
    Question("maintenance.errata", "Is there an erratum (known errors in this version)?"),
)

# Asked once per subset; ids are "subsets.<subset name>.<key>".
SUBSET_QUESTIONS: tuple[Question, ...] = (
    Question("subsets.*.description", "What is in this subset?"),
    Question("subsets.*.sources", "Where does it come from (source URLs)?"),
)

# What each kind of answer takes, as the template says it.
KINDS = {"text": "text, or a list of texts", "url": "one http(s) URL", "date": "a date, YYYY-MM-DD"}
_TOP_LEVEL = {"pretty_name", "subsets", *(s for s, _ in SECTIONS)}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def not_answered(qid: str) -> str:
    """How an unanswered question appears in Markdown: visibly, with the id to answer it under."""
    return f"**Not answered.** (question id `{qid}`)"


@dataclass(frozen=True)
class Metadata:
    """Curated answers, keyed by question id (``"uses.intended"``, ``"subsets.web/en.sources"``)."""

    answers: dict[str, str | tuple[str, ...]] = field(default_factory=dict)
    pretty_name: str | None = None
    source: str | None = None  # the file it came from, shown in the datasheet
    licenses: dict[str, str] = field(default_factory=dict)  # subset -> SPDX id (`adopt --meta` only)

    def answer(self, qid: str) -> str | tuple[str, ...] | None:
        return self.answers.get(qid)

    def unanswered(self, subsets: Iterable[str]) -> list[str]:
        """Ids of the questions without an answer, in datasheet order."""
        ids = [q.id for q in QUESTIONS]
        ids += [q.for_subset(s).id for s in sorted(subsets) for q in SUBSET_QUESTIONS]
        return [i for i in ids if i not in self.answers]


def _answer(value: object, question: Question, where: str) -> str | tuple[str, ...] | None:
    """Validate one answer; ``None``/empty means unanswered (the YAML may keep the key as a reminder)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, (int, float, datetime.date)) and not isinstance(value, bool):
        value = str(value)  # YAML reads 2024-05-01 as a date and 2024 as an int
    if isinstance(value, str):
        value = value.strip()
    elif isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value):
        value = tuple(v.strip() for v in value)
    else:
        raise InvalidMetadataError(f"{question.id}: expected text or a list of text, got {value!r}", path=where)
    if question.kind == "url" and not (isinstance(value, str) and re.match(r"^https?://\S+$", value)):
        raise InvalidMetadataError(f"{question.id}: expected one http(s) URL, got {value!r}", path=where)
    if question.kind == "date" and not (isinstance(value, str) and _DATE.match(value)):
        raise InvalidMetadataError(f"{question.id}: expected a date YYYY-MM-DD, got {value!r}", path=where)
    return value


def _mapping(value: object, what: str, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidMetadataError(f"{what} must be a mapping, got {type(value).__name__}", path=where)
    return value


def _unknown(keys: Iterable[object], known: Iterable[str], what: str, where: str) -> None:
    bad = sorted(str(k) for k in keys if k not in set(known))
    if bad:
        raise InvalidMetadataError(f"unknown key(s) {', '.join(bad)} in {what}; known: {', '.join(sorted(known))}",
                                   path=where, actual=bad)


def parse_metadata(doc: object, *, subsets: Iterable[str], where: str = "metadata",
                   licenses: bool = False) -> Metadata:
    """Validate a parsed metadata document against the question list and the corpus's subsets; with
    ``licenses``, a subset's block may also give its ``license`` (an SPDX id: `adopt` records it)."""
    doc = _mapping(doc, "the metadata file", where)
    _unknown(doc, _TOP_LEVEL, "the metadata file", where)
    by_section: dict[str, list[Question]] = {}
    for q in QUESTIONS:
        by_section.setdefault(q.section, []).append(q)
    answers: dict[str, str | tuple[str, ...]] = {}
    spdx: dict[str, str] = {}
    for section, questions in by_section.items():
        block = _mapping(doc.get(section), section, where)
        _unknown(block, [q.leaf for q in questions], section, where)
        for q in questions:
            if (a := _answer(block.get(q.leaf), q, where)) is not None:
                answers[q.id] = a
    known_subsets = set(subsets)
    per_subset = _mapping(doc.get("subsets"), "subsets", where)
    _unknown(per_subset, known_subsets, "subsets (not a subset of this corpus)", where)
    for name, block in per_subset.items():
        block = _mapping(block, f"subsets.{name}", where)
        _unknown(block, [q.leaf for q in SUBSET_QUESTIONS] + (["license"] if licenses else []), f"subsets.{name}",
                 where)
        if block.get("license") is not None:
            if not (isinstance(block["license"], str) and block["license"].strip()):
                raise InvalidMetadataError(f"subsets.{name}.license: expected an SPDX id, got {block['license']!r}",
                                           path=where)
            spdx[name] = block["license"].strip()
        for q in SUBSET_QUESTIONS:
            if (a := _answer(block.get(q.leaf), q.for_subset(name), where)) is not None:
                answers[q.for_subset(name).id] = a
    pretty = doc.get("pretty_name")
    if pretty is not None and not (isinstance(pretty, str) and pretty.strip()):
        raise InvalidMetadataError(f"pretty_name must be text, got {pretty!r}", path=where)
    return Metadata(answers=answers, pretty_name=pretty.strip() if pretty else None, source=where, licenses=spdx)


def load_metadata(path: str | os.PathLike | None, *, subsets: Iterable[str], licenses: bool = False) -> Metadata:
    """Read and validate a metadata YAML file (``licenses``: as `parse_metadata`); no file means every
    question is unanswered.

    Raises:
        InvalidMetadataError: unreadable or malformed YAML, unknown keys, answers of the wrong kind, or a
            subset the corpus does not have.
    """
    if path is None:
        return Metadata()
    import yaml

    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise InvalidMetadataError(f"cannot read the metadata file: {e}", path=str(path)) from e
    return parse_metadata(doc, subsets=subsets, where=path.name, licenses=licenses)


def require_complete(meta: Metadata, subsets: Iterable[str]) -> None:
    """Raise `DatasheetIncompleteError` listing every unanswered question (``--strict``)."""
    missing = meta.unanswered(subsets)
    if missing:
        raise DatasheetIncompleteError(
            f"{plural(len(missing), 'datasheet question')} unanswered; the metadata file needs these keys:\n"
            + textwrap.indent(_skeleton(sorted(subsets), set(missing), questions=False), "    "),
            path=meta.source, missing=missing,
        )


def meta_template(subsets: Iterable[str], *, corpus: str = "CORPUS") -> str:
    """A metadata file to fill in: every question as a commented YAML key (its id, kind and text), the
    per-subset questions under each of ``subsets``. Filled in, it answers every question ``--strict`` asks."""
    kinds = "; ".join(f"{k}: {v}" for k, v in KINDS.items())
    head = [
        f"# The datasheet's answers for {corpus}: marin-data datasheet {corpus} --meta THIS_FILE [--strict]",
        "#",
        "# Each key answers the question in the comment above it, which gives its id and the kind of answer",
        f"# it takes ({kinds}).",
        "# A key left empty is printed as \"Not answered.\" with its id, and --strict refuses while any is.",
        "# Numbers never go here: the datasheet computes them from the corpus.",
        "",
        "# The name the card and datasheet show (optional; default: the manifest's name).",
        "pretty_name:",
    ]
    return "\n".join([*head, _skeleton(sorted(subsets), None, questions=True)]) + "\n"


def _skeleton(subsets: list[str], only: set[str] | None, *, questions: bool) -> str:
    """The YAML keys of the questions in ``only`` (None: all), in datasheet order, each empty; with
    ``questions`` a comment above each gives its id, kind and text, otherwise a trailing one its kind.
    Subset names are JSON-quoted (valid YAML), so a name such as ``2024`` or ``yes`` stays a string."""
    lines: list[str] = []

    def key(q: Question, indent: str) -> None:
        if questions:
            lines.extend([f"{indent}# {q.id} ({q.kind}): {q.text}", f"{indent}{q.leaf}:"])
        else:
            lines.append(f"{indent}{q.leaf}:  # {q.kind}")

    for section, title in SECTIONS:
        asked = [q for q in QUESTIONS if q.section == section and (only is None or q.id in only)]
        if asked:
            lines += ["", f"{section}:  # {title}"] if questions else [f"{section}:"]
            for q in asked:
                key(q, "  ")
    per_subset = [(s, [q.for_subset(s) for q in SUBSET_QUESTIONS if only is None or q.for_subset(s).id in only])
                  for s in subsets]
    if any(asked for _, asked in per_subset):
        lines += ["", "subsets:  # one block per subset of the corpus"] if questions else ["subsets:"]
        for s, asked in per_subset:
            if asked:
                lines.append(f"  {json.dumps(s)}:")
                for q in asked:
                    key(q, "    ")
    return "\n".join(lines)
