"""What every engine returns."""

from dataclasses import dataclass, field

import torch


@dataclass
class Rollout:
    """Prompt-major: row ``i * n + k`` is sample k of prompt i. ``completion_mask`` covers the generated tokens up to
    and including the first stop token; ``step_map``/``block_step`` record when each token was fixed (-1: not
    generated). ``texts`` are the completions decoded up to (not including) the first stop token."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor  # [N, R]
    completion_mask: torch.Tensor
    step_map: torch.Tensor
    block_step: torch.Tensor
    texts: list[str]
    nfe: int = 0  # model forward calls, summed over micro-batches
    seconds: float = 0.0
    states: list[torch.Tensor] = field(default_factory=list)  # with record_states: the canvas after each step
    predictions: list[torch.Tensor] = field(default_factory=list)  # each step's whole-canvas prediction
    confidences: list[torch.Tensor] = field(default_factory=list)  # probability of each predicted token
    replay_ids: torch.Tensor | None = None  # block families [N, R + block - 1]: decoded tokens, last and stop blocks whole
    replay_step: torch.Tensor | None = None  # their block-local steps (-1: not decoded)
    records: dict = field(default_factory=dict)  # algorithm-specific rollout records (e.g. a tree's inner nodes)

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0
