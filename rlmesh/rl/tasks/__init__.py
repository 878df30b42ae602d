"""LLM tasks: what the prompts are and how answers are checked. Verifiable synthetic tasks for
CPU-sized models (addition), prompt data sets from files (:class:`DatasetTask`), the character
tokenizer of the built-in transformer, and the rule-based verifiers that ``RewardActor`` ships."""

from rlmesh.rl.tasks.addition import AdditionTask
from rlmesh.rl.tasks.base import Problem, Split, TextTask
from rlmesh.rl.tasks.dataset import DatasetTask
from rlmesh.rl.tasks.tokenizer import CharTokenizer, Tokenizer
from rlmesh.rl.tasks.verifiers import digit_match, exact_match, extract_number, final_answer, math_match, numeric_match

__all__ = ["AdditionTask", "CharTokenizer", "DatasetTask", "Problem", "Split", "TextTask", "Tokenizer", "digit_match",
           "exact_match", "extract_number", "final_answer", "math_match", "numeric_match"]
