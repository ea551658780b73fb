"""scripts/salf_authors_loop.py, the independent cross-check of SALF reference mode."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script, require_data


def _module():
    return load_script("salf_authors_loop")


def _loop(capsys, *argv: str) -> dict:
    mnist = require_data("mnist")  # skip, or fail under CI=true, without the shared MNIST
    module = _module()
    base = ["--data-dir", str(mnist), "--users", "4", "--rounds", "2", "--seed", "5"]
    assert module.main([*base, *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_no_stragglers_is_vanilla_and_all_stragglers_never_move(capsys) -> None:
    vanilla = _loop(capsys, "--method", "vanilla")
    drop0 = _loop(capsys, "--method", "drop", "--ratio", "0")
    keys = ("val_best_test_accuracy", "final_test_accuracy")
    assert [vanilla[k] for k in keys] == [drop0[k] for k in keys]
    # every user a straggler: divide by U of global copies leaves the model where it
    # started, in every round, whether the set is fixed or re-drawn
    frozen = [_loop(capsys, "--method", "drop", "--ratio", "1", *r) for r in ((), ("--redraw",))]
    for run in frozen:
        assert run["final_test_accuracy"] == run["val_best_test_accuracy"]
    assert frozen[0]["final_test_accuracy"] == frozen[1]["final_test_accuracy"]
    assert frozen[0]["final_test_accuracy"] != vanilla["final_test_accuracy"]


# --authors-rng: the authors' random calls in the authors' order


def test_authors_draws_are_torch_data_utilities_draws() -> None:
    """random_split + model init + randperm + DataLoader(shuffle=True) first batches,
    made with torch's own classes, equal the script's helpers call for call, and leave
    the global generator in the same state."""
    import torch
    from torch.utils.data import DataLoader, Subset, TensorDataset, random_split

    m = _module()
    n, n_val, users, batch = 700, 100, 5, 16
    data = TensorDataset(torch.arange(n))
    # users 0 and 3 are drop-mode stragglers in round 1: they draw nothing that round
    skip = {(1, 0), (1, 3)}

    def with_torch(seed: int):
        torch.manual_seed(seed)
        train, val = random_split(data, [n - n_val, n_val])
        init = m.MLP().state_dict()
        order = torch.randperm(len(train))
        per = len(train) // users
        loaders = [
            DataLoader(Subset(train, order[u * per : (u + 1) * per]), batch, shuffle=True)
            for u in range(users)
        ]
        batches = [
            next(iter(loaders[u]))[0] for t in range(3) for u in range(users) if (t, u) not in skip
        ]
        return torch.tensor(val.indices), init, batches, torch.get_rng_state()

    def with_script(seed: int):
        torch.manual_seed(seed)
        train, val = m.authors_split(n, n_val)
        init = m.MLP().state_dict()
        shards = m.authors_shards(train, users)
        batches = [
            shards[u][m.authors_batch(len(shards[u]), batch)]
            for t in range(3)
            for u in range(users)
            if (t, u) not in skip
        ]
        return val, init, batches, torch.get_rng_state()

    for seed in (1234, 1):
        (v1, i1, b1, s1), (v2, i2, b2, s2) = with_torch(seed), with_script(seed)
        assert torch.equal(v1, v2)
        assert all(torch.equal(i1[k], i2[k]) for k in i1)
        assert len(b1) == len(b2) == 13 and all(
            torch.equal(a, b) for a, b in zip(b1, b2, strict=True)
        )
        assert torch.equal(s1, s2)
    assert not torch.equal(with_script(1234)[0], with_script(1)[0])


def test_authors_rng_images_are_totensor_normalize() -> None:
    import numpy as np
    import torch

    from fedclock.data.idx import read_idx

    mnist = require_data("mnist")
    x = _module().load(mnist)[2]  # the test images
    raw = torch.from_numpy(np.ascontiguousarray(read_idx(mnist / "t10k-images-idx3-ubyte.gz")))
    # torchvision: ToTensor (uint8 -> float32 / 255), Normalize((0.5,), (0.5,))
    expected = raw.float().div(255).sub_(torch.tensor([0.5])).div_(torch.tensor([0.5]))
    assert torch.equal(x, expected.unsqueeze(1))


def test_authors_rng_stragglers_vanilla_and_init_seed(capsys) -> None:
    import random

    rng = ("--authors-rng",)
    vanilla = _loop(capsys, *rng, "--method", "vanilla")
    assert vanilla["stragglers"] == []  # vanilla draws no straggler set
    # nothing consumes Python's random before the straggler set
    random.seed(5)
    assert _loop(capsys, *rng, "--method", "drop", "--ratio", "0.5")["stragglers"] == (
        random.sample(range(4), 2)
    )
    keys = ("best_val_accuracy", "val_best_test_accuracy", "final_test_accuracy")
    for method in ("drop", "salf"):  # no stragglers: the same draws and numbers as vanilla
        run = _loop(capsys, *rng, "--method", method, "--ratio", "0")
        assert [run[k] for k in keys] == [vanilla[k] for k in keys]
    # the run's own seed as --init-seed changes nothing; another seed changes only the init
    own = _loop(capsys, *rng, "--method", "salf", "--ratio", "0.5", "--init-seed", "5")
    plain = _loop(capsys, *rng, "--method", "salf", "--ratio", "0.5")
    other = _loop(capsys, *rng, "--method", "salf", "--ratio", "0.5", "--init-seed", "1234")
    assert [own[k] for k in keys] == [plain[k] for k in keys]
    assert other["stragglers"] == plain["stragglers"]
    assert [other[k] for k in keys] != [plain[k] for k in keys]
    # the default mode draws differently (fresh local models, its own batch stream)
    default = _loop(capsys, "--method", "vanilla")
    assert [default[k] for k in keys] != [vanilla[k] for k in keys]
    assert "authors_rng" not in default


def test_authors_rng_initial_model_is_the_seeds_first_draws() -> None:
    import torch

    m = _module()
    state = m.authors_initial_state(m.CNN, 1234, 60_000)
    torch.manual_seed(1234)
    torch.randperm(60_000)  # random_split comes first in the authors' main.py
    expected = m.CNN().state_dict()
    assert list(state) == list(expected)  # conv1, conv2, fc1, fc2: 8 tensors
    assert len(state) == 8 and all(torch.equal(state[k], expected[k]) for k in state)
    bound = 1 / 5  # conv1: fan_in 1·5·5, kaiming_uniform(a=√5) -> U(±1/√fan_in)
    assert float(state["conv1.weight"].abs().max()) <= bound
    assert not torch.equal(state["fc2.bias"], m.authors_initial_state(m.CNN, 1, 60_000)["fc2.bias"])


@pytest.mark.parametrize(
    "argv",
    [
        ("--authors-rng", "--method", "asyncfl"),  # not in the authors' code
        ("--authors-rng", "--redraw"),  # nor is a re-drawn straggler set
        ("--init-seed", "3"),  # the initial model of the authors' calls needs their calls
    ],
)
def test_authors_rng_refuses_what_the_authors_code_cannot_run(argv) -> None:
    with pytest.raises(SystemExit):
        _module().main(["--data-dir", str(require_data("mnist")), *argv])
