import pytest
from helpers import REPO

from easyr1.reward import load_reward_function


DAPO = f"{REPO / 'reward_function' / 'dapo.py'}:compute_score"


def score(response: str, length: int, truth: str = "4") -> dict:
    reward = load_reward_function(
        DAPO, {"max_response_length": 100, "overlong_buffer_length": 20, "overlong_penalty_factor": 0.5}, None
    )
    return reward([{"response": response, "response_length": length, "ground_truth": truth}])[0]


@pytest.mark.parametrize(
    ("length", "penalty"),
    [(10, 0.0), (80, 0.0), (81, -0.025), (90, -0.25), (100, -0.5), (130, -0.5)],
)
def test_overlong_penalty_grows_linearly_over_the_buffer(length, penalty):
    result = score("so \\boxed{4}", length)
    assert result["accuracy"] == 1.0
    assert result["overlong"] == pytest.approx(penalty)
    assert result["overall"] == pytest.approx(1.0 + penalty)


def test_wrong_answer_is_minus_one():
    result = score("\\boxed{5}", 10)
    assert result["overall"] == -1.0 and result["accuracy"] == 0.0
