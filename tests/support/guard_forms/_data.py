"""The data every script here trains on: 32 samples of 4 features, the class the sign of the first."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def loader(n: int = 32, batch_size: int = 4) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=batch_size)
