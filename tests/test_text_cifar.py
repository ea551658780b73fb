"""Tests for Tiny Shakespeare (roles, windows, natural clients), CIFAR files and CIFAR-shaped runs."""

from __future__ import annotations

import io
import os
import pickle
import string
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from fedclock.config import load_config
from fedclock.data import (
    VOCAB,
    SyntheticSpec,
    TextSpec,
    load_dataset,
    natural_clients,
    partition,
)
from fedclock.data.cifar import CIFAR10_MEAN, CIFAR10_STD, load_cifar
from fedclock.data.shakespeare import encode, load_shakespeare, parse_roles, role_windows
from fedclock.errors import ConfigError, DataError
from fedclock.experiment import run_experiment
from fedclock.models import build_model, layer_view
from tests.conftest import tiny_raw


def one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert msg.endswith((".", ").")), msg
    return msg


def decode(ids: torch.Tensor) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


# --------------------------------------------------------------------------- a small play

PLAY = """A prologue line before any role, ignored.

ROMEO:
But soft, what light through yonder window breaks?
It is the east: and Juliet is the sun.

JULIET:
Ay me!

ROMEO:
She speaks:
O, speak again, bright angel!

NURSE:

JULIET:
O Romeo, Romeo! wherefore art thou Romeo?
Deny thy father and refuse thy name.
"""


def test_parse_roles_on_a_small_play() -> None:
    roles = parse_roles(PLAY)
    # first appearance order; NURSE speaks no line and is not a role; the prologue is ignored
    assert list(roles) == ["ROMEO", "JULIET"]
    assert roles["ROMEO"] == (
        "But soft, what light through yonder window breaks?\n"
        "It is the east: and Juliet is the sun.\n"
        "She speaks:\n"  # ends with ':' but follows no blank line: part of the speech
        "O, speak again, bright angel!\n"
    )
    assert roles["JULIET"] == (
        "Ay me!\nO Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name.\n"
    )
    # a role line may open the file; Windows line ends are fine
    assert parse_roles("KING:\nHo!\r\n\r\nQUEEN:\nHa.\n") == {"KING": "Ho!\n", "QUEEN": "Ha.\n"}
    assert parse_roles("no speeches here\n\njust text\n") == {}


def test_vocabulary_is_string_printable() -> None:
    assert string.printable == VOCAB and len(VOCAB) == 100
    np.testing.assert_array_equal(encode("a0 \n"), [10, 0, VOCAB.index(" "), VOCAB.index("\n")])
    assert decode(torch.from_numpy(encode("Romeo!"))) == "Romeo!"
    # characters outside the vocabulary are read as a space
    np.testing.assert_array_equal(encode("é€x"), encode("  x"))


def test_role_windows_stride_and_edges() -> None:
    codes = np.arange(10, dtype=np.int64)
    x, y = role_windows(codes, seq_len=4, stride=3)
    np.testing.assert_array_equal(x, [[0, 1, 2, 3], [3, 4, 5, 6]])
    np.testing.assert_array_equal(y, [4, 7])
    x, y = role_windows(codes, seq_len=4, stride=1)
    assert len(y) == 6 and y[-1] == 9
    assert role_windows(codes[:4], 4, 1)[1].size == 0  # no next character
    assert role_windows(codes[:5], 4, 1)[1].tolist() == [4]


def write_play(folder: Path, text: str = PLAY, name: str = "tinyshakespeare.txt") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def test_load_shakespeare_small_play(tmp_path: Path) -> None:
    write_play(tmp_path)
    spec = TextSpec(seq_len=8, stride=3, min_samples=5)
    ds = load_shakespeare(tmp_path, text=spec, test_fraction=0.25)
    roles = parse_roles(PLAY)
    n = {r: len(role_windows(encode(t), 8, 3)[1]) for r, t in roles.items()}
    assert n == {"ROMEO": 42, "JULIET": 26}  # 132 and 86 characters
    assert ds.name == "shakespeare" and ds.group_names == ("ROMEO", "JULIET")
    assert ds.input_shape == (8,) and ds.num_classes == 100
    assert ds.x_train.dtype == torch.int64 and ds.input_dtype == torch.int64
    # last 25 % of each role's windows (rounded half up) are its test samples
    assert ds.groups is not None and ds.test_groups is not None
    assert np.bincount(ds.groups).tolist() == [42 - 11, 26 - 7]  # 10.5 -> 11, 6.5 -> 7
    assert np.bincount(ds.test_groups).tolist() == [11, 7]
    assert ds.num_train == len(ds.groups) and ds.num_test == len(ds.test_groups)
    # every sample is 8 characters of its role's text followed by the next one
    for x, y, g in [(ds.x_train, ds.y_train, ds.groups), (ds.x_test, ds.y_test, ds.test_groups)]:
        for row, label, gid in zip(x, y, g, strict=True):
            assert decode(row) + VOCAB[int(label)] in roles[ds.group_names[gid]]
    # train windows come first in the role's text, test windows last
    romeo = roles["ROMEO"]
    assert romeo.startswith(decode(ds.x_train[0]))
    last = (
        decode(ds.x_test[ds.test_groups == 0][-1]) + VOCAB[int(ds.y_test[ds.test_groups == 0][-1])]
    )
    assert romeo.index(last) >= len(romeo) - 8 - 3
    # a larger minimum drops JULIET
    only = load_shakespeare(tmp_path, text=TextSpec(seq_len=8, stride=3, min_samples=30))
    assert only.group_names == ("ROMEO",)


def test_shakespeare_caps_keep_every_role(tmp_path: Path) -> None:
    write_play(tmp_path)
    spec = TextSpec(seq_len=8, stride=1, min_samples=5)
    full = load_dataset("shakespeare", seed=0, data_dir=tmp_path, text=spec)
    capped = load_dataset(
        "shakespeare", seed=0, data_dir=tmp_path, text=spec, max_train=40, max_test=10
    )
    assert capped.num_train == 40 and capped.num_test == 10
    assert full.groups is not None and capped.groups is not None
    share = np.bincount(full.groups) / full.num_train
    np.testing.assert_allclose(np.bincount(capped.groups) / 40, share, atol=1 / 40)
    assert capped.test_groups is not None and set(capped.test_groups.tolist()) == {0, 1}


@pytest.mark.parametrize("where", ["folder", "parent", "sibling", "file", "env"])
def test_shakespeare_data_dir_forms(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_play(tmp_path / "data" / "shakespeare")
    (tmp_path / "data" / "mnist").mkdir()
    given = {
        "folder": path.parent,
        "parent": tmp_path / "data",
        "sibling": tmp_path / "data" / "mnist",
        "file": path,
        "env": None,
    }[where]
    if where == "env":
        monkeypatch.setenv("FEDCLOCK_DATA", str(tmp_path / "data"))
    ds = load_shakespeare(given, text=TextSpec(seq_len=8, stride=3, min_samples=5))
    assert ds.group_names == ("ROMEO", "JULIET")


def test_shakespeare_file_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDCLOCK_DATA", raising=False)
    with pytest.raises(DataError) as err:
        load_shakespeare(None)
    assert "FEDCLOCK_DATA" in one_line(err)
    with pytest.raises(DataError) as err:
        load_shakespeare(tmp_path)
    assert "Tiny Shakespeare not found" in one_line(err) and str(tmp_path) in str(err.value)

    cases = {
        "empty": (b"\n\n  \n", "is empty"),
        "binary": (b"ROMEO:\n\x00\x01\x02", "not a text file"),
        "latin1": ("ROMEO:\nCaf\xe9 au lait\n".encode("latin-1"), "not a UTF-8 text file"),
        "prose": (b"Just some prose\nwithout any speaker.\n", "holds no speeches"),
        "short": (b"ROMEO:\nHi.\n", "no speaking role with at least"),
    }
    for name, (raw, words) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tinyshakespeare.txt").write_bytes(raw)
        with pytest.raises(DataError) as err:
            load_shakespeare(folder)
        msg = one_line(err)
        assert words in msg and "tinyshakespeare.txt" in msg, msg


def test_text_spec_validation() -> None:
    with pytest.raises(ConfigError):
        TextSpec(seq_len=0)
    with pytest.raises(ConfigError):
        TextSpec(stride=0)
    with pytest.raises(ConfigError) as err:
        TextSpec(min_samples=1)
    assert "data.text.min_samples" in one_line(err)


# --------------------------------------------------------------------------- natural partition


def test_natural_partition_takes_the_largest_groups() -> None:
    groups = np.array([0, 1, 1, 2, 2, 2, 3, 3, 1, 2, 4])  # sizes 1, 3, 4, 2, 1
    labels = np.zeros_like(groups)
    parts = partition(labels, 3, scheme="natural", seed=0, groups=groups)
    assert [p.tolist() for p in parts] == [[3, 4, 5, 9], [1, 2, 8], [6, 7]]
    assert all(p.dtype == np.int64 for p in parts)
    # no randomness: the seed does not matter
    again = partition(labels, 3, scheme="natural", seed=99, groups=groups)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    # ties go to the smaller id
    assert natural_clients(groups, 5).tolist() == [2, 1, 3, 0, 4]
    with pytest.raises(ConfigError) as err:
        partition(labels, 4, scheme="natural", seed=0, groups=groups, min_samples=2)
    assert "exceeds the 3 natural clients" in one_line(err)
    with pytest.raises(ConfigError) as err:
        partition(labels, 2, scheme="natural", seed=0)
    assert "partition.scheme 'natural'" in one_line(err)
    with pytest.raises(ConfigError) as err:
        partition(labels, 2, scheme="natural", seed=0, groups=groups, sizes="lognormal")
    assert "partition.sizes" in one_line(err)


def test_natural_partition_on_shakespeare_roles(tmp_path: Path) -> None:
    write_play(tmp_path)
    ds = load_dataset("shakespeare", seed=0, data_dir=tmp_path, text=TextSpec(8, 3, 5))
    assert ds.groups is not None
    parts = partition(ds.y_train.numpy(), 2, scheme="natural", seed=0, groups=ds.groups)
    assert [ds.group_names[int(ds.groups[p[0]])] for p in parts] == ["ROMEO", "JULIET"]
    assert sum(len(p) for p in parts) == ds.num_train
    # iid still works on the same data
    iid = partition(ds.y_train.numpy(), 4, scheme="iid", seed=0)
    assert sorted(np.concatenate(iid).tolist()) == list(range(ds.num_train))


# --------------------------------------------------------------------------- real file


def test_real_tiny_shakespeare(shakespeare_data: Path) -> None:
    folder = shakespeare_data
    text = (folder / "tinyshakespeare.txt").read_text()
    assert len(text) == 1_115_394 and set(text) <= set(VOCAB) and len(set(text)) == 65
    roles = parse_roles(text)
    assert len(roles) == 299
    assert sum(len(t) for t in roles.values()) == 1_027_852
    ds = load_dataset("shakespeare", seed=0, data_dir=folder)
    assert len(ds.group_names) == 219  # roles with ≥ 10 windows at stride 20
    assert (ds.num_train, ds.num_test) == (40_207, 10_047)
    assert ds.group_names[0] == "First Citizen"
    assert decode(ds.x_train[0]) == (
        "Before we proceed any further, hear me speak.\nYou are all resolved rather to die"
    )
    assert VOCAB[int(ds.y_train[0])] == " "
    assert ds.groups is not None
    parts = partition(ds.y_train.numpy(), 20, scheme="natural", seed=0, groups=ds.groups)
    sizes = [len(p) for p in parts]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] > 400
    top = ds.group_names[int(ds.groups[parts[0][0]])]
    assert top == max(roles, key=lambda r: len(roles[r]))


# --------------------------------------------------------------------------- CIFAR files


def cifar_batch(n: int, classes: int, *, seed: int, key: str, str_keys: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    batch = {
        b"batch_label": b"fake batch",
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        key.encode(): [int(v) for v in rng.integers(0, classes, n)],
        b"filenames": [f"img{i}.png".encode() for i in range(n)],
    }
    if key == "fine_labels":
        batch[b"coarse_labels"] = [int(v) % 20 for v in batch[key.encode()]]
    if str_keys:
        return {k.decode(): v for k, v in batch.items()}
    return batch


def write_fake_cifar10(root: Path, per_batch: int = 6, *, str_keys: bool = False) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(names):
        batch = cifar_batch(per_batch, 10, seed=i, key="labels", str_keys=str_keys)
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"x"] * 10}))
    return folder


def write_fake_cifar100(root: Path, n: int = 12) -> Path:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for i, name in enumerate(["train", "test"]):
        (folder / name).write_bytes(pickle.dumps(cifar_batch(n, 100, seed=i, key="fine_labels")))
    return folder


def tar_folder(folder: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return archive


def test_cifar10_from_extracted_folder(tmp_path: Path) -> None:
    folder = write_fake_cifar10(tmp_path)
    ds = load_dataset("cifar10", seed=0, data_dir=tmp_path)
    assert ds.name == "cifar10" and ds.num_classes == 10 and ds.input_shape == (3, 32, 32)
    assert ds.x_train.shape == (30, 3, 32, 32) and ds.x_test.shape == (6, 3, 32, 32)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.groups is None and ds.input_dtype == torch.float32
    # labels in batch order; pixels channel-major, normalised with the CIFAR-10 statistics
    raw = [pickle.loads((folder / f"data_batch_{i}").read_bytes()) for i in range(1, 6)]
    labels = [v for b in raw for v in b[b"labels"]]
    assert ds.y_train.tolist() == labels
    pixels = raw[0][b"data"][2].reshape(3, 32, 32).astype(np.float32) / 255
    mean = np.array(CIFAR10_MEAN, dtype=np.float32)[:, None, None]
    std = np.array(CIFAR10_STD, dtype=np.float32)[:, None, None]
    np.testing.assert_allclose(ds.x_train[2].numpy(), (pixels - mean) / std, rtol=1e-5, atol=1e-6)
    # the folder itself, its parent's parent via cifar/, and str keys work too
    assert load_cifar("cifar10", folder).num_train == 30
    assert load_dataset("cifar10", seed=0, data_dir=tmp_path, max_train=7).num_train == 7
    other = tmp_path / "other"
    write_fake_cifar10(other / "cifar", str_keys=True)
    assert load_cifar("cifar10", other).num_test == 6


def test_cifar10_from_archive(tmp_path: Path) -> None:
    folder = write_fake_cifar10(tmp_path / "build")
    archive = tar_folder(folder, tmp_path / "cifar-10-python.tar.gz")
    from_folder = load_cifar("cifar10", folder)
    for given in (tmp_path, archive, tmp_path / "mnist"):  # folder, the file, a sibling folder
        ds = load_cifar("cifar10", given)
        assert torch.equal(ds.x_train, from_folder.x_train)
        assert torch.equal(ds.y_test, from_folder.y_test)


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    folder = write_fake_cifar100(tmp_path)
    tar_folder(folder, tmp_path / "cifar-100-python.tar.gz")
    ds = load_dataset("cifar100", seed=0, data_dir=tmp_path)
    assert ds.num_classes == 100 and ds.num_train == 12 and ds.num_test == 12
    fine = pickle.loads((folder / "train").read_bytes())[b"fine_labels"]
    assert ds.y_train.tolist() == fine
    # CIFAR-100 is normalised with the CIFAR-10 statistics too
    only_archive = tmp_path / "a"
    only_archive.mkdir()
    (tmp_path / "cifar-100-python.tar.gz").rename(only_archive / "cifar-100-python.tar.gz")
    assert torch.equal(load_cifar("cifar100", only_archive).x_test, ds.x_test)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (pickle.dumps(cifar_batch(4, 10, seed=0, key="labels"))[:100], "not a readable CIFAR"),
        (b"definitely not a pickle", "not a readable CIFAR"),
        (pickle.dumps({b"data": _Evil(), b"labels": [0]}), "never does"),  # never executed
        (pickle.dumps([1, 2, 3]), "holds a pickled list"),
        (pickle.dumps({b"labels": [0]}), "no 'data' entry"),
        (pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}), "(N, 3072)"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "labels of shape"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}), "label 10"),
        (pickle.dumps({b"data": np.full((1, 3072), 300), b"labels": [0]}), "uint8 pixels"),
    ],
)
def test_cifar_corrupt_batches(tmp_path: Path, payload: bytes, words: str) -> None:
    folder = write_fake_cifar10(tmp_path)
    (folder / "data_batch_3").write_bytes(payload)
    with pytest.raises(DataError) as err:
        load_cifar("cifar10", tmp_path)
    msg = one_line(err)
    assert words in msg and "data_batch_3" in msg, msg


def test_cifar_missing_and_corrupt_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDCLOCK_DATA", raising=False)
    with pytest.raises(DataError) as err:
        load_cifar("cifar10", None)
    assert "FEDCLOCK_DATA" in one_line(err)
    with pytest.raises(DataError) as err:
        load_cifar("cifar10", tmp_path)
    assert "CIFAR-10 not found" in one_line(err)
    folder = write_fake_cifar10(tmp_path / "x")
    (folder / "test_batch").unlink()
    with pytest.raises(DataError) as err:
        load_cifar("cifar10", tmp_path / "x")
    assert "CIFAR-10 file not found" in one_line(err) and "test_batch" in str(err.value)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b garbage that is not gzip")
    with pytest.raises(DataError) as err:
        load_cifar("cifar10", bad)
    assert "not a readable tar.gz archive" in one_line(err)
    partial = tmp_path / "partial"
    partial.mkdir()
    with tarfile.open(partial / "cifar-10-python.tar.gz", "w:gz") as tar:
        data = pickle.dumps(cifar_batch(2, 10, seed=0, key="labels"))
        info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError) as err:
        load_cifar("cifar10", partial)
    assert "has no member cifar-10-batches-py/data_batch_2" in one_line(err)


# --------------------------------------------------------------------------- CIFAR-shaped synthetic


def test_synthetic_image_shape() -> None:
    spec = SyntheticSpec(num_samples=100, num_classes=10, image_shape=[3, 32, 32])  # type: ignore[arg-type]
    assert spec.image_shape == (3, 32, 32) and spec.sample_shape == (3, 32, 32)
    ds = load_dataset("synthetic", seed=0, synthetic=spec)
    assert ds.input_shape == (3, 32, 32) and ds.x_train.shape == (80, 3, 32, 32)
    assert ds.num_classes == 10 and ds.x_test.shape == (20, 3, 32, 32)
    with pytest.raises(ConfigError) as err:
        SyntheticSpec(image_shape=(3, 0))
    assert "data.synthetic.image_shape" in one_line(err)
    cfg = load_config(
        raw={"data": {"name": "synthetic", "synthetic": {"image_shape": [3, 32, 32]}}}
    )
    assert cfg.data.synthetic.image_shape == [3, 32, 32]
    with pytest.raises(ConfigError):
        load_config(raw={"data": {"synthetic": {"image_shape": [3, -1]}}})


def test_max_test_caps_any_dataset() -> None:
    ds = load_dataset("digits", seed=0, max_test=50)
    assert ds.num_test == 50
    with pytest.raises(ConfigError) as err:
        load_dataset("digits", seed=0, max_test=0)
    assert "data.max_test" in one_line(err)


# --------------------------------------------------------------------------- end to end


def test_config_accepts_the_new_fields() -> None:
    cfg = load_config(
        raw={
            "data": {"name": "shakespeare", "text": {"stride": 40}, "max_test": 500},
            "partition": {"scheme": "natural", "num_clients": 10},
            "model": {"arch": "lstm", "lstm_hidden": 64},
        }
    )
    assert cfg.data.text.seq_len == 80 and cfg.data.text.stride == 40
    assert cfg.model.embed_dim == 8 and cfg.model.lstm_layers == 2 and cfg.model.fc_hidden is None
    for arch in ("fraboni_cnn", "vgg11", "vgg13", "vgg16", "vgg19"):
        assert load_config(raw={"model": {"arch": arch}}).model.arch == arch
    with pytest.raises(ConfigError) as err:
        load_config(raw={"data": {"text": {"min_samples": 1}}})
    assert "data.text.min_samples" in str(err.value)


@pytest.fixture
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_shakespeare_lstm_natural_run(tmp_path: Path, restore_threads: None) -> None:
    # One intra-op thread: on a busy machine, torch's CPU LSTM kernels with several
    # threads can run a hundred times slower (one parallel region per time step).
    write_play(tmp_path / "data")
    raw = tiny_raw(
        data={"name": "shakespeare", "data_dir": str(tmp_path / "data"),
              "text": {"seq_len": 10, "stride": 2, "min_samples": 5}},
        partition={"scheme": "natural", "num_clients": 2},
        model={"arch": "lstm", "lstm_hidden": 12, "embed_dim": 4},
        train={"local_epochs": None, "local_steps": 2, "batch_size": 8, "lr": 0.5},
        budget={"aggregations": 2},
        executor={"kind": "serial", "threads": 1},
        output_dir=str(tmp_path / "runs"),
    )  # fmt: skip
    result = run_experiment(load_config(raw=raw), run_dir=tmp_path / "run")
    assert result.error is None and result.summary["status"] == "completed"
    assert len(result.history) >= 2
    assert all(np.isfinite(h["test_loss"]) for h in result.history if "test_loss" in h)


@pytest.mark.parametrize("model", [{"arch": "fraboni_cnn"}, {"arch": "vgg11", "vgg_width": 0.125}])
def test_cifar_shaped_synthetic_run(tmp_path: Path, model: dict) -> None:
    raw = tiny_raw(
        data={"name": "synthetic",
              "synthetic": {"num_samples": 120, "num_classes": 10, "image_shape": [3, 32, 32]}},
        partition={"scheme": "iid", "num_clients": 3},
        model=model,
        train={"local_epochs": None, "local_steps": 1, "batch_size": 8, "lr": 0.05},
        budget={"aggregations": 1},
        output_dir=str(tmp_path / "runs"),
    )  # fmt: skip
    result = run_experiment(load_config(raw=raw), run_dir=tmp_path / "run")
    assert result.error is None and result.summary["status"] == "completed"


def test_lstm_on_shakespeare_layer_view_uses_token_input(tmp_path: Path) -> None:
    write_play(tmp_path)
    ds = load_dataset("shakespeare", seed=0, data_dir=tmp_path, text=TextSpec(8, 3, 5))
    model = build_model(
        "lstm", input_shape=ds.input_shape, num_classes=ds.num_classes, input_dtype=ds.input_dtype
    )
    assert [layer.name for layer in layer_view(model, ds.input_shape)] == [
        "net.0", "net.1", "net.2", "net.4",
    ]  # fmt: skip
    assert model(ds.x_train[:4]).shape == (4, 100)
