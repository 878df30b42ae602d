"""Verifiable synthetic tasks for LLM RL on CPU: data generators, a character
tokenizer and the rule-based verifiers that ``RewardActor`` ships."""

from rlmesh.rl.tasks.addition import AdditionTask, Problem
from rlmesh.rl.tasks.tokenizer import CharTokenizer
from rlmesh.rl.tasks.verifiers import digit_match, exact_match, extract_number, numeric_match

__all__ = ["AdditionTask", "CharTokenizer", "Problem", "digit_match", "exact_match", "extract_number", "numeric_match"]
