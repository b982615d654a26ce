"""CapsNet: a three-layer capsule network with a reconstruction decoder.

Paper: `Dynamic Routing Between Capsules` - Sabour, Frosst & Hinton, NIPS 2017
    https://arxiv.org/abs/1710.09829
The routing between PrimaryCaps and DigitCaps is pluggable (model/routing.py, CapsNetConfig.routing):
dynamic (the paper), em (`Matrix Capsules with EM Routing`, with 4x4 pose matrices) or qp-l2 / qp-l1
(QP-regularised routing with learned coefficients).

Parts before the whole: squash (Eq. 1) -> PrimaryCaps -> DigitCaps (Eq. 2 + routing) ->
PrimaryMatrixCaps -> MatrixDigitCaps (EM) -> Decoder (Fig. 2) -> margin loss (Eq. 4) ->
spread loss (matrix capsules' Eq. 3) -> CapsNetConfig -> CapsNet.
For a 28x28 input: Conv1 20x20x256 -> 1152 primary 8D capsules -> 10 digit 16D capsules;
8,215,568 parameters, 6,804,224 without the decoder (the paper's 8.2M and 6.8M), for dynamic routing.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.grad  # conv2d_input; torch.nn does not import this module itself

from model import contract
from model.routing import (
    ROUTINGS,
    DynamicRouting,
    EMRouting,
    QPRouting,
    RoutingIterations,
    capsule_length,
    digit_routing,
    fused_digit_routing,
    squash,
)

__all__ = [
    "CapsNet",
    "CapsNetConfig",
    "CapsNetOutput",
    "Decoder",
    "DigitCaps",
    "Digits",
    "MatrixDigitCaps",
    "PrimaryCaps",
    "PrimaryMatrixCaps",
    "StridedConv2d",
    "capsule_length",
    "create_routing",
    "margin_loss",
    "one_hot",
    "spread_loss",
    "squash",
]

LOSSES = ("margin", "spread")
SPREAD_MARGINS = (0.2, 0.9)  # the spread loss's margin m, raised from the first to the second over training


class _StridedConvFunction(torch.autograd.Function):
    """conv2d (no padding, dilation 1) with the weight gradient taken as a dilated convolution."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int):
        ctx.save_for_backward(x, weight)
        ctx.stride = stride
        return F.conv2d(x, weight, bias, stride)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        s, (kh, kw) = ctx.stride, weight.shape[-2:]
        # in the gradient's dtype, as the forward's conv ran (bf16 under autocast, where the saved fp32
        # x and weight were cast on the fly); each gradient is returned in its input's dtype
        xs, ws = x.to(grad.dtype), weight.to(grad.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.nn.grad.conv2d_input(x.shape, ws, grad, stride=s).to(x.dtype)
        # dL/dW[o, c, p, q] = sum_{b, y, x} g[b, o, y, x] in[b, c, s y + p, s x + q]: the input's channels
        # as a batch, convolved with the gradient's (batch as channels) dilated by the stride
        grad_w = F.conv2d(xs.transpose(0, 1), grad.transpose(0, 1), dilation=s).transpose(0, 1)[..., :kh, :kw]
        return grad_x, grad_w.to(weight.dtype), grad.float().sum((0, 2, 3)), None


class StridedConv2d(nn.Conv2d):
    """nn.Conv2d (same parameters, same state dict) whose weight gradient on a CPU is a dilated
    convolution of the input by the output gradient: oneDNN's own bf16 weight-gradient kernel for
    PrimaryCaps' 9x9 stride-2 conv takes 2x as long (314 vs 145 ms at batch 128, AMD EPYC), and
    that conv is most of a training step. Elsewhere (CUDA, no grad, export) it is nn.Conv2d.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.padding != (0, 0) or self.dilation != (1, 1) or self.groups != 1 or self.stride[0] != self.stride[1]:
            raise ValueError("StridedConv2d takes no padding, dilation or groups, and one stride")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and torch.is_grad_enabled():
            return _StridedConvFunction.apply(x, self.weight, self.bias, self.stride[0])
        return super().forward(x)


class PrimaryCaps(nn.Module):
    """A convolutional capsule layer: a conv whose outputs are grouped into squashed 8D capsules.

    The conv's out_chans = num_types * caps_dim channels are read as num_types groups of caps_dim
    (channel = type * caps_dim + dim, as the official code reshapes them) and the grid is flattened
    after the dims are moved last, so capsule index i = type * H * W + row * W + col.
    """

    def __init__(
        self, in_chans: int = 256, num_types: int = 32, caps_dim: int = 8, kernel_size: int = 9, stride: int = 2
    ):
        super().__init__()
        self.num_types, self.caps_dim = num_types, caps_dim
        self.conv = StridedConv2d(in_chans, num_types * caps_dim, kernel_size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)  # (B, 256, 6, 6)
        B, _, H, W = x.shape
        x = x.view(B, self.num_types, self.caps_dim, H, W)  # (B, 32, 8, 6, 6)
        x = x.permute(0, 1, 3, 4, 2).reshape(B, self.num_types * H * W, self.caps_dim)  # (B, 1152, 8)
        return squash(x.float())  # fp32 from here on, also under bf16 autocast (see DigitCaps)


class Digits(NamedTuple):
    """What a class-capsule layer (DigitCaps, MatrixDigitCaps) returns."""

    capsules: torch.Tensor  # (B, 10, 16) v_j (em: the flattened 4x4 poses mu_j)
    lengths: torch.Tensor  # (B, 10) ||v_j|| (em: the activations a_j)
    routing: torch.Tensor  # (B, 1152, 10) c_ij of the last iteration (em: R_ij; qp: b_ij)
    votes: torch.Tensor | None  # (B, 1152, 10, 16) u_hat_j|i (em: flattened V_ij); None when training dynamic
    iterations: RoutingIterations | None = None  # dynamic routing outside training: every iteration


class DigitCaps(nn.Module):
    """Fully connected capsule layer: u_hat_j|i = W_ij u_i (Eq. 2), then a routing (dynamic or qp).

    W holds one 16x8 matrix per (i, j) pair, initialised N(0, 0.01^2); no bias, as in the paper (the
    authors' released code draws W from a truncated normal of std 0.1 and adds a bias of 0.1 to each s_j).

    The votes and the routing run in fp32 even inside a bf16 autocast region: s_j sums 1152 votes
    (Eq. 2) and b_ij accumulates agreements over the iterations, which bf16's 8 mantissa bits would
    round away; only the convolutions before them and the decoder after them take the autocast dtype.
    """

    def __init__(
        self,
        in_caps: int = 1152,
        in_dim: int = 8,
        num_caps: int = 10,
        out_dim: int = 16,
        routing: nn.Module | None = None,
    ):
        super().__init__()
        self.W = nn.Parameter(0.01 * torch.randn(in_caps, num_caps, out_dim, in_dim))
        self.routing = routing if routing is not None else DynamicRouting()

    def forward(self, u: torch.Tensor) -> Digits:
        """Primary capsules (B, 1152, 8) -> v (B, 10, 16), ||v|| (B, 10), coefficients (B, 1152, 10),
        the votes u_hat (B, 1152, 10, 16) and, for dynamic routing outside training, every iteration's
        couplings and logit changes. When training with dynamic routing, the votes and the iterations
        are None (fused_digit_routing never stores them; nothing in training reads them)."""
        with torch.autocast(u.device.type, enabled=False):
            u = u.float()
            if isinstance(self.routing, DynamicRouting):
                if self.training and torch.is_grad_enabled():
                    v, c = fused_digit_routing(u, self.W, self.routing.iters)  # the votes are never stored
                    return Digits(v, capsule_length(v), c, None)
                v, c, u_hat, iterations = digit_routing(u, self.W, self.routing.iters)  # matmuls, also in ONNX
                return Digits(v, capsule_length(v), c, u_hat, iterations)
            u_hat = torch.einsum("ijdk,bik->bijd", self.W, u)  # (B, 1152, 10, 16)
            v, lengths, c = self.routing(u_hat)  # (B, 10, 16), (B, 10), (B, 1152, 10)
        return Digits(v, lengths, c, u_hat)


class PrimaryMatrixCaps(nn.Module):
    """Primary capsules with a 4x4 pose matrix M_i and an activation a_i (EM routing, the tutorial's
    "Representations"), on the same 9x9 stride-2 conv as PrimaryCaps.

    Capsule index i = type * H * W + row * W + col, as in PrimaryCaps.
    """

    def __init__(
        self,
        in_chans: int = 256,
        num_types: int = 32,
        hidden_chans: int = 256,
        pose_size: int = 4,
        kernel_size: int = 9,
        stride: int = 2,
    ):
        super().__init__()
        self.num_types, self.pose_dim = num_types, pose_size * pose_size
        self.conv = nn.Conv2d(in_chans, hidden_chans, kernel_size, stride)
        # NOTE the matrix-capsules paper makes poses and activations with 1x1 convs on a ReLU conv
        # layer; we put those 1x1 heads on PrimaryCaps' 9x9 stride-2 conv (+ ReLU) so that the
        # network before the routing costs the same for every routing.
        self.pose = nn.Conv2d(hidden_chans, num_types * self.pose_dim, 1)
        self.activation = nn.Conv2d(hidden_chans, num_types, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 256, 20, 20) -> poses (B, 1152, 16) (flattened 4x4) and activations (B, 1152)."""
        x = F.relu(self.conv(x))  # (B, 256, 6, 6)
        B, _, H, W = x.shape
        pose = self.pose(x).view(B, self.num_types, self.pose_dim, H, W)  # (B, 32, 16, 6, 6)
        pose = pose.permute(0, 1, 3, 4, 2).reshape(B, self.num_types * H * W, self.pose_dim)  # (B, 1152, 16)
        a = torch.sigmoid(self.activation(x)).reshape(B, self.num_types * H * W)  # (B, 1152)
        return pose, a


class MatrixDigitCaps(nn.Module):
    """Class capsules with 4x4 pose matrices: votes V_ij = M_i W_ij, then EM routing (Eqs. 20-29).

    One 4x4 W_ij per (i, j) pair, fully connected like DigitCaps (the paper shares W over positions
    in its convolutional layers). Initialised N(0, 0.5^2) so that a vote's entries have about the
    spread of the pose's (each is a sum of 4 products).
    """

    def __init__(self, in_caps: int = 1152, num_caps: int = 10, pose_size: int = 4, routing: nn.Module | None = None):
        super().__init__()
        self.pose_size = pose_size
        self.W = nn.Parameter(0.5 * torch.randn(in_caps, num_caps, pose_size, pose_size))
        self.routing = routing if routing is not None else EMRouting(num_caps)

    def forward(self, caps: tuple[torch.Tensor, torch.Tensor]):
        """(poses (B, 1152, 16), activations (B, 1152)) -> mu (B, 10, 16), a (B, 10), R (B, 1152, 10)
        and the votes (B, 1152, 10, 16)."""
        pose, a_in = caps
        with torch.autocast(pose.device.type, enabled=False):  # fp32 routing, as in DigitCaps
            M = pose.float().view(*pose.shape[:2], self.pose_size, self.pose_size)  # (B, 1152, 4, 4)
            votes = torch.einsum("bipq,ijqr->bijpr", M, self.W).flatten(-2)  # V_ij = M_i W_ij, (B, 1152, 10, 16)
            mu, a, R = self.routing(votes, a_in.float())  # (B, 10, 16), (B, 10), (B, 1152, 10)
        return Digits(mu, a, R, votes)


class Decoder(nn.Module):
    """Reconstruction network of Fig. 2: FC 160 -> 512 -> 1024 -> H*W with ReLU, ReLU, sigmoid.

    Its input is the digit capsules with all but the chosen ones zeroed (section 4.1).
    """

    def __init__(self, num_caps: int = 10, caps_dim: int = 16, image_size: int = 28):
        super().__init__()
        self.image_size = image_size
        self.net = nn.Sequential(
            nn.Linear(num_caps * caps_dim, 512),
            nn.ReLU(inplace=True),
            nn.Linear(512, 1024),
            nn.ReLU(inplace=True),
            nn.Linear(1024, image_size * image_size),
            nn.Sigmoid(),
        )

    def forward(self, masked_capsules: torch.Tensor) -> torch.Tensor:
        x = self.net(masked_capsules.flatten(1))  # (B, H*W)
        return x.view(-1, self.image_size, self.image_size)


def one_hot(classes: torch.Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(...) class indices -> (..., num_classes) one-hot. A comparison rather than F.one_hot, which
    reads the indices' min and max back to the host to check them: no host sync inside a step."""
    return (classes.unsqueeze(-1) == torch.arange(num_classes, device=classes.device)).to(dtype)


def mask_capsules(capsules: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """Zero every digit capsule except `classes` (B,) -> (B, 10, 16), the decoder's input."""
    keep = one_hot(classes, capsules.shape[1], capsules.dtype)  # (B, 10)
    return capsules * keep.unsqueeze(-1)


def margin_loss(
    lengths: torch.Tensor,
    targets: torch.Tensor,
    m_plus: float = contract.M_PLUS,
    m_minus: float = contract.M_MINUS,
    lam: float = contract.LAMBDA_ABSENT,
) -> torch.Tensor:
    """Eq. 4, L_k = T_k max(0, m+ - ||v_k||)^2 + lam (1 - T_k) max(0, ||v_k|| - m-)^2,
    summed over the classes k and averaged over the batch.

    Args:
        lengths: ||v_k||, (B, K).
        targets: class indices (B,) or a multi-hot (B, K) for images with several digits.
    """
    T = (targets if targets.dim() == 2 else one_hot(targets, lengths.shape[1])).to(lengths.dtype)
    present = T * F.relu(m_plus - lengths) ** 2
    absent = lam * (1.0 - T) * F.relu(lengths - m_minus) ** 2
    return (present + absent).sum(dim=1).mean()


def spread_loss(activations: torch.Tensor, targets: torch.Tensor, margin: float | torch.Tensor) -> torch.Tensor:
    """Matrix capsules' Eq. 3 (Hinton, Sabour & Frosst 2018, section 4.1): L_i = max(0, m - (a_t - a_i))^2,
    L = sum over the classes i != t, averaged over the batch. Each wrong class must stay m below the
    target's activation; m grows during training (SPREAD_MARGINS), so no class starts dead.

    Args:
        activations: a_i, (B, K).
        targets: class indices t, (B,): one class per image.
        margin: m, a float or a 0-d tensor (a tensor the training loop moves without recompiling).
    """
    if targets.dim() != 1:
        raise ValueError(f"the spread loss takes one class per image, got targets of shape {tuple(targets.shape)}")
    a_t = activations.gather(1, targets.unsqueeze(1))  # (B, 1)
    gap = F.relu(margin - (a_t - activations)) ** 2  # (B, K); the target's own term is m^2
    wrong = 1.0 - one_hot(targets, activations.shape[1], activations.dtype)
    return (gap * wrong).sum(dim=1).mean()


def reconstruction_loss(reconstruction: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Sum of squared pixel errors per image (section 4.1; not the mean), averaged over the batch."""
    return ((reconstruction - images.view_as(reconstruction)) ** 2).flatten(1).sum(dim=1).mean()


@dataclass
class CapsNetConfig:
    image_size: int = contract.IMAGE_SIZE  # 28 for MNIST; 36 for MultiMNIST, 40 for affine tests
    conv_chans: int = 256
    primary_types: int = contract.PRIMARY_TYPES
    primary_dim: int = contract.PRIMARY_DIM
    num_classes: int = contract.NUM_CLASSES
    caps_dim: int = contract.CAPSULE_DIM
    routing: str = "dynamic"  # one of routing.ROUTINGS: dynamic, em, qp-l2, qp-l1
    routing_iters: int = 3  # r in Procedure 1, and the number of M-steps of EM routing (qp has none)
    qp_lambda: float = 1e-3  # lambda of the qp penalty, Eqs. 10 and 14 ("usually set small, e.g. 0.001")
    em_inv_temp: float = 1e-3  # lambda of Eq. 27, the inverse temperature of EM's activations, every iteration
    loss: str | None = None  # margin (Eq. 4) or spread (matrix capsules' Eq. 3); unset: spread for em, else margin
    reconstruction: bool = True  # the decoder and its loss (Table 1's ablation)
    recon_weight: float = 0.0005  # scales the sum-squared reconstruction error (section 4.1)

    def __post_init__(self):
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        if self.routing == "em" and self.caps_dim != 16:
            raise ValueError(f"em routing has 4x4 pose matrices: caps_dim must be 16, got {self.caps_dim}")
        if self.loss is None:
            self.loss = "spread" if self.routing == "em" else "margin"
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")

    @property
    def primary_grid(self) -> int:
        return contract.primary_grid(self.image_size)

    @property
    def num_primary(self) -> int:
        return self.primary_types * self.primary_grid**2


class CapsNetOutput(NamedTuple):
    lengths: torch.Tensor  # (B, 10) ||v_j|| (em: the activations a_j)
    capsules: torch.Tensor  # (B, 10, 16) v_j (em: the flattened 4x4 poses mu_j)
    routing: torch.Tensor  # (B, 1152, 10) c_ij of the last iteration (em: R_ij; qp: b_ij)
    reconstruction: torch.Tensor | None  # (B, 28, 28), None without a decoder
    votes: torch.Tensor | None  # (B, 1152, 10, 16) u_hat_j|i (em: flattened V_ij); None when training dynamic
    iterations: RoutingIterations | None  # dynamic routing outside training: every iteration (Digits)


def create_routing(config: CapsNetConfig) -> nn.Module:
    """The routing module that config.routing names (model/routing.py)."""
    if config.routing == "dynamic":
        return DynamicRouting(config.routing_iters)
    if config.routing == "em":
        return EMRouting(config.num_classes, config.routing_iters, config.em_inv_temp)
    penalty = config.routing.removeprefix("qp-")  # "l2" or "l1"
    return QPRouting(config.num_primary, config.num_classes, penalty, config.qp_lambda)


class CapsNet(nn.Module):
    """Conv1 -> PrimaryCaps -> DigitCaps (+ Decoder), section 4 and Fig. 1-2; matrix capsules for em."""

    def __init__(self, config: CapsNetConfig):
        super().__init__()
        self.config = config
        self.conv1 = nn.Conv2d(1, config.conv_chans, kernel_size=9, stride=1)
        routing = create_routing(config)
        self.primary: PrimaryCaps | PrimaryMatrixCaps
        self.digits: DigitCaps | MatrixDigitCaps
        if config.routing == "em":
            self.primary = PrimaryMatrixCaps(
                config.conv_chans, config.primary_types, config.primary_types * config.primary_dim
            )
            self.digits = MatrixDigitCaps(config.num_primary, config.num_classes, routing=routing)
        else:
            self.primary = PrimaryCaps(config.conv_chans, config.primary_types, config.primary_dim)
            self.digits = DigitCaps(
                config.num_primary, config.primary_dim, config.num_classes, config.caps_dim, routing
            )
        self.decoder = (
            Decoder(config.num_classes, config.caps_dim, config.image_size) if config.reconstruction else None
        )

    def forward_features(self, x: torch.Tensor) -> Digits:
        """Images (B, 1, H, W) in [0, 1] -> digit capsules (B, 10, 16), their lengths or activations
        (B, 10), the routing coefficients (B, 1152, 10), the votes (B, 1152, 10, 16) and, for dynamic
        routing outside training, every routing iteration."""
        x = F.relu(self.conv1(x))  # (B, 256, 20, 20)
        u = self.primary(x)  # (B, 1152, 8); em: poses (B, 1152, 16) and activations (B, 1152)
        return self.digits(u)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> CapsNetOutput:
        """One forward for training and inference.

        The decoder draws the capsule of `targets` when given (the true label, in training: section 4.1's
        mask) and the longest capsule otherwise (inference, as Fig. 3 redraws the predicted digit).
        """
        capsules, lengths, routing, votes, iterations = self.forward_features(x)  # lengths (B, 10)
        reconstruction = None
        if self.decoder is not None:
            chosen = targets if targets is not None else lengths.argmax(dim=1)
            reconstruction = self.decoder(mask_capsules(capsules, chosen))
        return CapsNetOutput(lengths, capsules, routing, reconstruction, votes, iterations)

    def loss(
        self,
        out: CapsNetOutput,
        images: torch.Tensor,
        targets: torch.Tensor,
        spread_margin: float | torch.Tensor = SPREAD_MARGINS[1],
    ) -> torch.Tensor:
        """Margin loss (Eq. 4), or the spread loss at margin spread_margin (config.loss), + recon_weight *
        sum-squared reconstruction error (section 4.1)."""
        if self.config.loss == "spread":
            loss = spread_loss(out.lengths, targets, spread_margin)
        else:
            loss = margin_loss(out.lengths, targets)
        if out.reconstruction is not None:
            loss = loss + self.config.recon_weight * reconstruction_loss(out.reconstruction, images)
        return loss

    def num_params(self, decoder: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if not decoder and self.decoder is not None:
            n -= sum(p.numel() for p in self.decoder.parameters())
        return n
