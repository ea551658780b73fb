"""Tests for fedclock.data: datasets, the IDX reader and client partitions."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedclock.data import (
    Dataset,
    SyntheticSpec,
    label_histogram,
    load_dataset,
    partition,
    read_idx,
)
from fedclock.errors import ConfigError, DataError

# --------------------------------------------------------------------------- helpers


def idx_bytes(arr: np.ndarray, magic: int | None = None) -> bytes:
    """Serialise a uint8 array as IDX (magic 0x08NN unless given)."""
    arr = np.asarray(arr, dtype=np.uint8)
    if magic is None:
        magic = 0x0800 | arr.ndim
    header = struct.pack(">I", magic) + struct.pack(f">{arr.ndim}i", *arr.shape)
    return header + arr.tobytes()


def write(path: Path, data: bytes, *, gz: bool | None = None) -> Path:
    if gz is None:
        gz = path.suffix == ".gz"
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def write_fake_mnist(
    folder: Path, n_train: int = 30, n_test: int = 10, *, gz: bool = True, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    x_tr = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    y_tr = (np.arange(n_train) % 10).astype(np.uint8)
    x_te = rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8)
    y_te = (np.arange(n_test) % 10).astype(np.uint8)
    suffix = ".gz" if gz else ""
    for name, arr in [
        ("train-images-idx3-ubyte", x_tr),
        ("train-labels-idx1-ubyte", y_tr),
        ("t10k-images-idx3-ubyte", x_te),
        ("t10k-labels-idx1-ubyte", y_te),
    ]:
        write(folder / (name + suffix), idx_bytes(arr), gz=gz)
    return x_tr, y_tr


def one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.endswith((".", ").")), msg
    return msg


# --------------------------------------------------------------------------- datasets


def test_digits_shapes_and_dtypes() -> None:
    ds = load_dataset("digits", seed=0)
    assert isinstance(ds, Dataset)
    assert ds.name == "digits"
    assert ds.input_shape == (1, 8, 8)
    assert ds.num_classes == 10
    assert ds.x_train.shape == (ds.num_train, 1, 8, 8)
    assert ds.x_test.shape == (ds.num_test, 1, 8, 8)
    assert ds.num_train + ds.num_test == 1797
    assert ds.num_test == 360  # 20 % of 1797, rounded up by scikit-learn
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.x_test.dtype == torch.float32 and ds.y_test.dtype == torch.int64
    # standardised with the train split's scalar mean and std
    assert abs(float(ds.x_train.mean())) < 1e-4
    assert abs(float(ds.x_train.std()) - 1.0) < 1e-3
    # stratified: every class in both splits, in about the global proportion
    test_counts = np.bincount(ds.y_test.numpy(), minlength=10)
    assert test_counts.min() >= 34 and test_counts.max() <= 38


def test_digits_deterministic_per_seed() -> None:
    a, b, c = (load_dataset("digits", seed=s) for s in (3, 3, 4))
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.y_train, c.y_train)


def test_digits_test_fraction_and_max_train() -> None:
    ds = load_dataset("digits", seed=0, test_fraction=0.5, max_train=100)
    assert ds.num_train == 100
    assert ds.num_test == 899  # 0.5 * 1797 rounded up
    with pytest.raises(ConfigError):
        load_dataset("digits", seed=0, test_fraction=1.0)
    with pytest.raises(ConfigError):
        load_dataset("digits", seed=0, test_fraction=0.001)  # too few test samples to stratify


def test_synthetic_deterministic_and_shaped() -> None:
    spec = SyntheticSpec(num_samples=500, num_features=7, num_classes=3, separation=3.0)
    a = load_dataset("synthetic", seed=1, synthetic=spec)
    b = load_dataset("synthetic", seed=1, synthetic=spec)
    c = load_dataset("synthetic", seed=2, synthetic=spec)
    assert a.input_shape == (7,) and a.num_classes == 3
    assert a.x_train.shape == (400, 7) and a.x_test.shape == (100, 7)
    assert a.x_train.dtype == torch.float32 and a.y_train.dtype == torch.int64
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.x_train, c.x_train)
    assert set(a.y_train.tolist()) == {0, 1, 2}


def test_synthetic_default_spec_and_separation_matters() -> None:
    ds = load_dataset("synthetic", seed=0)
    assert ds.x_train.shape == (1600, 20) and ds.num_classes == 4

    def nearest_mean_accuracy(sep: float) -> float:
        d = load_dataset("synthetic", seed=0, synthetic=SyntheticSpec(separation=sep))
        means = torch.stack([d.x_train[d.y_train == k].mean(0) for k in range(4)])
        pred = torch.cdist(d.x_test, means).argmin(1)
        return float((pred == d.y_test).float().mean())

    assert nearest_mean_accuracy(6.0) > 0.95
    assert nearest_mean_accuracy(6.0) > nearest_mean_accuracy(0.5)


def test_synthetic_spec_validation() -> None:
    with pytest.raises(ConfigError):
        SyntheticSpec(num_classes=1)
    with pytest.raises(ConfigError):
        SyntheticSpec(num_features=0)


def test_unknown_dataset_name() -> None:
    with pytest.raises(ConfigError) as err:
        load_dataset("foo", seed=0)
    msg = one_line(err)
    assert "'foo'" in msg
    assert "cifar10, cifar100, digits, mnist, shakespeare, synthetic" in msg


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_roundtrip(tmp_path: Path, gz: bool) -> None:
    images = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    labels = np.array([1, 2, 3], dtype=np.uint8)
    suffix = ".gz" if gz else ""
    ip = write(tmp_path / f"img{suffix}", idx_bytes(images))
    lp = write(tmp_path / f"lbl{suffix}", idx_bytes(labels))
    got = read_idx(ip, expected_magic=2051)
    assert got.dtype == np.uint8 and got.shape == (3, 4, 5)
    np.testing.assert_array_equal(got, images)
    got.flags.writeable = True  # a writable copy, not a view of the file bytes
    np.testing.assert_array_equal(read_idx(lp, expected_magic=2049), labels)


def test_read_idx_detects_gzip_by_content(tmp_path: Path) -> None:
    labels = np.array([7, 8], dtype=np.uint8)
    p = write(tmp_path / "labels.bin", idx_bytes(labels), gz=True)
    np.testing.assert_array_equal(read_idx(p), labels)


def test_read_idx_other_dtypes(tmp_path: Path) -> None:
    arr = np.array([[1.5, -2.0], [3.25, 4.0]], dtype=">f4")
    data = struct.pack(">I", 0x0D02) + struct.pack(">2i", 2, 2) + arr.tobytes()
    got = read_idx(write(tmp_path / "f.idx", data))
    assert got.dtype == np.float32 and got.dtype.isnative
    np.testing.assert_array_equal(got, arr.astype(np.float32))


def test_read_idx_wrong_magic(tmp_path: Path) -> None:
    p = write(tmp_path / "train-images-idx3-ubyte.gz", idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(DataError) as err:
        read_idx(p, expected_magic=2051)
    msg = one_line(err)
    assert str(p) in msg
    assert "not an IDX image file: magic number 2049, expected 2051" in msg

    q = write(tmp_path / "junk", b"\x12\x34\x56\x78" + bytes(20))
    with pytest.raises(DataError) as err:
        read_idx(q)
    assert str(q) in one_line(err)


@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_truncated(tmp_path: Path, gz: bool) -> None:
    full = idx_bytes(np.zeros((10, 28, 28), np.uint8))
    p = write(tmp_path / ("x.gz" if gz else "x"), full[: 16 + 1000], gz=gz)
    with pytest.raises(DataError) as err:
        read_idx(p, expected_magic=2051)
    msg = one_line(err)
    assert str(p) in msg
    assert "is truncated: header announces 7840 bytes of data but only 1000 are present" in msg

    h = write(tmp_path / "h", full[:9], gz=False)
    with pytest.raises(DataError) as err:
        read_idx(h)
    assert str(h) in one_line(err) and "truncated" in str(err.value)


def test_read_idx_trailing_bytes(tmp_path: Path) -> None:
    p = write(tmp_path / "x", idx_bytes(np.zeros(5, np.uint8)) + b"extra")
    with pytest.raises(DataError) as err:
        read_idx(p)
    assert str(p) in one_line(err)


def test_read_idx_corrupt_gzip(tmp_path: Path) -> None:
    good = gzip.compress(idx_bytes(np.arange(100, dtype=np.uint8)))
    bad_crc = bytearray(good)
    bad_crc[-8] ^= 0xFF  # the CRC32 in the gzip trailer
    cases = {
        "crc.gz": bytes(bad_crc),
        "cut.gz": good[: len(good) // 2],
        "plain.gz": idx_bytes(np.arange(100, dtype=np.uint8)),  # .gz name, not gzip
    }
    for name, data in cases.items():
        p = write(tmp_path / name, data, gz=False)
        with pytest.raises(DataError) as err:
            read_idx(p)
        msg = one_line(err)
        assert msg.startswith(f"{p} is not a valid gzip file ("), msg


def test_read_idx_missing(tmp_path: Path) -> None:
    p = tmp_path / "nope.gz"
    with pytest.raises(DataError) as err:
        read_idx(p)
    assert str(p) in one_line(err)


# --------------------------------------------------------------------------- MNIST loader (fake files)


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_loader_fake_files(tmp_path: Path, gz: bool) -> None:
    x_tr, y_tr = write_fake_mnist(tmp_path / "mnist", gz=gz)
    # the parent of mnist/ is accepted as well as the folder itself
    for d in (tmp_path, tmp_path / "mnist", str(tmp_path)):
        ds = load_dataset("mnist", seed=0, data_dir=d)
        assert ds.x_train.shape == (30, 1, 28, 28) and ds.x_test.shape == (10, 1, 28, 28)
        assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
        assert ds.y_train.dtype == torch.int64 and ds.x_train.dtype == torch.float32
        np.testing.assert_array_equal(ds.y_train.numpy(), y_tr)
        expected = (x_tr.astype(np.float64) / 255 - 0.1307) / 0.3081
        np.testing.assert_allclose(ds.x_train.numpy()[:, 0], expected, rtol=1e-5, atol=1e-5)
    assert load_dataset("mnist", seed=0, data_dir=tmp_path, max_train=7).num_train == 7


def test_mnist_loader_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_fake_mnist(tmp_path / "mnist")
    monkeypatch.setenv("FEDCLOCK_DATA", str(tmp_path))
    assert load_dataset("mnist", seed=0).num_train == 30
    monkeypatch.delenv("FEDCLOCK_DATA")
    with pytest.raises(DataError) as err:
        load_dataset("mnist", seed=0)
    assert "FEDCLOCK_DATA" in one_line(err)


def test_mnist_loader_missing_file(tmp_path: Path) -> None:
    write_fake_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as err:
        load_dataset("mnist", seed=0, data_dir=tmp_path)
    msg = one_line(err)
    assert msg.startswith(f"MNIST file not found: {tmp_path / 't10k-labels-idx1-ubyte.gz'} (")
    assert "FEDCLOCK_DATA" in msg

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError) as err:
        load_dataset("mnist", seed=0, data_dir=empty)
    assert str(empty / "train-images-idx3-ubyte.gz") in one_line(err)


def test_mnist_loader_count_mismatch(tmp_path: Path) -> None:
    write_fake_mnist(tmp_path)
    write(tmp_path / "train-labels-idx1-ubyte.gz", idx_bytes(np.zeros(29, np.uint8)))
    with pytest.raises(DataError) as err:
        load_dataset("mnist", seed=0, data_dir=tmp_path)
    msg = one_line(err)
    assert "30 images" in msg and "29 labels" in msg


# --------------------------------------------------------------------------- real MNIST


def test_real_mnist_full(mnist_data: Path) -> None:
    ds = load_dataset("mnist", seed=0, data_dir=mnist_data)
    assert ds.x_train.shape == (60000, 1, 28, 28)
    assert ds.x_test.shape == (10000, 1, 28, 28)
    hist = np.bincount(ds.y_train.numpy(), minlength=10)
    assert hist.tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    test_hist = np.bincount(ds.y_test.numpy(), minlength=10)
    assert test_hist.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    # pixel mean 33.318 (README) -> normalised mean (33.318/255 - 0.1307)/0.3081
    assert abs(float(ds.x_train.mean()) - (33.318 / 255 - 0.1307) / 0.3081) < 1e-3


def test_real_mnist_max_train(mnist_data: Path) -> None:
    ds = load_dataset("mnist", seed=0, data_dir=mnist_data, max_train=1000)
    assert ds.x_train.shape == (1000, 1, 28, 28) and ds.num_test == 10000


# --------------------------------------------------------------------------- partition


def balanced_labels(num_classes: int, per_class: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.permutation(np.repeat(np.arange(num_classes), per_class))


def assert_valid(parts: list[np.ndarray], n: int, num_clients: int, min_samples: int = 1) -> None:
    assert len(parts) == num_clients
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0)  # sorted, no duplicates
        assert len(p) >= min_samples
        assert p.size == 0 or (p[0] >= 0 and p[-1] < n)
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)  # disjoint
    assert len(allidx) <= n


def test_iid_disjoint_and_covering() -> None:
    y = balanced_labels(10, 101)
    parts = partition(y, 7, scheme="iid", seed=0)
    assert_valid(parts, len(y), 7)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) == len(y) // 7
    assert sum(sizes) == len(y)  # the remainder is spread, not dropped
    again = partition(y, 7, scheme="iid", seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition(y, 7, scheme="iid", seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_dirichlet_large_alpha_matches_global_proportions() -> None:
    y = balanced_labels(10, 2000)
    parts = partition(y, 10, scheme="dirichlet", seed=0, alpha=1000.0)
    assert_valid(parts, len(y), 10)
    hist = label_histogram(y, parts, 10)
    props = hist / hist.sum(1, keepdims=True)
    assert np.abs(props - 0.1).max() < 0.04


def test_dirichlet_tiny_alpha_is_skewed() -> None:
    y = balanced_labels(10, 1000)
    parts = partition(y, 50, scheme="dirichlet", seed=0, alpha=0.01)
    assert_valid(parts, len(y), 50)
    assert [len(p) for p in parts] == [200] * 50  # every client gets its quota
    hist = label_histogram(y, parts, 10)
    dominant = hist.max(1) / hist.sum(1)
    assert np.mean(dominant > 0.8) > 0.7
    # and much more skewed than a moderate alpha
    mid = label_histogram(y, partition(y, 50, scheme="dirichlet", seed=0, alpha=10.0), 10)
    assert np.mean(mid.max(1) / mid.sum(1)) < 0.4


def test_shards_pathological() -> None:
    y = balanced_labels(10, 100)  # 1000 samples, shards of 50 never straddle two classes
    parts = partition(y, 10, scheme="shards", seed=0, shards_per_client=2)
    assert_valid(parts, len(y), 10)
    hist = label_histogram(y, parts, 10)
    assert ((hist > 0).sum(1) <= 2).all()
    assert hist.sum() == len(y)
    # with uneven classes a shard may straddle a boundary: still at most 2 per shard
    d = load_dataset("digits", seed=0).y_train.numpy()
    parts = partition(d, 20, scheme="shards", seed=3, shards_per_client=2)
    assert_valid(parts, len(d), 20)
    classes = (label_histogram(d, parts, 10) > 0).sum(1)
    assert classes.max() <= 4 and np.median(classes) <= 3
    with pytest.raises(ConfigError):
        partition(y, 10, scheme="shards", seed=0, sizes="lognormal")


def test_lognormal_sizes() -> None:
    y = balanced_labels(10, 100)
    for scheme in ("iid", "dirichlet"):
        parts = partition(
            y, 20, scheme=scheme, seed=0, sizes="lognormal", size_sigma=1.0, min_samples=5
        )
        assert_valid(parts, len(y), 20, min_samples=5)
        sizes = np.array([len(p) for p in parts])
        assert sizes.sum() <= len(y)
        assert sizes.max() > 2 * sizes.min()
    a = [len(p) for p in partition(y, 20, scheme="iid", seed=0, sizes="lognormal")]
    b = [len(p) for p in partition(y, 20, scheme="dirichlet", seed=0, sizes="lognormal")]
    assert a == b  # sizes come from their own stream


def test_partition_validation() -> None:
    y = balanced_labels(3, 10)
    with pytest.raises(ConfigError) as err:
        partition(y, 4, scheme="foo", seed=0)
    assert "iid, dirichlet, shards, natural" in one_line(err)
    with pytest.raises(ConfigError) as err:
        partition(y, 31, scheme="iid", seed=0)
    assert "partition.num_clients" in one_line(err)
    with pytest.raises(ConfigError) as err:
        partition(y, 10, scheme="iid", seed=0, min_samples=4)
    assert "partition.num_clients" in one_line(err)
    with pytest.raises(ConfigError):
        partition(y, 0, scheme="iid", seed=0)
    with pytest.raises(ConfigError):
        partition(y, 3, scheme="dirichlet", seed=0, alpha=0.0)
    with pytest.raises(ConfigError):
        partition(y, 3, scheme="iid", seed=0, sizes="zipf")
    with pytest.raises(ConfigError):
        partition(y, 10, scheme="shards", seed=0, shards_per_client=4)  # 40 shards > 30 samples


@st.composite
def partition_cases(draw: st.DrawFn) -> tuple[np.ndarray, int, dict[str, object]]:
    num_classes = draw(st.integers(1, 6))
    n = draw(st.integers(1, 150))
    labels = np.array(draw(st.lists(st.integers(0, num_classes - 1), min_size=n, max_size=n)))
    scheme = draw(st.sampled_from(["iid", "dirichlet", "shards"]))
    min_samples = draw(st.integers(1, 3))
    kwargs: dict[str, object] = {
        "scheme": scheme,
        "seed": draw(st.integers(0, 2**32)),
        "min_samples": min_samples,
    }
    if scheme == "shards":
        spc = draw(st.integers(1, 3))
        max_clients = n // (spc * min_samples)
        if max_clients < 1:
            spc, min_samples = 1, 1
            kwargs["min_samples"] = 1
            max_clients = n
        num_clients = draw(st.integers(1, min(max_clients, 20)))
        kwargs["shards_per_client"] = spc
    else:
        num_clients = draw(st.integers(1, max(1, min(n // min_samples, 20))))
        if num_clients * min_samples > n:
            kwargs["min_samples"] = 1
        kwargs["sizes"] = draw(st.sampled_from(["equal", "lognormal"]))
        kwargs["size_sigma"] = draw(st.floats(0.0, 3.0))
        kwargs["alpha"] = draw(st.floats(1e-3, 1e3))
    return labels, num_clients, kwargs


@settings(max_examples=150, deadline=None)
@given(partition_cases())
def test_partition_property(case: tuple[np.ndarray, int, dict[str, object]]) -> None:
    labels, num_clients, kwargs = case
    parts = partition(labels, num_clients, **kwargs)  # type: ignore[arg-type]
    min_samples = int(kwargs["min_samples"])  # type: ignore[call-overload]
    assert_valid(parts, len(labels), num_clients, min_samples=min_samples)
    assert sum(len(p) for p in parts) == len(labels)  # all schemes use every sample
    again = partition(labels, num_clients, **kwargs)  # type: ignore[arg-type]
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    hist = label_histogram(labels, parts, int(labels.max()) + 1)
    assert hist.sum() == len(labels)
    np.testing.assert_array_equal(hist.sum(0), np.bincount(labels))


@pytest.mark.slow
def test_digits_match_sklearn_load_digits() -> None:
    """The fast CSV read gives exactly what scikit-learn's load_digits gives (imports sklearn)."""
    from sklearn.datasets import load_digits

    from fedclock.data.datasets import _digits_arrays

    pixels, y = _digits_arrays()
    bunch = load_digits()
    np.testing.assert_array_equal(pixels, bunch.data)
    np.testing.assert_array_equal(y, bunch.target)


def test_synthetic_is_generated_in_float32_without_a_second_copy() -> None:
    """The samples are drawn into their final float32 tensors: no float64 array and no second
    copy of them is made (numpy's temporaries, traced by tracemalloc, stay far below the size
    of the data), and the train split comes out standardised."""
    import tracemalloc

    spec = SyntheticSpec(num_samples=20_000, num_classes=10, image_shape=(1, 28, 28))
    data_bytes = 20_000 * 784 * 4
    tracemalloc.start()
    try:
        ds = load_dataset("synthetic", seed=0, test_fraction=0.25, synthetic=spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.3 * data_bytes
    for x in (ds.x_train, ds.x_test):
        assert x.dtype == torch.float32 and x.is_contiguous()
        assert x.untyped_storage().nbytes() == x.numel() * 4  # its own storage, nothing more
    assert ds.x_train.shape == (15_000, 1, 28, 28) and ds.x_test.shape == (5_000, 1, 28, 28)
    assert abs(float(ds.x_train.mean())) < 1e-4 and abs(float(ds.x_train.std()) - 1) < 1e-4


def test_a_compressed_idx_announcing_an_absurd_size_is_refused_before_inflating(
    tmp_path: Path,
) -> None:
    """A gzip file whose IDX header announces 255⁴ images (and then a stream of zeros that
    would inflate to gigabytes) is refused from its header: one sentence, little memory."""
    import gzip
    import resource
    import zlib

    from fedclock.data.idx import read_idx

    header = (2051).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (2**31 - 1, 28, 28))
    # 64 MB of zeros in 64 kB (gigabytes would do the same): a bomb if inflated whole
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    body = comp.compress(header) + b"".join(comp.compress(chunk) for _ in range(64)) + comp.flush()
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(body)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(DataError, match=r"announces .* bytes of data in its IDX header") as err:
        read_idx(path, expected_magic=2051)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KB
    # a well-formed file of the same kind still reads; trailing bytes are still seen
    ok = (2049).to_bytes(4, "big") + (3).to_bytes(4, "big") + bytes([1, 2, 3])
    path.write_bytes(gzip.compress(ok))
    assert read_idx(path, expected_magic=2049).tolist() == [1, 2, 3]
    path.write_bytes(gzip.compress(ok + b"\0"))
    with pytest.raises(DataError, match="are present"):
        read_idx(path, expected_magic=2049)
    path.write_bytes(gzip.compress(ok)[:-12])
    with pytest.raises(DataError, match="ends early"):
        read_idx(path, expected_magic=2049)
