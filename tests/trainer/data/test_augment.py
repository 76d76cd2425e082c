"""Crop-and-flip augmentation: a random window of the zero-padded image, flipped or not, reproducible."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer.checks import checked_config
from trainer.data.augment import augment_batch, augment_generator


def test_every_image_is_a_window_of_its_padded_self_possibly_flipped():
    x = torch.randn(16, 3, 8, 8)
    out = augment_batch(x, "crop_flip", augment_generator(0, 0, 5))
    assert out.shape == x.shape
    padded = F.pad(x, (4, 4, 4, 4))
    flipped = 0
    for b in range(16):
        windows = [
            (dy, dx, f)
            for dy in range(9)
            for dx in range(9)
            for f in (False, True)
            if torch.equal(out[b], (lambda w: w.flip(-1) if f else w)(padded[b, :, dy : dy + 8, dx : dx + 8]))
        ]
        assert windows, f"image {b} is not a crop of its padded original"
        flipped += windows[0][2]
    assert 0 < flipped < 16  # both branches drawn


def test_same_seed_rank_step_same_augmentation_and_none_is_identity():
    x = torch.randn(8, 3, 32, 32)
    a = augment_batch(x, "crop_flip", augment_generator(1, 2, 3))
    assert torch.equal(a, augment_batch(x, "crop_flip", augment_generator(1, 2, 3)))
    assert not torch.equal(a, augment_batch(x, "crop_flip", augment_generator(1, 3, 3)))
    assert not torch.equal(a, augment_batch(x, "crop_flip", augment_generator(1, 2, 4)))
    assert augment_batch(x, "none", augment_generator(0, 0, 0)) is x


def test_bad_augmentation_rejected():
    with pytest.raises(ValueError, match="unknown augment .mixup.; valid: none, crop_flip, flip_translate"):
        checked_config({"augment": "mixup"})
    with pytest.raises(ValueError, match="needs image batches"):
        augment_batch(torch.zeros(4, 64, dtype=torch.long), "crop_flip", augment_generator(0, 0, 0))


def test_flip_translate_is_a_two_pixel_window_of_the_reflect_padded_image():
    x = torch.randn(16, 3, 8, 8)
    out = augment_batch(x, "flip_translate", augment_generator(0, 0, 7))
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    shifts = set()
    for b in range(16):
        windows = [
            (dy, dx, f)
            for dy in range(5)
            for dx in range(5)
            for f in (False, True)
            if torch.equal(out[b], (lambda w: w.flip(-1) if f else w)(padded[b, :, dy : dy + 8, dx : dx + 8]))
        ]
        assert windows, f"image {b} is not a 2-pixel translate of its reflect-padded original"
        shifts.add(windows[0][:2])
    assert len(shifts) > 3  # the offsets are drawn, not fixed
    # reflect padding: no constant border, unlike crop_flip's zeros
    assert torch.equal(out, augment_batch(x, "flip_translate", augment_generator(0, 0, 7)))
