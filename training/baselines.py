"""The paper's two CNN baselines, as it describes them, for the comparisons its claims rest on.

- PaperCNN (section 5): "three convolutional layers of 256, 256, 128 channels. Each has 5x5 kernels
  and stride of 1. The last convolutional layers are followed by two fully connected layers of size
  328, 192. The last fully connected layer is connected with dropout to a 10 class softmax layer with
  cross entropy loss" (35.4M parameters at 28x28: the convolutions keep the size, no pooling). The
  paper's baseline for the affine test (section 5.2) is another: "a traditional convolutional network
  (with MaxPooling and DropOut)" "with a similar number of parameters", its layers not given;
  training.experiments.affine's BaselineCNN is our reading of it; the campaign's affine runs train this
  one beside the CapsNet and BaselineCNN (training/campaign/plan.py).
- PairCNN (section 6, MultiMNIST): "two convolution layers and two fully connected layers ... The
  first layer has 512 convolution kernels of size 9x9 and stride 1. The second layer has 256 kernels
  of size 5x5 and stride 1. After each convolution layer the model has a pooling layer of size 2x2 and
  stride 2. The third layer is a 1024D fully connected layer. All three layers have ReLU
  non-linearities. The final layer of 10 units is fully connected ... a sigmoid cross entropy loss".
  With "same" padding this is 24.56M parameters at 36x36, the paper's count.

Both return logits (B, 10); PairCNN's two largest are its two digits.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class PaperCNN(nn.Module):
    """Section 5's baseline: conv5x5(256)-conv5x5(256)-conv5x5(128), "same" padding, stride 1, ReLU ->
    FC 328 -> FC 192 -> dropout -> 10 logits (softmax cross entropy).

    Weights are Glorot-uniform and biases zero, TensorFlow's defaults (the paper's implementation). With
    PyTorch's defaults the three convolutions shrink the signal, the first FC layer (128 x 40 x 40 inputs
    on section 5.2's canvas) sees little but its biases, and Adam's first steps leave most of its units
    dead: the network stays at chance (2.30 loss) at any learning rate from 1e-5 to 1e-3.
    """

    def __init__(self, image_size: int = 28, num_classes: int = 10, dropout: float = 0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 256, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 128, 5, padding=2),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(128 * image_size * image_size, 328),
            nn.ReLU(inplace=True),
            nn.Linear(328, 192),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(192, num_classes),
        )
        for layer in self.modules():
            if isinstance(layer, nn.Conv2d | nn.Linear) and layer.bias is not None:
                nn.init.xavier_uniform_(layer.weight)
                nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class PairCNN(nn.Module):
    """Section 6's baseline: conv9x9(512)-pool-conv5x5(256)-pool, "same" padding -> FC 1024 -> 10 logits,
    trained with sigmoid cross entropy on the two digits present (pair_loss)."""

    def __init__(self, image_size: int = 36, num_classes: int = 10):
        super().__init__()
        side = image_size // 4
        self.features = nn.Sequential(
            nn.Conv2d(1, 512, 9, padding=4),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(512, 256, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(256 * side * side, 1024),
            nn.ReLU(inplace=True),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    @staticmethod
    def pair_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Sigmoid cross entropy against the two classes present (labels (B, 2)), summed over classes."""
        target = torch.zeros_like(logits).scatter_(1, labels, 1.0)
        return F.binary_cross_entropy_with_logits(logits, target, reduction="none").sum(1).mean()


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
