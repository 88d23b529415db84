"""torch and JAX get the batch without a copy, and a tiny torch model trains from as_torch."""

import numpy as np
import pytest

import insitubatch as isb
from insitubatch.frameworks import as_torch, to_jax, to_torch


def test_torch_shares_the_data_pointer_and_trains_two_epochs(fixtures):
    torch = pytest.importorskip("torch")
    store = fixtures[0] / "era5_v3.zarr"
    with isb.InSituDataset(store, batch_size=4) as ds:
        b = next(iter(ds.train))
        t = to_torch(b)
        for label, arr in b.arrays.items():
            assert t[label].data_ptr() == arr.__array_interface__["data"][0]
        model = torch.nn.Linear(9 * 16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)
        loader = torch.utils.data.DataLoader(as_torch(ds.train), batch_size=None, num_workers=0)
        steps = 0
        for epoch in range(2):
            ds.set_epoch(epoch)
            for batch in loader:
                x = batch["t2m"].reshape(batch["t2m"].shape[0], -1)
                loss = (model(x).squeeze(1) - batch["u10"].mean(dim=(1, 2))).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
        assert steps == 6 and np.isfinite(loss.item())


def test_jax_import_shares_the_buffer(fixtures):
    jax = pytest.importorskip("jax")
    store = fixtures[0] / "era5_v3.zarr"
    with isb.InSituDataset(store, batch_size=4) as ds:
        b = next(iter(ds.train))
        j = to_jax(b)
        for label, arr in b.arrays.items():
            np.testing.assert_array_equal(np.asarray(j[label]), arr)
            ptr = j[label].unsafe_buffer_pointer()
            assert ptr == arr.__array_interface__["data"][0]


def test_as_torch_in_a_dataloader_worker_says_to_use_num_workers_0(fixtures, monkeypatch):
    torch = pytest.importorskip("torch")
    store = fixtures[0] / "era5_v3.zarr"
    with isb.InSituDataset(store, batch_size=4) as ds:
        # Inside a worker process (simulated: forking a real worker here would fork JAX's and
        # the runtime's threads too), iterating says what to do instead of failing obscurely.
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
        with pytest.raises(isb.WrongProcess, match="num_workers=0"):
            next(iter(as_torch(ds.train)))
        monkeypatch.undo()
        assert sum(len(b["t2m"]) for b in as_torch(ds.train)) > 0
