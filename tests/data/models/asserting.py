"""A tiny image classifier that trips a device-side assert on a GPU when its batch holds two images (an index past
the end of a tensor): the sticky CUDA error of issue 24, on purpose. On the CPU the same index raises IndexError."""

import torch
import torch.nn as nn


class Asserting(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 4, stride=4)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        y = self.conv(x).mean(dim=(2, 3))
        if x.shape[0] == 2:
            y = y[torch.full((2,), 10**6, device=x.device)]  # out of bounds: a device-side assert under CUDA
        return self.head(y)
