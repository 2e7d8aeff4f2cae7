"""summary_type "mean": the average of the real tokens' last hidden states. Without padding it equals transformers'
XLNet ("mean" there averages every position); with left padding the pads are left out, so a padded example pools
exactly as the same example alone."""

import pytest
import torch
from model_helpers import randomise, run_both, twins

from xlnet_lite import XLNetLiteForMultipleChoice


def test_mean_pooling_equals_transformers_without_padding(impl):
    hf, lite = twins("XLNetForSequenceClassification", num_labels=3, summary_type="mean")
    input_ids = torch.randint(0, 97, (4, 10), generator=torch.Generator().manual_seed(0))
    a, b = run_both(hf, lite, impl, input_ids=input_ids, labels=torch.tensor([0, 1, 2, 1]))
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mask_kind", ["attention_mask", "input_mask"])
@pytest.mark.parametrize("seed", range(4))
def test_mean_pooling_leaves_left_padding_out(mask_kind, seed):
    _, lite = twins("XLNetForSequenceClassification", num_labels=3, summary_type="mean", seed=seed)
    lite = lite.eval()
    g = torch.Generator().manual_seed(seed)
    alone = torch.randint(5, 97, (1, 7), generator=g)
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), alone], dim=1)  # (1, 12), 5 pads on the left
    real = torch.cat([torch.zeros(1, 5), torch.ones(1, 7)], dim=1)
    mask = {"attention_mask": real} if mask_kind == "attention_mask" else {"input_mask": 1 - real}
    with torch.no_grad():
        expected = lite(alone).logits
        got = lite(padded, **mask).logits
        unmasked = lite(padded).logits  # the pads' hidden states would move an average over all positions
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unmasked, expected, atol=1e-3)


def test_mean_pooling_in_multiple_choice_leaves_padding_out():
    _, lite = twins("XLNetForSequenceClassification", num_labels=3, summary_type="mean")
    choice = XLNetLiteForMultipleChoice(lite.config)
    randomise(choice, seed=3)
    choice.eval()
    alone = torch.randint(5, 97, (1, 2, 6), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([torch.zeros(1, 2, 4, dtype=torch.long), alone], dim=2)
    mask = torch.cat([torch.zeros(1, 2, 4), torch.ones(1, 2, 6)], dim=2)
    with torch.no_grad():
        torch.testing.assert_close(
            choice(padded, attention_mask=mask).logits, choice(alone).logits, atol=1e-5, rtol=1e-5
        )
