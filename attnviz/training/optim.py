"""The optimiser of section 5.3: Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9, and the
learning-rate schedule of equation 3, lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

Apart from the training loop (`attnviz.training.loop`) so that the teaching pages can draw the schedule without it.
"""

from __future__ import annotations

import torch

ADAM_BETAS = (0.9, 0.98)
ADAM_EPS = 1e-9


def learning_rate(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Equation 3 of the paper, with steps counted from 1; ``scale`` multiplies it (1.0: the paper's)."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def paper_optimizer(
    params, d_model: int, warmup: int, scale: float = 1.0
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam with the paper's settings and a scheduler that sets equation 3's rate at every step."""
    optimizer = torch.optim.Adam(params, lr=1.0, betas=ADAM_BETAS, eps=ADAM_EPS)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: learning_rate(i + 1, d_model, warmup, scale))
    return optimizer, schedule
