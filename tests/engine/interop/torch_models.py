"""The torch models the interop tests convert, and the factories the FL and PPO hooks load by name
(``torch:torch_models:<factory>`` with this folder on ``sys.path``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self, n_in: int = 10, n_out: int = 5) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, 32), nn.Tanh(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, n_out))

    def forward(self, x):
        return self.net(x)


class ConvBN(nn.Module):
    """A small image classifier with 2-d and 1-d batch norm (converted in eval mode)."""

    def __init__(self, channels: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, classes))

    def forward(self, x):
        return self.head(self.features(x))


class BasicBlock(nn.Module):
    """ResNet's basic block (He et al., 2016) with a strided 1x1 projection shortcut."""

    def __init__(self, c_in: int = 4, c_out: int = 8, stride: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        identity = self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class SequenceMixer(nn.Module):
    """An attention-free sequence model over (batch, channels, length): a 1-d convolution, then a
    token-mixing MLP across positions and a channel MLP, each with LayerNorm and a residual add
    (the MLP-Mixer pattern, Tolstikhin et al., 2021), mean-pooled over the sequence."""

    def __init__(self, channels: int = 6, length: int = 16, width: int = 12, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Conv1d(channels, width, 3, padding=1)
        self.norm1 = nn.LayerNorm(width)
        self.token_mix = nn.Sequential(nn.Linear(length, 2 * length), nn.GELU(approximate="tanh"), nn.Linear(2 * length, length))
        self.norm2 = nn.LayerNorm(width)
        self.channel_mix = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.out = nn.Linear(2 * width, classes)

    def forward(self, x):
        h = self.embed(x).transpose(1, 2)  # (B, L, W)
        h = h + self.token_mix(self.norm1(h).permute(0, 2, 1)).permute(0, 2, 1)
        h = h + self.channel_mix(self.norm2(h))
        pooled = torch.cat([h.mean(dim=1), torch.sum(h, 1) / h.size(1) - h[:, 0]], dim=-1)
        return self.out(pooled)


class NatureCNN(nn.Module):
    """The Nature-DQN network (Mnih et al., 2015) with PPO's policy and value heads, on uint8-scaled frames."""

    def __init__(self, actions: int = 6) -> None:
        super().__init__()
        self.torso = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU())
        self.policy = nn.Linear(512, actions)
        self.value = nn.Linear(512, 1)

    def forward(self, x):
        h = self.torso(x / 255.0)
        return self.policy(h), self.value(h).squeeze(-1)


def randomize_batch_norm(module: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial running statistics and affine parameters, so eval-mode batch norm is not ~identity."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)
    return module


# ----------------------------------------------------------------------------- factories for the hooks


class DigitsCNN(nn.Module):
    """For the 8x8 digits of the ``fedsim`` kind: the flat 64 features viewed as a 1x8x8 image."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, num_classes)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x.view(-1, 1, 8, 8)))), 2)
        return self.fc(torch.flatten(h, 1))


def digits_cnn(num_features: int, num_classes: int) -> nn.Module:
    assert num_features == 64, num_features
    return DigitsCNN(num_classes).eval()


def mlp_classifier(num_features: int, num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(num_features, 32), nn.ReLU(), nn.Linear(32, num_classes))


def three_logits(num_features: int, num_classes: int) -> nn.Module:
    """A classifier with the wrong output width (for the error test)."""
    return nn.Linear(num_features, 3)


def tanh_torso(observation_shape: tuple) -> nn.Module:
    """A PPO torso for vector observations: two 64-unit tanh layers."""
    return nn.Sequential(nn.Linear(observation_shape[0], 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())


class _Scalar(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n, 1)

    def forward(self, x):
        return self.fc(x).squeeze(-1)


def flat_output_torso(observation_shape: tuple) -> nn.Module:
    """A torso giving one number per example instead of a feature vector (for the error test)."""
    return _Scalar(observation_shape[0])
