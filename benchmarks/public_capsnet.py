"""A CapsNet written the way most public PyTorch reimplementations write it: the throughput baseline.

Not used by the service or the training; benchmarks/train_throughput.py times it beside ours in the
same process, on the same batch and device. What makes it "public style" (and slower):
- PrimaryCaps as 8 separate 32-channel convs, stacked (one per capsule dimension);
- votes by broadcasting: W (1, 10, 1152, 16, 8) @ u (B, 1, 1152, 8, 1) -> (B, 10, 1152, 16, 1), a
  batched matmul of B x 11,520 tiny matrices whose backward reduces a (B, 10, 1152, 16, 8) tensor;
- routing iterations on detached votes except the last (a common shortcut), squash with eps outside
  the root, fp32 throughout;
- margin loss + 0.0005 x nn.MSELoss (the mean, not the paper's sum) on the true-label mask.
The architecture and parameter count (8,215,568) are the paper's, as ours are.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    sq = (s**2).sum(dim=dim, keepdim=True)
    return sq / (1 + sq) * s / (torch.sqrt(sq) + 1e-8)


def routing(u_hat: torch.Tensor, iters: int = 3) -> torch.Tensor:
    """Public-style dynamic routing on votes (B, 10, 1152, 16) -> v (B, 10, 16): detached but the last."""
    b = torch.zeros(u_hat.shape[:3], device=u_hat.device)
    for r in range(iters):
        c = F.softmax(b, dim=1)
        votes = u_hat if r == iters - 1 else u_hat.detach()
        v = squash((c.unsqueeze(-1) * votes).sum(dim=2))  # (B, 10, 16)
        if r < iters - 1:
            b = b + (votes * v.unsqueeze(2)).sum(-1)
    return v


class PublicCapsNet(nn.Module):
    def __init__(self, routing_iters: int = 3):
        super().__init__()
        self.routing_iters = routing_iters
        self.conv1 = nn.Conv2d(1, 256, 9)
        self.primary = nn.ModuleList([nn.Conv2d(256, 32, 9, stride=2) for _ in range(8)])
        self.W = nn.Parameter(0.01 * torch.randn(1, 10, 1152, 16, 8))
        self.decoder = nn.Sequential(
            nn.Linear(160, 512),
            nn.ReLU(inplace=True),
            nn.Linear(512, 1024),
            nn.ReLU(inplace=True),
            nn.Linear(1024, 784),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(self.conv1(x))
        u = torch.stack([cap(x) for cap in self.primary], dim=1)  # (B, 8, 32, 6, 6)
        u = squash(u.reshape(x.size(0), 8, -1).transpose(1, 2))  # (B, 1152, 8)
        u_hat = (self.W @ u[:, None, :, :, None]).squeeze(-1)  # (B, 10, 1152, 16)
        v = routing(u_hat, self.routing_iters)
        lengths = v.norm(dim=-1)
        masked = v * F.one_hot(y, 10).unsqueeze(-1)
        return lengths, self.decoder(masked.flatten(1)).view(-1, 1, 28, 28)

    @staticmethod
    def loss(lengths, reconstruction, x, y) -> torch.Tensor:
        T = F.one_hot(y, 10).float()
        margin = T * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - T) * F.relu(lengths - 0.1) ** 2
        return margin.sum(1).mean() + 0.0005 * F.mse_loss(reconstruction, x)
