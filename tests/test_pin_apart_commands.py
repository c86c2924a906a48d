"""A pin kept apart from its data works where a pin works: ``info``, ``show``, ``datasheet``, a ``serve``d folder
holding it, the loader (``make_loader``, ``marin-train --data``), ``trace --store`` read the pin from where it
is and the cells from where the data lives; ``publish`` refuses it, saying how to move the pin; a download of
one is a corpus holding its shards (``verify`` checks it as a folder). One bucket (moto on loopback) holds a
Levanter store, pinned once to a local folder and once to another prefix, for every test here."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from loader_checks import take
from s3_env import moto  # noqa: F401 - fixture
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401 - a fixture
from test_levanter_adopt_remote import CELLS, store, upload  # noqa: F401 - a fixture

from marin_data.cli import cli
from marin_data.errors import NotApplicableError
from marin_data.formats import open_source
from marin_data.levanter.adopt import adopt
from marin_data.levanter.adopt_remote import adopt_store
from marin_data.levanter.order.trace import open_trace
from marin_data.loader import LoaderConfig, TokenStream, make_loader
from marin_data.testing.local_s3 import create_bucket
from marin_data.testing.mirror import running_mirror

CELL = "cluster=1/quality=4"


@pytest.fixture(scope="module")
def apart(store, tiny_tokenizer, moto, tmp_path_factory):  # noqa: F811
    """(data URL, local pin, s3:// pin, the store adopted in place, the moto endpoint)."""
    root = tmp_path_factory.mktemp("apart")
    name = f"t-{uuid.uuid4().hex[:12]}"
    create_bucket(moto, name)
    data = f"s3://{name}/corpus"
    upload(store, moto, data)
    adopt_store(data, tokenizer=str(tiny_tokenizer), pin_to=str(root / "pin"), endpoint_url=moto)
    adopt_store(data, tokenizer=str(tiny_tokenizer), pin_to=f"s3://{name}/pin", endpoint_url=moto,
                work_dir=root / "work")
    shutil.copytree(store, root / "in-place")
    adopt(root / "in-place", tokenizer=str(tiny_tokenizer))
    return data, root / "pin", f"s3://{name}/pin", root / "in-place", moto


def _cli(*args: str):
    return CliRunner().invoke(cli, list(map(str, args)))


def test_info_of_a_pin_kept_apart_takes_the_store_options_of_its_data(apart):
    data, pin, remote, in_place, moto = apart  # noqa: F811
    want = open_source(in_place).info().to_json()["subsets"]
    for where in (pin, remote):
        assert open_source(where, endpoint_url=moto).info().to_json()["subsets"] == want
        shown = _cli("info", where, "--endpoint-url", moto)
        assert shown.exit_code == 0 and CELL in shown.output, shown.output
    assert _cli("info", in_place, "--endpoint-url", moto).exit_code == 2  # nothing there for them to open


def test_show_reads_the_cells_where_the_data_lives(apart):
    data, pin, remote, in_place, moto = apart  # noqa: F811
    want = open_source(in_place).show(subset=CELL, n=3)
    for where in (pin, remote):
        assert open_source(where, endpoint_url=moto).show(subset=CELL, n=3) == want
    shown = _cli("show", pin, "--subset", CELL, "-n", "1", "--endpoint-url", moto)
    assert shown.exit_code == 0 and "==" in shown.output, shown.output


def test_the_datasheet_of_a_local_pin_kept_apart_reads_its_cells_from_the_data(apart, tmp_path):
    data, pin, remote, in_place, moto = apart  # noqa: F811
    copy = shutil.copytree(pin, tmp_path / "pin")  # written into: the fixture's pin stays as adopt left it
    done = _cli("datasheet", copy, "--endpoint-url", moto)
    assert done.exit_code == 0, done.output
    assert open_source(copy).manifest.data == data  # the re-committed manifest still names its data
    sheet = (copy / "datasheets/datasheet.md").read_text()
    assert CELL in sheet
    assert not any(p.startswith("cluster=") for p in tree_bytes(copy))  # nothing fetched into the pin


def test_a_served_folder_holding_a_pin_downloads_the_data_from_the_bucket(apart, tmp_path):
    data, pin, remote, in_place, moto = apart  # noqa: F811
    from marin_data.transfer.download import download

    shutil.copytree(pin, tmp_path / "mirror/team/pin")
    with running_mirror(tmp_path / "mirror") as mirror:
        got = download("hf://datasets/team/pin", subsets=[CELL], dest=tmp_path / "d", progress=False,
                       endpoint=mirror.url, endpoint_url=moto)
    assert got.ok
    cell = {k: v for k, v in tree_bytes(tmp_path / "d").items() if k.startswith("cluster=")}
    assert cell == {k: v for k, v in tree_bytes(in_place).items() if k.startswith(CELL + "/")}
    assert open_source(tmp_path / "d").verify().ok  # a download of a pin kept apart holds its shards


def test_the_loader_streams_a_pin_kept_apart_from_where_its_data_lives(apart, tmp_path):
    data, pin, remote, in_place, moto = apart  # noqa: F811
    config = LoaderConfig(seq_len=16, batch_size=4, shuffle_window=1, val_fraction=0.02)
    local = TokenStream(in_place, config, cache_dir=tmp_path / "local")
    for n, where in enumerate((pin, remote)):
        loader = make_loader(str(where), config, cache_dir=tmp_path / f"c{n}", endpoint_url=moto)
        assert loader.dataset.stream.fingerprint == local.fingerprint
        batches = take(loader, 6)
        loader.dataset.stream.close()
        for batch in batches:
            assert np.array_equal(batch["input_ids"], local.read(batch["index"]).input_ids)


def test_marin_train_data_reads_a_local_pin_kept_apart(apart, tmp_path):
    data, pin, remote, in_place, moto = apart  # noqa: F811
    from marin_train.config import DataConfig, TrainConfig
    from marin_train.data import training_loader

    cfg = TrainConfig(seq_len=16, batch_size=2, data=DataConfig(source=str(pin), cache_dir=str(tmp_path / "c"),
                                                                store_options={"endpoint_url": moto}))
    loader = training_loader(cfg, rank=0, world_size=1)
    try:
        assert next(iter(loader))["input_ids"].shape == (2, 16)
    finally:
        loader.dataset.stream.close()


def test_trace_of_a_pin_kept_apart_names_what_the_store_pinned_in_place_names(apart, tmp_path):
    data, pin, remote, in_place, moto = apart  # noqa: F811
    config = {"data": {"components": {
        "a": {"type": "cached", "flat_cache": True, "cache_dir": "gs://bucket/store/cluster=0/quality=1"},
        "b": {"type": "cached", "flat_cache": True, "cache_dir": f"gs://bucket/store/{CELL}"}},
        "train_weights": {"a": 0.5, "b": 0.5}, "mixture_block_size": 16, "shuffle": True},
        "trainer": {"seed": 3, "train_batch_size": 8, "num_train_steps": 10}, "model": {"max_seq_len": 16}}
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(config))
    want = open_trace(str(run), store=str(in_place)).step(2)
    assert all(s["shards"][0]["sha256"] for s in want["batch"])
    for where in (pin, remote):
        assert open_trace(str(run), store=str(where), endpoint_url=moto).step(2) == want
    shown = _cli("trace", "--levanter-config", run, "--step", "2", "--store", pin, "--endpoint-url", moto)
    assert shown.exit_code == 0, shown.output


def test_publish_refuses_a_pin_kept_apart_saying_how_to_move_it(apart):
    data, pin, remote, in_place, moto = apart  # noqa: F811
    from marin_data.transfer.publish_hf import publish_hf
    from marin_data.transfer.publish_s3 import publish

    for call in (lambda: publish(pin, to=remote + "2", endpoint_url=moto),
                 lambda: publish_hf(pin, to="hf://datasets/team/x", endpoint="http://127.0.0.1:9")):
        with pytest.raises(NotApplicableError, match="kept apart from its data") as info:
            call()
        assert data in info.value.message and "copy the files" in info.value.message
    assert not any(Path(p).name.startswith(".marin") for p in tree_bytes(pin))
