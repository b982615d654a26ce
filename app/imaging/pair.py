"""Two overlapping digits in a picture -> the model's input (MultiMNIST, section 6 of the paper; the
card's `digit-pair`): found and normalised as one digit is (app/imaging/digit.py), their union fitted
into the training pairs' median ink box and four boxes around it (candidates, of which the model reads
the one it redraws best)."""

from app.imaging.decode import Picture, size_of
from app.imaging.digit import digits
from app.imaging.prepared import Prepared

PAIR = "two overlapping digits"
PAIR_STEPS = (0, -4, -2, 2, 4)  # px added to the median union's ink box: the scales a drawn pair is read at


def prepare(image: Picture, size: int, box: int) -> Prepared:
    """The pair's union fitted into ink boxes around `box` (candidates), or taken at its scale when the
    picture is already the model's size x size."""
    # Two digits' union has no one size (each digit is 20 px, their shifts differ by up to 8): a picture
    # at the model's size is taken at its scale (fitting the union to the median box reads fewer of the
    # card's test pairs right); a drawing or photo is fitted to unions from 4 px under the median to 4
    # over, and the scale the model's answer redraws best is kept (app/answer.py: read).
    if size_of(image) == (size, size):
        return digits(image, None, size, PAIR)
    return digits(image, tuple(box + step for step in PAIR_STEPS), size, PAIR)
