"""Addition task, tokenizer round trips and the verifiers RewardActor ships."""

import random

import pytest

from rlmesh.rl.tasks import AdditionTask, CharTokenizer, digit_match, exact_match, extract_number, numeric_match


def test_tokenizer_round_trip_and_specials():
    tok = CharTokenizer("0123456789+=")
    ids = tok.encode("12+3=", bos=True, eos=True)
    assert ids[0] == tok.BOS and ids[-1] == tok.eos_id and tok.vocab_size == 15
    assert tok.decode(ids) == "12+3="
    assert tok.decode(tok.encode("42", eos=True) + tok.encode("99")) == "42"  # stops at EOS
    with pytest.raises(ValueError, match="'x' is not in the alphabet"):
        tok.encode("1x")


def test_addition_problems_are_correct_and_splits_disjoint():
    task = AdditionTask(min_digits=1, max_digits=3)
    train = task.sample(500, random.Random(0), "train")
    held = task.sample(200, random.Random(0), "heldout")
    for p in train + held:
        a, b = p.prompt[:-1].split("+")
        assert int(a) + int(b) == int(p.answer) and p.prompt.endswith("=")
        assert len(a) <= 3 and len(b) <= 3
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert task.score(train[0].answer, train[0]) == 1.0
    assert task.score(train[0].answer + "1", train[0]) == 0.0
    assert len(task.encode_prompt(train[0])) <= task.max_prompt_len


def test_reversed_answers_are_the_sum_backwards():
    task = AdditionTask(2, 3, reverse_answer=True)
    for p in task.sample(50, random.Random(4)):
        a, b = p.prompt[:-1].split("+")
        assert p.answer == str(int(a) + int(b))[::-1]


def test_exact_match():
    assert exact_match(" 168 ", "168") == 1.0
    assert exact_match("168", "1680") == 0.0
    assert exact_match(" 168", "168", strip=False) == 0.0


@pytest.mark.parametrize(
    "text,expected",
    [("the answer is 42", 42.0), ("3 + 4 = 7", 7.0), ("-12.5 degrees", -12.5), ("1,234 apples", 1234.0),
     ("so \\boxed{17} since 20", 17.0), ("no digits here", None)],
)
def test_extract_number(text, expected):
    assert extract_number(text) == expected


def test_numeric_match_with_format_credit():
    assert numeric_match("x = 0.30000000000000004", 0.3) == 1.0
    assert numeric_match("I think 41", "42", format_reward=0.1) == 0.1
    assert numeric_match("no idea", "42", format_reward=0.1) == 0.0


def test_digit_match_partial_credit():
    assert digit_match("168", "168") == 1.0
    assert digit_match("169", "168") == pytest.approx(2 / 3)
    assert digit_match("16", "168") == pytest.approx(2 / 3)  # a missing digit costs
    assert digit_match("1680", "168") == pytest.approx(3 / 4)  # so does an extra one
    assert digit_match("", "168") == 0.0
    problem = AdditionTask().sample(1, random.Random(0))[0]
    assert AdditionTask().score(problem.answer, problem, partial=True) == 1.0
