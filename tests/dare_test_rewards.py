"""A reward for launched test runs (``--rewards dare_test_rewards.length`` with this folder on PYTHONPATH): it varies
across random completions, so a random tiny model gets non-zero advantages and gradients."""


def length(completion: str, ground_truth: str, extra_info: dict | None = None) -> float:
    return (len(completion) % 7) / 6
